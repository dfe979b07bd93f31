//! Decoding watched objects one at a time, so that one odd object never stalls a watch.
//!
//! The API server stores objects our typed structs cannot read: a Service status whose
//! condition has an empty `lastTransitionTime`, a plan field written by a newer
//! controller. Decoded strictly, one such object fails the whole watch stream, which
//! then retries with backoff while nothing else is seen either. A [`Lenient`] watch
//! decodes every object into JSON first, keeps only the fields the reader uses
//! ([`Projection`]), and then decodes those: an object that still fails is delivered as
//! an error naming the field, beside its name, and the watch goes on.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// Why one object could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct DecodeError {
    /// JSON path of the field, e.g. `spec.servicePorts[0].protocol`.
    pub path: String,
    /// What is wrong with it.
    pub message: String,
}

/// Which fields of an object its reader uses; everything else is dropped before the
/// typed decode, so an odd value there cannot refuse the object.
pub trait Projection {
    /// Keeps what the reader needs of `object`.
    #[must_use]
    fn project(object: Value) -> Value {
        object
    }
}

/// An object as far as it could be decoded: its identity always, the typed object or
/// why not.
#[derive(Debug, Clone)]
pub struct Lenient<K> {
    meta: ObjectMeta,
    /// The object, or why it could not be decoded.
    pub object: Result<K, DecodeError>,
}

impl<K> Lenient<K> {
    /// A decoded object.
    pub fn decoded(meta: ObjectMeta, object: K) -> Self {
        Self {
            meta,
            object: Ok(object),
        }
    }
}

impl<'de, K: DeserializeOwned + Projection> Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Ok(Self::from_value(value))
    }
}

impl<K: DeserializeOwned + Projection> Lenient<K> {
    /// Decodes one object from its JSON form.
    #[must_use]
    pub fn from_value(value: Value) -> Self {
        let meta = identity(&value);
        let projected = K::project(value);
        let object = serde_path_to_error::deserialize(projected).map_err(|err| {
            let path = err.path().to_string();
            DecodeError {
                path: if path == "." { String::new() } else { path },
                message: err.into_inner().to_string(),
            }
        });
        Self { meta, object }
    }
}

