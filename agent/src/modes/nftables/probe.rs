//! Whether this kernel can run the nftables mode: a transaction holding one of each
//! object and expression the mode uses (concatenated maps, verdict maps, a dynamic map
//! with timeouts, numgen, DNAT from a map, masquerade, fib, ct, reject) is sent for
//! checking only, as `nft --check` does. The kernel runs and validates it, then aborts:
//! nothing is left behind, and a missing feature is named.

use super::layout::{
    ChainDef, SetDef, SetKind, fixed_chains, fixed_sets, shared_chain, shared_sets,
};
use super::names::{Balance, Masquerade, SharedChain};
use super::rules::{Action, Match, Rule};
use super::sink::{kernel_rule, nfproto};
use crate::kernel::Family;
use crate::kernel::nftables::{Chain, NftKernel, Table, Transaction};

/// The table the probe would create (never committed).
const PROBE_TABLE: &str = "proxyplan-probe";

/// `Ok` when nf_tables accepts everything the nftables mode writes, otherwise what
/// failed, in words.
///
/// # Errors
/// The reason, e.g. `nf_tables is not available: ...` or `the kernel refused add rule
/// ...: Operation not supported`.
pub fn probe(kernel: &mut dyn NftKernel) -> Result<(), String> {
    kernel
        .generation()
        .map_err(|e| format!("nf_tables is not available: {e}"))?;
    let family = Family::V4;
    let ctx = super::layout::FamilyContext {
        family,
        mark: 1 << 13,
        local: Some(super::layout::LocalTraffic::Prefix(super::rules::Net {
            addr: std::net::IpAddr::from([10, 244, 0, 0]),
            len: 16,
        })),
        nodeport_nets: Vec::new(),
        service_cidrs: Vec::new(),
        node_addresses: Vec::new(),
        drop_invalid: true,
    };
    let fam = nfproto(family);
    let mut tx = Transaction::new(None);
    tx.push(
        &Table {
            family: fam,
            name: PROBE_TABLE.to_owned(),
            flags: 0,
            userdata: None,
        }
        .new_message(),
    );
    let shared = SharedChain {
        balance: Balance::Address,
        masquerade: Masquerade::NotLocal,
        endpoints: 2,
    };
    let mut sets = fixed_sets();
    sets.extend(shared_sets(shared));
    sets.push(SetDef::new(
        "affinity",
        SetKind::Affinity {
            timeout_seconds: 10,
        },
    ));
    sets.push(SetDef::new("slots", SetKind::SlotVerdicts));
    sets.push(SetDef::new("endpoints", SetKind::BackendsBySlot(6)));
    for (id, set) in (1u32..).zip(&sets) {
        let mut set = set.kernel(family);
        set.table = PROBE_TABLE.to_owned();
        set.set_id = Some(id);
        tx.push(&set.new_message());
    }
    let mut chains = fixed_chains(&ctx);
    chains.push(shared_chain(shared, &ctx));
    let ep = std::net::IpAddr::from([10, 244, 1, 10]);
    chains.push(ChainDef {
        name: "special".to_owned(),
        hook: None,
        rules: vec![
            Rule::new(
                vec![Match::FibSaddrLocal, Match::L4Proto(6)],
                vec![Action::DnatBySlot {
                    map: "endpoints".to_owned(),
                    modulus: 2,
                }],
            ),
            Rule::new(
                vec![Match::SaddrIn("affinity".to_owned())],
                vec![
                    Action::AffinityRefresh("affinity".to_owned()),
                    Action::DnatByAffinity("affinity".to_owned()),
                ],
            ),
            Rule::new(
                vec![],
                vec![Action::AffinityRecord {
                    map: "affinity".to_owned(),
                    addr: ep,
                    port: 8080,
                }],
            ),
            Rule::new(
                vec![Match::L4Proto(6)],
                vec![Action::DnatTo {
                    addr: ep,
                    port: 8080,
                }],
            ),
            Rule::new(
                vec![],
                vec![Action::PickBySlot {
                    map: "slots".to_owned(),
                    modulus: 2,
                }],
            ),
        ],
    });
    for chain in &chains {
        tx.push(
            &Chain {
                family: fam,
                table: PROBE_TABLE.to_owned(),
                name: chain.name.clone(),
                hook: chain.hook.clone(),
                policy: None,
                userdata: None,
                handle: None,
            }
            .new_message(),
        );
    }
    for chain in &chains {
        for rule in &chain.rules {
            let mut rule = kernel_rule(family, &chain.name, rule);
            rule.table = PROBE_TABLE.to_owned();
            tx.push(&rule.new_message());
        }
    }
    let refusals = kernel
        .check(&mut tx)
        .map_err(|e| format!("nf_tables could not be asked: {e}"))?;
    match refusals.first() {
        None => Ok(()),
        Some(first) => Err(format!(
            "the kernel refused what nftables mode needs ({} refusal(s)), first: {first}",
            refusals.len()
        )),
    }
}
