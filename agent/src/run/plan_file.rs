//! Plan files: a node's plan and the shards it names, as multi-document YAML (or JSON),
//! as `proxyplan-controller plan --node NAME` prints them. Used by `check` and `apply`.

use std::path::Path;

use proxyplan_crds::{NodeProxyPlan, ProxyPlanShard};

/// Why a plan file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PlanFileError {
    /// The file cannot be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A document is not YAML, or not a valid plan or shard.
    #[error("{path}: document {document}: {source}")]
    Parse {
        /// The file.
        path: String,
        /// 1-based document number.
        document: usize,
        /// The error.
        source: serde_yaml::Error,
    },
    /// A document of another kind.
    #[error(
        "{path}: document {document}: unexpected kind {kind:?} (want NodeProxyPlan or ProxyPlanShard)"
    )]
    UnexpectedKind {
        /// The file.
        path: String,
        /// 1-based document number.
        document: usize,
        /// The kind found, if any.
        kind: Option<String>,
    },
    /// Not exactly one plan.
    #[error("{path}: expected exactly one NodeProxyPlan, found {found}")]
    PlanCount {
        /// The file.
        path: String,
        /// How many there are.
        found: usize,
    },
}

/// Reads a plan file.
///
/// # Errors
/// When the file cannot be read or does not hold exactly one plan plus shards.
pub fn read(path: &Path) -> Result<(NodeProxyPlan, Vec<ProxyPlanShard>), PlanFileError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| PlanFileError::Read {
        path: shown.clone(),
        source,
    })?;
    parse(&text, &shown)
}

/// Parses the text of a plan file; `path` names it in errors.
///
/// # Errors
/// When the text does not hold exactly one plan plus shards.
pub fn parse(
    text: &str,
    path: &str,
) -> Result<(NodeProxyPlan, Vec<ProxyPlanShard>), PlanFileError> {
    let mut plans = Vec::new();
    let mut shards = Vec::new();
    for (i, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let parse_error = |source| PlanFileError::Parse {
            path: path.to_owned(),
            document: i + 1,
            source,
        };
        let value = <serde_yaml::Value as serde::Deserialize>::deserialize(document)
            .map_err(parse_error)?;
        match value.get("kind").and_then(serde_yaml::Value::as_str) {
            Some("NodeProxyPlan") => {
                plans.push(serde_yaml::from_value(value).map_err(parse_error)?)
            }
            Some("ProxyPlanShard") => {
                shards.push(serde_yaml::from_value(value).map_err(parse_error)?);
            }
            None if value.is_null() => {}
            other => {
                return Err(PlanFileError::UnexpectedKind {
                    path: path.to_owned(),
                    document: i + 1,
                    kind: other.map(str::to_owned),
                });
            }
        }
    }
    if plans.len() != 1 {
        return Err(PlanFileError::PlanCount {
            path: path.to_owned(),
            found: plans.len(),
        });
    }
    let plan = plans.remove(0);
    Ok((plan, shards))
}