/// The identity of an object, read field by field so that no odd metadata value can
/// hide which object it is.
fn identity(value: &Value) -> ObjectMeta {
    let meta = value.get("metadata");
    let text = |field: &str| {
        meta.and_then(|m| m.get(field))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let labels = meta
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
        .map(|l| {
            l.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect::<BTreeMap<_, _>>()
        });
    ObjectMeta {
        name: text("name"),
        namespace: text("namespace"),
        uid: text("uid"),
        resource_version: text("resourceVersion"),
        generation: meta
            .and_then(|m| m.get("generation"))
            .and_then(Value::as_i64),
        labels,
        ..ObjectMeta::default()
    }
}

impl<K: kube::Resource> kube::Resource for Lenient<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

/// Keeps only the listed top-level fields (besides `apiVersion` and `kind`), and of
/// `metadata` only the identity and the fields a reader uses.
#[must_use]
pub fn keep_fields(object: Value, keep: &[&str]) -> Value {
    keep_fields_and_meta(object, keep, &[])
}

/// [`keep_fields`], also keeping the `metadata` fields in `meta`.
#[must_use]
pub fn keep_fields_and_meta(object: Value, keep: &[&str], meta: &[&str]) -> Value {
    let Value::Object(mut map) = object else {
        return object;
    };
    map.retain(|k, _| {
        keep.contains(&k.as_str()) || matches!(k.as_str(), "metadata" | "apiVersion" | "kind")
    });
    let extra = meta;
    if let Some(Value::Object(meta)) = map.get_mut("metadata") {
        meta.retain(|k, _| {
            extra.contains(&k.as_str())
                || matches!(
                    k.as_str(),
                    "name"
                        | "namespace"
                        | "uid"
                        | "resourceVersion"
                        | "generation"
                        | "labels"
                        | "annotations"
                        | "deletionTimestamp"
                        | "ownerReferences"
                )
        });
    }
    Value::Object(map)
}

/// Drops `field` from the object at `path` (a chain of object keys), if present.
pub fn drop_field(object: &mut Value, path: &[&str], field: &str) {
    let mut at = object;
    for key in path {
        match at.get_mut(*key) {
            Some(next) => at = next,
            None => return,
        }
    }
    if let Value::Object(map) = at {
        map.remove(field);
    }
}

/// Keeps only the listed keys of the object at `path`, if it is one.
pub fn keep_keys(object: &mut Value, path: &[&str], keep: &[&str]) {
    let mut at = object;
    for key in path {
        match at.get_mut(*key) {
            Some(next) => at = next,
            None => return,
        }
    }
    if let Value::Object(map) = at {
        map.retain(|k, _| keep.contains(&k.as_str()));
    }
}

/// The agent reads a plan's spec and the status it wrote; a status it cannot read (a
/// newer agent's) is dropped rather than refusing the plan.
impl Projection for crate::NodeProxyPlan {
    fn project(object: Value) -> Value {
        spec_and_readable_status::<crate::NodeProxyPlanStatus>(object)
    }
}

/// The agent reads a Service plan's spec (and its annotations: when the EndpointSlice
/// change behind it was triggered); the controller also its rollout status. A status it
/// cannot read (a newer controller's) is dropped rather than refusing the plan.
impl Projection for crate::ServiceProxyPlan {
    fn project(object: Value) -> Value {
        spec_and_readable_status::<crate::ServiceProxyPlanStatus>(object)
    }
}

/// A plan's metadata, spec and status, without a status that does not decode as `S`
/// (another version's).
fn spec_and_readable_status<S: serde::de::DeserializeOwned>(object: Value) -> Value {
    let mut object = keep_fields_and_meta(object, &["spec", "status"], &[]);
    let readable = object
        .get("status")
        .is_none_or(|status| S::deserialize(status).is_ok());
    if !readable {
        drop_field(&mut object, &[], "status");
    }
    object
}

/// The controller reads a Service's spec and its load-balancer ingress; status
/// conditions (whose timestamps other controllers write) are not read.
impl Projection for k8s_openapi::api::core::v1::Service {
    fn project(object: Value) -> Value {
        let mut object = keep_fields(object, &["spec", "status"]);
        keep_keys(&mut object, &["status"], &["loadBalancer"]);
        object
    }
}

/// The controller reads a slice's address type, ports and endpoints.
impl Projection for k8s_openapi::api::discovery::v1::EndpointSlice {
    fn project(object: Value) -> Value {
        keep_fields(object, &["addressType", "endpoints", "ports"])
    }
}

/// The controller reads a Node's pod CIDRs, taints, addresses and zone label; the
/// status the kubelet writes every few seconds (conditions, images, heartbeats) is not
/// read.
impl Projection for k8s_openapi::api::core::v1::Node {
    fn project(object: Value) -> Value {
        let mut object = keep_fields(object, &["spec", "status"]);
        keep_keys(&mut object, &["spec"], &["podCIDR", "podCIDRs", "taints"]);
        if let Some(Value::Array(taints)) = object.get_mut("spec").and_then(|s| s.get_mut("taints"))
        {
            for taint in taints {
                keep_keys(taint, &[], &["key", "value", "effect"]);
            }
        }
        keep_keys(&mut object, &["status"], &["addresses"]);
        object
    }
}

/// The controller reads a ServiceCIDR's ranges.
impl Projection for k8s_openapi::api::networking::v1::ServiceCIDR {
    fn project(object: Value) -> Value {
        keep_fields(object, &["spec"])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ServiceProxyPlan;
    use serde_json::json;

    #[test]
    fn an_object_that_does_not_decode_keeps_its_identity_and_names_the_field() {
        let value = json!({
            "apiVersion": "proxyplan.dev/v1alpha1",
            "kind": "ServiceProxyPlan",
            "metadata": {"name": "web", "namespace": "default", "resourceVersion": "7",
                          "creationTimestamp": ""},
            "spec": {"revision": "r", "servicePorts": [{"key": 1}]}
        });
        let lenient: Lenient<ServiceProxyPlan> = serde_json::from_value(value).expect("decodes");
        let err = lenient.object.clone().expect_err("refused");
        assert_eq!(err.path, "spec.servicePorts[0].key");
        assert!(err.message.contains("invalid type"), "{}", err.message);
        assert_eq!(kube::ResourceExt::name_any(&lenient), "web");
        assert_eq!(
            kube::ResourceExt::resource_version(&lenient).as_deref(),
            Some("7")
        );
    }

    #[test]
    fn a_good_object_decodes() {
        let value = json!({
            "apiVersion": "proxyplan.dev/v1alpha1",
            "kind": "ServiceProxyPlan",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"revision": "r"}
        });
        let lenient: Lenient<ServiceProxyPlan> = serde_json::from_value(value).expect("decodes");
        assert_eq!(lenient.object.expect("decoded").spec.revision, "r");
    }

    #[test]
    fn a_service_whose_status_condition_has_an_empty_time_still_decodes() {
        let value = json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "odd", "namespace": "default",
                          "managedFields": [{"manager": "x", "time": ""}]},
            "spec": {"clusterIP": "10.96.0.9", "ports": [{"port": 80}]},
            "status": {"conditions": [{"type": "X", "status": "True", "reason": "R",
                                        "message": "", "lastTransitionTime": ""}],
                       "loadBalancer": {"ingress": [{"ip": "192.0.2.9"}]}}
        });
        assert!(
            serde_json::from_value::<k8s_openapi::api::core::v1::Service>(value.clone()).is_err(),
            "the strict decode refuses it"
        );
        let lenient: Lenient<k8s_openapi::api::core::v1::Service> =
            serde_json::from_value(value).expect("decodes");
        let svc = lenient.object.expect("decoded");
        assert_eq!(
            svc.spec.and_then(|s| s.cluster_ip).as_deref(),
            Some("10.96.0.9")
        );
        let ingress = svc.status.and_then(|s| s.load_balancer?.ingress);
        assert_eq!(ingress.map(|i| i.len()), Some(1));
    }

    #[test]
    fn a_node_keeps_its_pod_cidrs_taints_and_addresses() {
        let value = json!({
            "metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "a"}},
            "spec": {"podCIDRs": ["10.244.1.0/24"], "providerID": "x",
                     "taints": [{"key": "k", "effect": "NoSchedule", "timeAdded": ""}]},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.1"}],
                       "conditions": [{"type": "Ready", "lastHeartbeatTime": ""}]}
        });
        let lenient: Lenient<k8s_openapi::api::core::v1::Node> =
            serde_json::from_value(value).expect("decodes");
        let node = lenient.object.expect("decoded");
        let spec = node.spec.expect("spec");
        assert_eq!(spec.pod_cidrs, Some(vec!["10.244.1.0/24".to_owned()]));
        assert_eq!(spec.taints.map(|t| t.len()), Some(1));
        assert_eq!(spec.provider_id, None);
        assert!(node.status.expect("status").conditions.is_none());
    }

    #[test]
    fn projections_keep_what_is_listed() {
        let value = json!({
            "metadata": {"name": "a", "managedFields": [{"time": ""}], "labels": {"x": "y"}},
            "spec": {"a": 1},
            "status": {"conditions": [{"lastTransitionTime": ""}], "loadBalancer": {}}
        });
        let mut kept = keep_fields(value, &["spec", "status"]);
        drop_field(&mut kept, &["status"], "conditions");
        assert_eq!(
            kept,
            json!({
                "metadata": {"name": "a", "labels": {"x": "y"}},
                "spec": {"a": 1},
                "status": {"loadBalancer": {}}
            })
        );
    }
}
