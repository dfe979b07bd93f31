//! Links and addresses over rtnetlink against this host's kernel, in a throwaway network
//! namespace (its loopback interface: this kernel has no dummy interfaces; the VM's
//! `ipvs_kernel` tests create one): host addresses go on and off in batches, each with
//! its own errno, and what `ip` then shows agrees.
//!
//! Needs root and `ip netns`; otherwise it prints a SKIPPED line and passes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::{IpAddr, Ipv4Addr};

use proxyplan_agent::kernel::link::Links;
use proxyplan_agent::kernel::namespace::in_namespace;
use support::Netns;

const EEXIST: i32 = 17;
const EADDRNOTAVAIL: i32 = 99;

fn v4(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0a64_0000 + n))
}

#[test]
fn addresses_change_in_batches_with_an_errno_each() {
    let Some(ns) = Netns::create()
        .map_err(|reason| println!("SKIPPED: {reason}"))
        .ok()
    else {
        return;
    };
    let path = std::path::Path::new("/run/netns").join(&ns.name);
    let mut links = in_namespace(&path, Links::open).expect("open rtnetlink in the namespace");
    let lo = links.link_index("lo").unwrap().expect("lo");
    assert_eq!(links.link_index("pp-missing0").unwrap(), None);

    // More than one batch, with failures spread over both and at a batch's end.
    let first: Vec<IpAddr> = (0..300).map(v4).collect();
    assert_eq!(
        links.change_addresses(lo, &first, true).unwrap(),
        vec![0; 300]
    );
    let second: Vec<IpAddr> = (250..600).map(v4).collect();
    let errnos = links.change_addresses(lo, &second, true).unwrap();
    assert_eq!(errnos.len(), 350);
    assert!(
        errnos[..50].iter().all(|e| *e == -EEXIST),
        "{:?}",
        &errnos[..50]
    );
    assert!(errnos[50..].iter().all(|e| *e == 0));

    let held: Vec<IpAddr> = links
        .addresses()
        .unwrap()
        .into_iter()
        .filter(|a| a.index == lo && a.prefix_len == 32 && a.ip != IpAddr::from([127, 0, 0, 1]))
        .map(|a| a.ip)
        .collect();
    assert_eq!(held.len(), 600);
    assert!(
        ns.run(&["ip", "-4", "addr", "show", "dev", "lo"])
            .contains("10.100.2.87/32")
    );

    // Removing, some already gone: EADDRNOTAVAIL for those, in place.
    let gone: Vec<IpAddr> = (590..610).map(v4).collect();
    let errnos = links.change_addresses(lo, &gone, false).unwrap();
    assert!(errnos[..10].iter().all(|e| *e == 0));
    assert!(
        errnos[10..].iter().all(|e| *e == -EADDRNOTAVAIL),
        "{errnos:?}"
    );
    assert_eq!(
        links.change_addresses(lo, &[], true).unwrap(),
        Vec::<i32>::new()
    );

    // On a thread of their own, the links come back afterwards.
    let rest: Vec<IpAddr> = (0..590).map(v4).collect();
    let (links_back, errnos) = links.spawn_address_changes(lo, rest, false).wait();
    assert_eq!(errnos.unwrap(), vec![0; 590]);
    let mut links = links_back.expect("the links come back");
    assert!(
        links
            .addresses()
            .unwrap()
            .iter()
            .all(|a| !matches!(a.ip, IpAddr::V4(ip) if ip.octets()[..2] == [10, 100]))
    );
}
