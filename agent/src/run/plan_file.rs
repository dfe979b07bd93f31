//! Plan files: a node's plan and every Service's plan, as multi-document YAML (or JSON),
//! as `proxyplan-controller plan --node NAME` prints them. Used by `check` and `apply`.

use std::path::Path;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proxyplan_crds::{
    NodeProxyPlan, NodeProxyPlanSpec, NodeProxyPlanStatus, ServiceProxyPlan, ServiceProxyPlanSpec,
};
use serde::de::{self, EnumAccess, IgnoredAny, MapAccess, SeqAccess, VariantAccess, Visitor};
use serde::{Deserialize, Deserializer};

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
    /// A document is not YAML, or not a valid node plan or Service plan.
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
        "{path}: document {document}: unexpected kind {kind:?} (want NodeProxyPlan or ServiceProxyPlan)"
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
/// When the file cannot be read or does not hold exactly one plan plus Service plans.
pub fn read(path: &Path) -> Result<(NodeProxyPlan, Vec<ServiceProxyPlan>), PlanFileError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| PlanFileError::Read {
        path: shown.clone(),
        source,
    })?;
    parse(&text, &shown)
}

/// Parses the text of a plan file; `path` names it in errors.
///
/// Each document is deserialized once, straight into its typed object (the `kind` picks
/// the type), so a document is never held as a generic YAML tree beside its typed copy.
///
/// # Errors
/// When the text does not hold exactly one plan plus Service plans.
pub fn parse(
    text: &str,
    path: &str,
) -> Result<(NodeProxyPlan, Vec<ServiceProxyPlan>), PlanFileError> {
    let mut plans = Vec::new();
    let mut services = Vec::new();
    for (i, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let parsed =
            PlanDocument::deserialize(document).map_err(|source| PlanFileError::Parse {
                path: path.to_owned(),
                document: i + 1,
                source,
            })?;
        match parsed {
            PlanDocument::Plan(plan) => plans.push(*plan),
            PlanDocument::Service(mut service) => {
                fit_service(&mut service);
                services.push(*service);
            }
            PlanDocument::Empty => {}
            PlanDocument::Other(kind) => {
                return Err(PlanFileError::UnexpectedKind {
                    path: path.to_owned(),
                    document: i + 1,
                    kind,
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
    Ok((plan, services))
}

/// Gives back the room a Service plan's lists were left with: a YAML sequence does not
/// say how long it is, so its list grew by doubling. Done while parsing goes on, the freed
/// room is reused by the next documents.
fn fit_service(service: &mut ServiceProxyPlan) {
    let spec = &mut service.spec;
    for entry in &mut spec.service_ports {
        entry.cluster_endpoints.shrink_to_fit();
        entry.local_endpoints.shrink_to_fit();
        entry.zone_endpoints.shrink_to_fit();
    }
    spec.service_ports.shrink_to_fit();
}

/// One document of a plan file.
enum PlanDocument {
    Plan(Box<NodeProxyPlan>),
    Service(Box<ServiceProxyPlan>),
    /// A document of another kind; `None` when it has no string `kind` (or is no mapping).
    Other(Option<String>),
    /// An empty (null) document.
    Empty,
}

impl<'de> Deserialize<'de> for PlanDocument {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DocumentVisitor)
    }
}

/// The top-level keys a plan document is dispatched on.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum DocumentKey {
    Kind,
    Metadata,
    Spec,
    Status,
    #[serde(other)]
    Other,
}

/// What a document's `kind` says it is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dispatch {
    /// No `kind` read yet.
    Unknown,
    Plan,
    Service,
    /// Another kind, or a `kind` that is not a string: the rest is skipped.
    Other,
}

/// A top-level field of a document.
enum Slot<T> {
    Absent,
    /// Read before `kind` said which type it is: kept as YAML until then (documents
    /// normally start with `kind`, so this is rare and small).
    Early(serde_yaml::Value),
    Typed(T),
}

impl<T> Slot<T> {
    /// Reads the field's value: with `typed` when the kind is known, as YAML otherwise.
    fn fill<'de, A: MapAccess<'de>>(
        &mut self,
        map: &mut A,
        field: &'static str,
        dispatch: Dispatch,
        typed: impl FnOnce(&mut A) -> Result<T, A::Error>,
    ) -> Result<(), A::Error> {
        if !matches!(self, Self::Absent) {
            return Err(de::Error::duplicate_field(field));
        }
        *self = if dispatch == Dispatch::Unknown {
            Self::Early(map.next_value()?)
        } else {
            Self::Typed(typed(map)?)
        };
        Ok(())
    }

    /// The value, if the field was there; one read early is converted with `late`.
    fn finish<E: de::Error>(
        self,
        late: impl FnOnce(serde_yaml::Value) -> Result<T, serde_yaml::Error>,
    ) -> Result<Option<T>, E> {
        match self {
            Self::Absent => Ok(None),
            Self::Early(value) => late(value).map(Some).map_err(E::custom),
            Self::Typed(value) => Ok(Some(value)),
        }
    }
}

/// The spec of a node plan or of a Service plan.
enum Spec {
    Plan(NodeProxyPlanSpec),
    Service(ServiceProxyPlanSpec),
}

/// The top-level fields of one mapping document, read in any order.
struct DocumentFields {
    kind: Option<Option<String>>,
    dispatch: Dispatch,
    metadata: Slot<ObjectMeta>,
    spec: Slot<Spec>,
    status: Slot<Option<NodeProxyPlanStatus>>,
}

impl DocumentFields {
    fn read<'de, A: MapAccess<'de>>(
        &mut self,
        key: DocumentKey,
        map: &mut A,
    ) -> Result<(), A::Error> {
        let dispatch = self.dispatch;
        match (key, dispatch) {
            (DocumentKey::Kind, _) => {
                if self.kind.is_some() {
                    return Err(de::Error::duplicate_field("kind"));
                }
                let value: serde_yaml::Value = map.next_value()?;
                let kind = value.as_str().map(str::to_owned);
                self.dispatch = match kind.as_deref() {
                    Some("NodeProxyPlan") => Dispatch::Plan,
                    Some("ServiceProxyPlan") => Dispatch::Service,
                    _ => Dispatch::Other,
                };
                self.kind = Some(kind);
                Ok(())
            }
            (DocumentKey::Metadata, Dispatch::Unknown | Dispatch::Plan | Dispatch::Service) => self
                .metadata
                .fill(map, "metadata", dispatch, MapAccess::next_value),
            (DocumentKey::Spec, Dispatch::Unknown | Dispatch::Plan | Dispatch::Service) => {
                self.spec.fill(map, "spec", dispatch, |map| {
                    if dispatch == Dispatch::Plan {
                        map.next_value().map(Spec::Plan)
                    } else {
                        map.next_value().map(Spec::Service)
                    }
                })
            }
            (DocumentKey::Status, Dispatch::Unknown | Dispatch::Plan) => {
                self.status
                    .fill(map, "status", dispatch, MapAccess::next_value)
            }
            // A Service plan has no status; other kinds and other fields (`apiVersion`, ...) are
            // not read.
            _ => map.next_value::<IgnoredAny>().map(drop),
        }
    }

    fn finish<E: de::Error>(self) -> Result<PlanDocument, E> {
        let Self {
            kind,
            dispatch,
            metadata,
            spec,
            status,
        } = self;
        if !matches!(dispatch, Dispatch::Plan | Dispatch::Service) {
            return Ok(PlanDocument::Other(kind.flatten()));
        }
        let metadata = metadata
            .finish(serde_yaml::from_value)?
            .ok_or_else(|| de::Error::missing_field("metadata"))?;
        let spec = spec
            .finish(|value| {
                if dispatch == Dispatch::Plan {
                    serde_yaml::from_value(value).map(Spec::Plan)
                } else {
                    serde_yaml::from_value(value).map(Spec::Service)
                }
            })?
            .ok_or_else(|| de::Error::missing_field("spec"))?;
        Ok(match spec {
            Spec::Plan(spec) => PlanDocument::Plan(Box::new(NodeProxyPlan {
                metadata,
                spec,
                status: status.finish(serde_yaml::from_value)?.flatten(),
            })),
            Spec::Service(spec) => PlanDocument::Service(Box::new(ServiceProxyPlan {
                metadata,
                spec,
                status: None,
            })),
        })
    }
}

struct DocumentVisitor;

impl DocumentVisitor {
    #[allow(clippy::unnecessary_wraps)]
    fn other<E>(self) -> Result<PlanDocument, E> {
        Ok(PlanDocument::Other(None))
    }
}

impl<'de> Visitor<'de> for DocumentVisitor {
    type Value = PlanDocument;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a NodeProxyPlan or ServiceProxyPlan")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PlanDocument, A::Error> {
        let mut fields = DocumentFields {
            kind: None,
            dispatch: Dispatch::Unknown,
            metadata: Slot::Absent,
            spec: Slot::Absent,
            status: Slot::Absent,
        };
        while let Some(key) = map.next_key::<DocumentKey>()? {
            fields.read(key, &mut map)?;
        }
        fields.finish()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PlanDocument, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        self.other()
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<PlanDocument, A::Error> {
        // A tagged node (`!Tag ...`).
        let (IgnoredAny, variant) = data.variant()?;
        variant.newtype_variant::<IgnoredAny>()?;
        self.other()
    }

    fn visit_none<E: de::Error>(self) -> Result<PlanDocument, E> {
        Ok(PlanDocument::Empty)
    }

    fn visit_unit<E: de::Error>(self) -> Result<PlanDocument, E> {
        Ok(PlanDocument::Empty)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<PlanDocument, E> {
        self.other()
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<PlanDocument, E> {
        self.other()
    }

    fn visit_i128<E: de::Error>(self, _: i128) -> Result<PlanDocument, E> {
        self.other()
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<PlanDocument, E> {
        self.other()
    }

    fn visit_u128<E: de::Error>(self, _: u128) -> Result<PlanDocument, E> {
        self.other()
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<PlanDocument, E> {
        self.other()
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<PlanDocument, E> {
        self.other()
    }
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
";

    const SERVICE: &str = "\
apiVersion: proxyplan.dev/v1alpha1
kind: ServiceProxyPlan
metadata:
  name: web
  namespace: default
spec:
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
        Vec<proxyplan_crds::ServiceProxyPlan>,
    ) {
        parse(text, "plan.yaml").expect("valid plan file")
    }

    fn parse_err(text: &str) -> PlanFileError {
        parse(text, "plan.yaml").expect_err("invalid plan file")
    }

    #[test]
    fn reads_a_plan_and_its_service_plans() {
        let (plan, services) = parse_ok(&format!("---\n{PLAN}---\n{SERVICE}"));
        assert_eq!(plan.metadata.name.as_deref(), Some("n1"));
        assert_eq!(plan.spec.revision, "r1");
        assert_eq!(services.len(), 1);
        assert_eq!(services[0].metadata.name.as_deref(), Some("web"));
        assert_eq!(services[0].spec.service_ports[0].cluster_endpoints.len(), 1);
        let merged = proxyplan_crds::merge(&plan, &services).expect("merges");
        assert_eq!(merged.service_ports.len(), 1);
    }

    #[test]
    fn service_plan_lists_keep_no_spare_room() {
        let (_, services) = parse_ok(&format!("{PLAN}---\n{SERVICE}"));
        let spec = &services[0].spec;
        assert_eq!(spec.service_ports.capacity(), 1);
        assert_eq!(spec.service_ports[0].cluster_endpoints.capacity(), 1);
    }

    #[test]
    fn field_order_and_empty_documents_do_not_matter() {
        // `kind` after `spec`, the Service plan before the node plan, empty documents in
        // between.
        let reordered =
            SERVICE.replacen("kind: ServiceProxyPlan\n", "", 1) + "kind: ServiceProxyPlan\n";
        let (plan, services) = parse_ok(&format!("---\n---\n{reordered}---\n{PLAN}---\n"));
        assert_eq!(plan.spec.node_name, "n1");
        assert_eq!(services[0].spec.revision, "s1");
        assert_eq!(services[0].spec.service_ports[0].port, 80);
    }

    #[test]
    fn a_plan_keeps_its_status_wherever_it_is() {
        let status = "status:\n  appliedRevision: r0\n";
        for text in [format!("{PLAN}{status}"), format!("{status}{PLAN}")] {
            let (plan, _) = parse_ok(&text);
            let applied = plan.status.and_then(|s| s.applied_revision);
            assert_eq!(applied.as_deref(), Some("r0"), "{text}");
        }
        let (plan, _) = parse_ok(&format!("{PLAN}status: null\n"));
        assert_eq!(plan.status, None);
    }

    #[test]
    fn fields_of_other_kinds_are_not_read() {
        // Neither `metadata: 5` (read before `kind`) nor `spec` is a plan's.
        let err = parse_err(&format!(
            "{PLAN}---\nmetadata: 5\nspec: [1]\nkind: ConfigMap\n"
        ));
        assert!(
            matches!(
                &err,
                PlanFileError::UnexpectedKind { document: 2, kind: Some(k), .. } if k == "ConfigMap"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_repeated_field_is_refused() {
        let err = parse_err(&format!("{PLAN}spec:\n  nodeName: n2\n"));
        assert!(
            matches!(err, PlanFileError::Parse { document: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn reads_json() {
        let plan = r#"{"apiVersion": "proxyplan.dev/v1alpha1", "kind": "NodeProxyPlan",
            "metadata": {"name": "n1"},
            "spec": {"nodeName": "n1", "revision": "r1",
                     "localTraffic": {"mode": "NodeCIDR"}}}"#;
        let (plan, services) = parse_ok(plan);
        assert_eq!(plan.spec.node_name, "n1");
        assert!(services.is_empty());
        let shard = r#"{"kind": "ServiceProxyPlan",
            "metadata": {"name": "web", "namespace": "a"}, "spec": {"revision": "s2"}}"#;
        let (_, services) = parse_ok(&format!(
            "{}\n---\n{shard}\n",
            r#"{"kind": "NodeProxyPlan", "metadata": {"name": "n1"}, "spec": {"nodeName": "n1", "revision": "r1", "localTraffic": {"mode": "NodeCIDR"}}}"#
        ));
        assert_eq!(services[0].metadata.namespace.as_deref(), Some("a"));
        assert_eq!(services[0].spec.revision, "s2");
    }

    #[test]
    fn a_document_of_another_kind_is_refused_by_number() {
        let err = parse_err(&format!(
            "---\n{PLAN}---\nkind: Service\nmetadata: {{name: x}}\n"
        ));
        assert_eq!(
            err.to_string(),
            "plan.yaml: document 2: unexpected kind Some(\"Service\") (want NodeProxyPlan or ServiceProxyPlan)"
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
        let err = parse_err(SERVICE);
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
        let (document, cause) = parse_failure(&format!(
            "{PLAN}---\n{}",
            SERVICE.replace("port: 80\n", "port: eighty\n")
        ));
        assert_eq!(document, 2);
        assert!(cause.contains("expected u16"), "{cause}");

        let (document, cause) = parse_failure(&PLAN.replace("  nodeName: n1\n", ""));
        assert_eq!(document, 1);
        assert!(cause.contains("missing field `nodeName`"), "{cause}");

        let err = parse_err(&format!("{PLAN}---\nkind: [unclosed\n"));
        assert!(
            matches!(err, PlanFileError::Parse { document: 2, .. }),
            "{err}"
        );

        let (document, cause) = parse_failure(&PLAN.replace("metadata:\n  name: n1\n", ""));
        assert_eq!(document, 1);
        assert!(cause.contains("missing field `metadata`"), "{cause}");
    }

    /// The document number and cause of a [`PlanFileError::Parse`].
    fn parse_failure(text: &str) -> (usize, String) {
        match parse_err(text) {
            PlanFileError::Parse {
                document, source, ..
            } => (document, source.to_string()),
            other => panic!("not a parse error: {other}"),
        }
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
