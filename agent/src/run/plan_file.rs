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

#[cfg(test)]
mod tests {
    use super::{PlanFileError, parse, read};

    const PLAN: &str = "\
apiVersion: proxyplan.dev/v1alpha1
kind: NodeProxyPlan
metadata:
  name: n1
spec:
  nodeName: n1
  revision: r1
  localTraffic:
    mode: ClusterCIDR
  shards:
  - name: cluster-0
";

    const SHARD: &str = "\
apiVersion: proxyplan.dev/v1alpha1
kind: ProxyPlanShard
metadata:
  name: cluster-0
spec:
  scope: Cluster
  revision: s1
  servicePorts:
  - key: default/web:http/TCP/IPv4
    namespace: default
    name: web
    portName: http
    family: IPv4
    protocol: TCP
    port: 80
    clusterIP: 10.96.0.1
    internal:
      policy: Cluster
      whenEmpty: Reject
    clusterEndpoints:
    - ip: 10.0.0.1
      port: 8080
    masquerade:
      all: false
      offClusterToClusterIP: true
      external: false
      localHostToExternal: false
      hairpin: true
";

    fn parse_ok(
        text: &str,
    ) -> (
        proxyplan_crds::NodeProxyPlan,
        Vec<proxyplan_crds::ProxyPlanShard>,
    ) {
        parse(text, "plan.yaml").expect("valid plan file")
    }

    fn parse_err(text: &str) -> PlanFileError {
        parse(text, "plan.yaml").expect_err("invalid plan file")
    }

    #[test]
    fn reads_a_plan_and_its_shards() {
        let (plan, shards) = parse_ok(&format!("---\n{PLAN}---\n{SHARD}"));
        assert_eq!(plan.metadata.name.as_deref(), Some("n1"));
        assert_eq!(plan.spec.revision, "r1");
        assert_eq!(shards.len(), 1);
        assert_eq!(shards[0].metadata.name.as_deref(), Some("cluster-0"));
        assert_eq!(shards[0].spec.service_ports[0].cluster_endpoints.len(), 1);
        let merged = proxyplan_crds::merge(&plan, &shards).expect("merges");
        assert_eq!(merged.service_ports.len(), 1);
    }

    #[test]
    fn field_order_and_empty_documents_do_not_matter() {
        // `kind` after `spec`, the shard before the plan, empty documents in between.
        let reordered = SHARD.replacen("kind: ProxyPlanShard\n", "", 1) + "kind: ProxyPlanShard\n";
        let (plan, shards) = parse_ok(&format!("---\n---\n{reordered}---\n{PLAN}---\n"));
        assert_eq!(plan.spec.node_name, "n1");
        assert_eq!(shards[0].spec.revision, "s1");
        assert_eq!(shards[0].spec.service_ports[0].port, 80);
    }

    #[test]
    fn reads_json() {
        let plan = r#"{"apiVersion": "proxyplan.dev/v1alpha1", "kind": "NodeProxyPlan",
            "metadata": {"name": "n1"},
            "spec": {"nodeName": "n1", "revision": "r1",
                     "localTraffic": {"mode": "NodeCIDR"}, "shards": []}}"#;
        let (plan, shards) = parse_ok(plan);
        assert_eq!(plan.spec.node_name, "n1");
        assert!(shards.is_empty());
        let shard = r#"{"kind": "ProxyPlanShard", "metadata": {"name": "zone-a"},
            "spec": {"scope": "Zone", "zone": "a", "revision": "s2"}}"#;
        let (_, shards) = parse_ok(&format!(
            "{}\n---\n{shard}\n",
            r#"{"kind": "NodeProxyPlan", "metadata": {"name": "n1"}, "spec": {"nodeName": "n1", "revision": "r1", "localTraffic": {"mode": "NodeCIDR"}, "shards": []}}"#
        ));
        assert_eq!(shards[0].spec.zone.as_deref(), Some("a"));
    }

    #[test]
    fn a_document_of_another_kind_is_refused_by_number() {
        let err = parse_err(&format!(
            "---\n{PLAN}---\nkind: Service\nmetadata: {{name: x}}\n"
        ));
        assert_eq!(
            err.to_string(),
            "plan.yaml: document 2: unexpected kind Some(\"Service\") (want NodeProxyPlan or ProxyPlanShard)"
        );
        for other in [
            "metadata: {name: x}\n",
            "kind: 5\n",
            "just text\n",
            "- a\n- b\n",
        ] {
            let err = parse_err(&format!("{PLAN}---\n{other}"));
            assert!(
                matches!(
                    err,
                    PlanFileError::UnexpectedKind {
                        document: 2,
                        kind: None,
                        ..
                    }
                ),
                "{other:?}: {err}"
            );
        }
    }

    #[test]
    fn exactly_one_plan() {
        let err = parse_err(SHARD);
        assert_eq!(
            err.to_string(),
            "plan.yaml: expected exactly one NodeProxyPlan, found 0"
        );
        let err = parse_err(&format!("{PLAN}---\n{PLAN}"));
        assert!(
            matches!(err, PlanFileError::PlanCount { found: 2, .. }),
            "{err}"
        );
        let err = parse_err("");
        assert!(
            matches!(err, PlanFileError::PlanCount { found: 0, .. }),
            "{err}"
        );
    }

    #[test]
    fn parse_errors_name_the_document() {
        let err = parse_err(&format!(
            "{PLAN}---\n{}",
            SHARD.replace("port: 80\n", "port: eighty\n")
        ));
        let PlanFileError::Parse {
            document, source, ..
        } = &err
        else {
            panic!("{err}");
        };
        assert_eq!(*document, 2);
        assert!(source.to_string().contains("expected u16"), "{err}");

        let err = parse_err(&PLAN.replace("  nodeName: n1\n", ""));
        let PlanFileError::Parse {
            document, source, ..
        } = &err
        else {
            panic!("{err}");
        };
        assert_eq!(*document, 1);
        assert!(
            source.to_string().contains("missing field `nodeName`"),
            "{err}"
        );

        let err = parse_err(&format!("{PLAN}---\nkind: [unclosed\n"));
        assert!(
            matches!(err, PlanFileError::Parse { document: 2, .. }),
            "{err}"
        );

        let err = parse_err(&PLAN.replace("metadata:\n  name: n1\n", ""));
        let PlanFileError::Parse {
            document, source, ..
        } = &err
        else {
            panic!("{err}");
        };
        assert_eq!(*document, 1);
        assert!(
            source.to_string().contains("missing field `metadata`"),
            "{err}"
        );
    }

    #[test]
    fn an_unreadable_file_is_named() {
        let err = read(std::path::Path::new("/nonexistent/plan.yaml")).expect_err("no file");
        assert!(
            err.to_string()
                .starts_with("reading /nonexistent/plan.yaml: "),
            "{err}"
        );
    }
}
