//! Cluster-free parts of the end-to-end suite.

pub mod expect;
pub mod fixtures;
pub mod forward;
pub mod kubeconfig;
pub mod report;
