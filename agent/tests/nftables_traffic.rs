//! What the nftables mode takes from its own flags, with real packets in network
//! namespaces on this host (the shared traffic suite, `traffic.rs`, runs in nftables
//! mode too with `PROXYPLAN_TEST_MODE=nftables`).
//!
//! Without root every test prints a SKIPPED line and passes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
mod traffic_support;

use std::time::Duration;

use proxyplan_agent::dataplane::Dataplane;
use proxyplan_agent::kernel::nftables::NetlinkNft;
use proxyplan_agent::kernel::{CommandRunner, Family};
use proxyplan_agent::modes::nftables::{NftablesDataplane, NftablesSettings};
use support::{node_port, service};
use traffic_support::{Lab, Listener, NODE_V4};

/// `--nodeport-addresses primary` (kube-proxy's keyword): node ports answer on the node's
/// primary IP (the plan's first address of the family) and not on its other addresses,
/// which answer by default.
#[test]
fn node_ports_on_primary_addresses_only() {
    let Some(lab) = Lab::new(&["a1"]) else {
        return;
    };
    lab.serve("a1", Family::V4, Listener::Tcp, 8080);
    let other = "198.51.100.7";
    lab.exec(
        "node",
        &["ip", "addr", "add", &format!("{other}/32"), "dev", "lo"],
    );
    let web = node_port(
        service("web", "10.96.0.10", 80, &["10.244.1.10:8080"]),
        30080,
    );
    let mut plan = support::plan(vec![web]);
    plan.addresses = vec![NODE_V4.parse().unwrap(), other.parse().unwrap()];
    let node = lab.ns("node");
    let reach = |ip: &str| {
        lab.client("node")
            .limit(Duration::from_millis(500))
            .tcp(ip, 30080)
    };
    for primary in [false, true] {
        let mut dp = NftablesDataplane::new(
            NftablesSettings {
                nodeport_primary: primary,
                ..NftablesSettings::default()
            },
            NetlinkNft::in_netns(&node).expect("netlink in the node"),
            CommandRunner::in_netns(&node),
        );
        dp.sync(&plan, false).expect("sync");
        assert_eq!(
            reach(NODE_V4).backend(),
            Some("a1/8080"),
            "primary: {primary}"
        );
        let secondary = reach(other);
        if primary {
            assert!(secondary.backend().is_none(), "{secondary:?}");
        } else {
            assert_eq!(
                secondary.backend(),
                Some("a1/8080"),
                "every address by default"
            );
        }
        dp.cleanup().expect("cleanup");
    }
}
