//! Reading cluster state from files, as `kubectl get -o yaml|json` prints it: one object,
//! several YAML documents, or a `List` (including typed lists like `ServiceList`).

use std::path::Path;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use serde::Deserialize;

/// The objects read from state files.
#[derive(Debug, Default)]
pub struct ClusterState {
    /// Services.
    pub services: Vec<Service>,
    /// EndpointSlices.
    pub slices: Vec<EndpointSlice>,
    /// Nodes.
    pub nodes: Vec<Node>,
    /// ServiceCIDRs (every node plan carries their union, as the controller's do).
    pub service_cidrs: Vec<ServiceCIDR>,
    /// Documents that could not be used, with the reason.
    pub skipped: Vec<SkippedObject>,
    /// Where each object was read (`file:document`), by `Kind namespace/name`.
    pub sources: std::collections::HashMap<String, String>,
}

/// A document that was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedObject {
    /// `file:document-number`.
    pub source: String,
    /// `Kind namespace/name` as far as it could be read.
    pub object: String,
    /// Why.
    pub reason: String,
}

impl std::fmt::Display for SkippedObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {}", self.source, self.object, self.reason)
    }
}

/// A file that cannot be read at all.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    /// The file could not be opened or read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not YAML or JSON.
    #[error("{path}: document {document}: not YAML or JSON: {source}")]
    Parse {
        /// The file.
        path: String,
        /// 1-based document number.
        document: usize,
        /// The parser's error.
        source: serde_yaml::Error,
    },
}

impl ClusterState {
    /// Reads every file (`-` is standard input) into one state.
    ///
    /// # Errors
    /// When a file cannot be read or parsed at all; single unusable objects are recorded
    /// in [`ClusterState::skipped`] instead.
    pub fn read_files(paths: &[impl AsRef<Path>]) -> Result<Self, StateFileError> {
        let mut state = Self::default();
        for path in paths {
            let path = path.as_ref();
            let name = path.display().to_string();
            let text = if name == "-" {
                std::io::read_to_string(std::io::stdin())
            } else {
                std::fs::read_to_string(path)
            }
            .map_err(|source| StateFileError::Read {
                path: name.clone(),
                source,
            })?;
            state.add_text(&name, &text)?;
        }
        Ok(state)
    }

    /// Adds the objects of one file's text.
    ///
    /// # Errors
    /// When the text is not YAML or JSON.
    pub fn add_text(&mut self, name: &str, text: &str) -> Result<(), StateFileError> {
        for (i, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
            let value = serde_json::Value::deserialize(document).map_err(|source| {
                StateFileError::Parse {
                    path: name.to_owned(),
                    document: i + 1,
                    source,
                }
            })?;
            self.add_value(&format!("{name}:{}", i + 1), value);
        }
        Ok(())
    }

    /// Where an object was read, as `file:document`.
    #[must_use]
    pub fn source_of(&self, kind: &str, object: &str) -> Option<&str> {
        self.sources
            .get(&format!("{kind} {object}"))
            .map(String::as_str)
    }

    fn add_value(&mut self, source: &str, value: serde_json::Value) {
        if value.is_null() {
            return; // an empty document, e.g. after a trailing `---`
        }
        let kind = value
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or_default()
            .to_owned();
        if kind.ends_with("List") {
            if let Some(serde_json::Value::Array(items)) = value.get("items") {
                for (i, item) in items.iter().enumerate() {
                    self.add_value(&format!("{source}.items[{i}]"), item.clone());
                }
            }
            return;
        }
        let object = describe(&kind, &value);
        let skip = |reason: String| SkippedObject {
            source: source.to_owned(),
            object: object.clone(),
            reason,
        };
        if matches!(
            kind.as_str(),
            "Service" | "EndpointSlice" | "Node" | "ServiceCIDR"
        ) {
            self.sources.insert(object.clone(), source.to_owned());
        }
        let result = match kind.as_str() {
            "Service" => serde_json::from_value(value).map(|s| self.services.push(s)),
            "EndpointSlice" => serde_json::from_value(value).map(|s| self.slices.push(s)),
            "Node" => serde_json::from_value(value).map(|n| self.nodes.push(n)),
            "ServiceCIDR" => serde_json::from_value(value).map(|c| self.service_cidrs.push(c)),
            "" => {
                self.skipped.push(skip("no kind".to_owned()));
                return;
            }
            other => {
                self.skipped
                    .push(skip(format!("kind {other} is not read by the planner")));
                return;
            }
        };
        if let Err(err) = result {
            self.skipped
                .push(skip(format!("does not match the {kind} schema: {err}")));
        }
    }
}

fn describe(kind: &str, value: &serde_json::Value) -> String {
    let meta = value.get("metadata");
    let field = |f: &str| {
        meta.and_then(|m| m.get(f))
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    };
    let kind = if kind.is_empty() { "object" } else { kind };
    match (field("namespace"), field("name")) {
        (Some(ns), Some(name)) => format!("{kind} {ns}/{name}"),
        (None, Some(name)) => format!("{kind} {name}"),
        _ => format!("{kind} (unnamed)"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn reads_documents_lists_and_json_and_reports_the_rest() {
        let yaml = "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: x}\nspec: {clusterIP: 10.0.0.1}\n\
                    ---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: x}\n---\n\
                    apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata: {name: n1}\n\
                    - apiVersion: v1\n  kind: Service\n  metadata: {name: bad}\n  spec: {ports: 7}\n---\n";
        let mut state = ClusterState::default();
        state.add_text("f.yaml", yaml).unwrap();
        state
            .add_text("g.json", r#"{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSliceList","items":[{"kind":"EndpointSlice","addressType":"IPv4","endpoints":[],"metadata":{"name":"s","namespace":"x"}}]}"#)
            .unwrap();
        assert_eq!(state.services.len(), 1);
        assert_eq!(state.nodes.len(), 1);
        assert_eq!(state.slices.len(), 1);
        let skipped: Vec<String> = state.skipped.iter().map(ToString::to_string).collect();
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(
            skipped[0].starts_with("f.yaml:2: ConfigMap x/c: kind ConfigMap"),
            "{skipped:?}"
        );
        assert!(
            skipped[1]
                .starts_with("f.yaml:3.items[1]: Service bad: does not match the Service schema"),
            "{skipped:?}"
        );
    }

    #[test]
    fn unparsable_text_is_an_error_naming_the_file() {
        let err = ClusterState::default()
            .add_text("broken.yaml", "a: [")
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("broken.yaml: document 1: not YAML or JSON"),
            "{err}"
        );
    }
}
