//! Integration and end-to-end tests of proxyplan live in `tests/`.
//!
//! This library holds the real control plane the suites run against
//! ([`control_plane`]), and the parts of the end-to-end suite (`tests/tests/e2e.rs`) that
//! need no cluster, so that they are unit-tested on every run: the objects the suite creates,
//! what every node's merged plan must then hold, the kubeconfig the agents use from
//! their network namespaces, the forwarder that carries their API traffic, and the
//! libtest-style report. [`nft_model`] reads an agent's nftables table on its own, for
//! the fleet benchmark's per-node checker.

pub mod control_plane;
pub mod e2e;
pub mod metrics;
pub mod nft_model;
