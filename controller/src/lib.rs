//! The proxyplan controller: turns Services, EndpointSlices and Nodes into one
//! `NodeProxyPlan` per node plus one shared `ServiceProxyPlan` per Service.
//!
//! The core ([`model`], [`select`], [`planner`]) is pure and synchronous; [`state_file`]
//! and [`run`] are the edges that read files and talk to the API server.

pub mod config;
pub mod model;
pub mod planner;
pub mod run;
pub mod select;
pub mod split;
pub mod state_file;
pub mod synthetic;
pub mod uninstall;

pub use config::PlannerConfig;
pub use planner::{Changes, DesiredObject, ObjectId, Planner};
