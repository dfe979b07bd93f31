//! [`Sink`]: where a sync's changes go. It writes them into transactions, sends each when
//! it is large enough and the caller says a boundary is safe (between whole Service
//! ports, so none is ever half-programmed), keeps the text of what it sent for the
//! report (`nft`'s syntax), and counts. In a dry run, or when only checking, it sends
//! nothing.

use std::fmt::Write as _;

use super::layout::{ChainDef, SetDef, addr_len};
use super::names;
use super::rules::RuleText;
use crate::dataplane::DataplaneError;
use crate::kernel::Family;
use crate::kernel::nftables::objects::{
    comment_userdata, delete_chain, delete_set, delete_table, flush_chain, flush_set,
};
use crate::kernel::nftables::socket::ERESTART;
use crate::kernel::nftables::uapi::{NFPROTO_IPV4, NFPROTO_IPV6};
use crate::kernel::nftables::{Chain, Data, NftKernel, Rule as KernelRule, Table, Transaction};

/// Bytes after which a transaction is sent at the next boundary: large syncs (a first
/// sync of 10,000 Services is about 10 MB) go in several transactions, so the agent
/// never holds them whole. A transaction's buffer and the copy sent of it are the first
/// sync's largest allocations: at 1 MiB they cost the running agent 2 MiB of memory it
/// kept afterwards.
pub const TRANSACTION_BYTES: usize = 256 << 10;

/// How many times a transaction refused with `ERESTART` (someone else committed between
/// reading the generation and sending) is sent again.
const RESTARTS: usize = 5;

/// The `NFPROTO_*` of a family.
#[must_use]
pub fn nfproto(family: Family) -> u8 {
    match family {
        Family::V4 => NFPROTO_IPV4,
        Family::V6 => NFPROTO_IPV6,
    }
}

/// The nft keyword of a family's tables.
#[must_use]
pub fn family_word(family: Family) -> &'static str {
    match family {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    }
}

/// Where changes go.
pub struct Sink<'k> {
    kernel: Option<&'k mut dyn NftKernel>,
    family: Family,
    tx: Transaction,
    /// The generation the next transaction is built against (real syncs).
    generation: Option<u32>,
    text: String,
    text_limit: usize,
    text_cut: usize,
    /// Changes written (objects and elements).
    pub changed: usize,
    /// Transactions sent.
    pub transactions: usize,
    /// Messages sent.
    pub messages: usize,
    set_ids: u32,
}

/// Why a sink could not send.
#[derive(Debug)]
pub enum SinkError {
    /// The kernel refused a transaction (what it refused, in words): the agent's model
    /// of the kernel is wrong; read the kernel again.
    Refused(String),
    /// The kernel could not be asked.
    Kernel(DataplaneError),
}

impl From<DataplaneError> for SinkError {
    fn from(e: DataplaneError) -> Self {
        Self::Kernel(e)
    }
}

impl SinkError {
    /// As a dataplane error.
    #[must_use]
    pub fn into_dataplane(self) -> DataplaneError {
        match self {
            Self::Kernel(e) => e,
            Self::Refused(what) => DataplaneError::Io {
                context: "nf_tables refused the transaction".to_owned(),
                source: std::io::Error::other(what),
            },
        }
    }
}

impl<'k> Sink<'k> {
    /// A sink sending to `kernel` (none: a dry run or a check), keeping up to
    /// `text_limit` bytes of text.
    ///
    /// # Errors
    /// When the generation cannot be read.
    pub fn new(
        kernel: Option<&'k mut dyn NftKernel>,
        family: Family,
        text_limit: usize,
    ) -> Result<Self, DataplaneError> {
        let mut sink = Self {
            kernel,
            family,
            tx: Transaction::new(None),
            generation: None,
            text: String::new(),
            text_limit,
            text_cut: 0,
            changed: 0,
            transactions: 0,
            messages: 0,
            set_ids: 0,
        };
        if let Some(kernel) = sink.kernel.as_deref_mut() {
            let generation = kernel.generation()?;
            sink.generation = Some(generation);
            sink.tx = Transaction::new(Some(generation));
        }
        Ok(sink)
    }

    /// The generation the kernel is at after the last transaction this sink sent.
    #[must_use]
    pub fn generation(&self) -> Option<u32> {
        self.generation
    }

    /// The text of what was written.
    #[must_use]
    pub fn text(&self) -> String {
        let mut text = self.text.clone();
        if self.text_cut > 0 {
            let _ = writeln!(
                text,
                "# ... {} more bytes of changes not kept in this report",
                self.text_cut
            );
        }
        text
    }

    fn line(&mut self, line: std::fmt::Arguments<'_>) {
        let before = self.text.len();
        if self.text_cut == 0 {
            let _ = self.text.write_fmt(line);
            self.text.push('\n');
            if self.text.len() <= self.text_limit {
                return;
            }
            self.text_cut = self.text.len() - before;
            self.text.truncate(before);
        } else {
            self.text_cut += 64;
        }
    }

    /// `ip proxyplan` or `ip6 proxyplan`, for the text (no allocation per line: a first
    /// sync writes 300,000 of them, nearly all past the text kept).
    fn table(&self) -> &'static str {
        match self.family {
            Family::V4 => "ip proxyplan",
            Family::V6 => "ip6 proxyplan",
        }
    }

    /// `add table`.
    pub fn add_table(&mut self) {
        let t = self.table();
        self.line(format_args!("add table {t}"));
        self.tx.push(
            &Table {
                family: nfproto(self.family),
                name: names::TABLE.to_owned(),
                flags: 0,
                userdata: Some(comment_userdata("rules for proxyplan")),
            }
            .new_message(),
        );
        self.changed += 1;
    }

    /// `delete table` (with everything in it).
    pub fn delete_table(&mut self) {
        let t = self.table();
        self.line(format_args!("delete table {t}"));
        self.tx
            .push(&delete_table(nfproto(self.family), names::TABLE));
        self.changed += 1;
    }

    /// `add set` / `add map`.
    pub fn add_set(&mut self, set: &SetDef) {
        let t = self.table();
        self.line(format_args!(
            "add map {t} {} {{ {:?} }}",
            set.name, set.kind
        ));
        // The kernel wants an id for every new set (rules of the same batch may name it
        // by id).
        self.set_ids += 1;
        let mut kernel = set.kernel(self.family);
        kernel.set_id = Some(self.set_ids);
        self.tx.push(&kernel.new_message());
        self.changed += 1;
    }

    /// `delete set`.
    pub fn delete_set(&mut self, name: &str) {
        let t = self.table();
        self.line(format_args!("delete set {t} {name}"));
        self.tx
            .push(&delete_set(nfproto(self.family), names::TABLE, name));
        self.changed += 1;
    }

    /// `add chain` (without its rules).
    pub fn add_chain(&mut self, chain: &ChainDef) {
        let t = self.table();
        match &chain.hook {
            Some(h) => self.line(format_args!(
                "add chain {t} {} {{ type {} hook {} priority {}; }}",
                chain.name,
                h.chain_type,
                hook_name(h.hooknum),
                h.priority
            )),
            None => self.line(format_args!("add chain {t} {}", chain.name)),
        }
        self.tx.push(
            &Chain {
                family: nfproto(self.family),
                table: names::TABLE.to_owned(),
                name: chain.name.clone(),
                hook: chain.hook.clone(),
                policy: None,
                userdata: None,
                handle: None,
            }
            .new_message(),
        );
        self.changed += 1;
    }

    /// `flush chain`.
    pub fn flush_chain(&mut self, name: &str) {
        let t = self.table();
        self.line(format_args!("flush chain {t} {name}"));
        self.tx
            .push(&flush_chain(nfproto(self.family), names::TABLE, name));
        self.changed += 1;
    }

    /// `flush set` / `flush map`: every element.
    pub fn flush_set(&mut self, name: &str) {
        let t = self.table();
        self.line(format_args!("flush set {t} {name}"));
        self.tx
            .push(&flush_set(nfproto(self.family), names::TABLE, name));
        self.changed += 1;
    }

    /// `delete chain`.
    pub fn delete_chain(&mut self, name: &str) {
        let t = self.table();
        self.line(format_args!("delete chain {t} {name}"));
        self.tx
            .push(&delete_chain(nfproto(self.family), names::TABLE, name));
        self.changed += 1;
    }

    /// `add rule` at the end of `chain`.
    pub fn add_rule(&mut self, chain: &str, rule: &super::rules::Rule) {
        let t = self.table();
        let family = self.family;
        self.line(format_args!(
            "add rule {t} {chain} {}",
            RuleText(rule, family)
        ));
        self.tx
            .push(&kernel_rule(family, chain, rule).new_message());
        self.changed += 1;
    }

    /// Adds an element (a map's with its data).
    pub fn add_element(&mut self, set: &str, key: &[u8], data: Option<&Data>) {
        if self.text_cut == 0 {
            let t = self.table();
            let text = element_text(self.family, set, key, data);
            self.line(format_args!("add element {t} {set} {{ {text} }}"));
        } else {
            self.text_cut += 64;
        }
        self.tx
            .element(true, nfproto(self.family), names::TABLE, set, key, data);
        self.changed += 1;
    }

    /// Deletes an element.
    pub fn delete_element(&mut self, set: &str, key: &[u8]) {
        if self.text_cut == 0 {
            let t = self.table();
            let text = element_text(self.family, set, key, None);
            self.line(format_args!("delete element {t} {set} {{ {text} }}"));
        } else {
            self.text_cut += 64;
        }
        self.tx
            .element(false, nfproto(self.family), names::TABLE, set, key, None);
        self.changed += 1;
    }

    /// A point where the transaction may be sent: sends it when it is large.
    ///
    /// # Errors
    /// When it cannot be sent or is refused.
    pub fn boundary(&mut self) -> Result<(), SinkError> {
        if self.tx.len() >= TRANSACTION_BYTES {
            self.commit()?;
        }
        Ok(())
    }

    /// Sends what was written so far, if anything.
    ///
    /// # Errors
    /// When it cannot be sent or is refused.
    pub fn commit(&mut self) -> Result<(), SinkError> {
        if self.tx.is_empty() {
            return Ok(());
        }
        self.messages += self.tx.messages();
        let Some(kernel) = self.kernel.as_deref_mut() else {
            self.transactions += 1;
            self.tx = Transaction::new(None);
            return Ok(());
        };
        for attempt in 0..=RESTARTS {
            if attempt > 0 {
                // Someone else committed between reading the generation and sending:
                // the transaction holds nothing of theirs, send it again.
                let generation = kernel.generation()?;
                self.generation = Some(generation);
                self.tx.set_generation(generation);
            }
            let refusals = kernel.commit(&mut self.tx)?;
            if refusals.is_empty() {
                self.transactions += 1;
                self.generation = self.generation.map(|g| g.wrapping_add(1));
                self.tx = Transaction::new(self.generation);
                return Ok(());
            }
            if !refusals.iter().all(|r| r.errno == ERESTART) {
                // The kernel aborted the transaction: the generation did not move for it,
                // and stays what the tamper check compares with (it was set to none here,
                // which made the check answer "intact" without asking until the next
                // commit: a refused deferred deletion turned tamper repair off).
                let first = refusals
                    .iter()
                    .map(ToString::to_string)
                    .take(3)
                    .collect::<Vec<_>>()
                    .join("; ");
                return Err(SinkError::Refused(format!(
                    "{} refusal(s), first: {first}",
                    refusals.len()
                )));
            }
        }
        self.generation = None;
        Err(SinkError::Refused(
            "the ruleset kept changing while the transaction was sent".to_owned(),
        ))
    }
}

fn hook_name(hook: u32) -> &'static str {
    match hook {
        0 => "prerouting",
        1 => "input",
        2 => "forward",
        3 => "output",
        4 => "postrouting",
        _ => "?",
    }
}

/// A rule as the kernel takes it.
#[must_use]
pub fn kernel_rule(family: Family, chain: &str, rule: &super::rules::Rule) -> KernelRule {
    KernelRule {
        family: nfproto(family),
        table: names::TABLE.to_owned(),
        chain: chain.to_owned(),
        exprs: rule.expressions(family),
        userdata: rule.comment.as_deref().map(comment_userdata),
        handle: None,
    }
}

/// An element as `nft` would spell it, read from its bytes by the set it is in.
#[must_use]
pub fn element_text(family: Family, set: &str, key: &[u8], data: Option<&Data>) -> String {
    let a = addr_len(family) as usize;
    let addr = |b: &[u8]| -> String {
        match b.len() {
            4 => std::net::IpAddr::from(<[u8; 4]>::try_from(b).unwrap_or_default()).to_string(),
            16 => std::net::IpAddr::from(<[u8; 16]>::try_from(b).unwrap_or_default()).to_string(),
            _ => format!("{b:02x?}"),
        }
    };
    let port = |b: &[u8]| -> String {
        b.get(..2)
            .map(|p| u16::from_be_bytes([p[0], p[1]]).to_string())
            .unwrap_or_default()
    };
    let proto = |b: &[u8]| super::rules::proto_name(b.first().copied().unwrap_or(0)).to_owned();
    let slot = |b: &[u8]| -> String {
        b.get(..4)
            .and_then(|s| <[u8; 4]>::try_from(s).ok())
            .map(|s| u32::from_ne_bytes(s).to_string())
            .unwrap_or_default()
    };
    let chunks = |sizes: &[usize]| -> Vec<&[u8]> {
        let mut out = Vec::new();
        let mut at = 0;
        for size in sizes {
            out.push(key.get(at..at + size).unwrap_or_default());
            at += size;
        }
        out
    };
    let key_text = if set == names::SERVICE_IPS
        || set == names::NO_ENDPOINT_SERVICES
        || set == names::FIREWALL_IPS
    {
        let c = chunks(&[a, 4, 4]);
        format!("{} . {} . {}", addr(c[0]), proto(c[1]), port(c[2]))
    } else if set == names::SERVICE_NODEPORTS || set == names::NO_ENDPOINT_NODEPORTS {
        let c = chunks(&[4, 4]);
        format!("{} . {}", proto(c[0]), port(c[1]))
    } else if set == names::CLUSTER_IPS || set.contains("affinity-") {
        addr(key)
    } else if set == names::HAIRPIN {
        let c = chunks(&[a, a, 4, 4]);
        format!(
            "{} . {} . {} . {}",
            addr(c[0]),
            addr(c[1]),
            proto(c[2]),
            port(c[3])
        )
    } else if set.starts_with("backends-") {
        let c = chunks(&[a, 4, 4]);
        format!("{} . {} . {}", addr(c[0]), port(c[1]), slot(c[2]))
    } else if set.starts_with("nodeport-backends-") {
        let c = chunks(&[4, 4]);
        format!("{} . {}", port(c[0]), slot(c[1]))
    } else {
        slot(key)
    };
    match data {
        None => key_text,
        Some(Data::Verdict(v)) => format!("{key_text} : {v}"),
        Some(Data::Value(v)) => {
            let ep = v.get(..a).map(addr).unwrap_or_default();
            let p = v.get(a..).map(port).unwrap_or_default();
            format!("{key_text} : {ep} . {p}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Sink, family_word, names};
    use crate::kernel::Family;

    /// The text names the table as `nft` does.
    #[test]
    fn the_text_names_the_family_and_table() {
        for family in Family::ALL {
            let Ok(sink) = Sink::new(None, family, 1024) else {
                panic!("a dry sink needs no kernel");
            };
            assert_eq!(
                sink.table(),
                format!("{} {}", family_word(family), names::TABLE)
            );
        }
    }
}
