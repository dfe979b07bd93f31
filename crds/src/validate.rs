//! Validation and merging of a node plan with the Services' plans: the contract between
//! the controller, which writes them, and the agent, which must never program what it
//! cannot trust.
//!
//! A node plan that fails validation is refused whole. A `ServiceProxyPlan` that fails is
//! refused on its own: its last good version (if the merge cache has one) stays merged,
//! and the refusal is reported, so one bad object never stops every other Service.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use crate::{
    CompactString, Endpoint, EndpointOverride, IpFamily, LocalTrafficDetection, LocalTrafficMode,
    NodeProxyPlan, Protocol, SERVICE_LABEL, ServicePortPlan, ServiceProxyPlan,
};

/// Why a plan, or one Service's plan, cannot be used. Names the object and the field.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    /// A field holds a value the agent cannot program.
    #[error("{object}: {field}: {reason}")]
    InvalidField {
        /// `NodeProxyPlan/<name>` or `ServiceProxyPlan/<namespace>/<name>`.
        object: String,
        /// JSON path of the field, e.g. `spec.servicePorts[3].clusterIP`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl PlanError {
    /// A short stable label for metrics.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::InvalidField { .. } => "invalid_field",
        }
    }

    /// The object the error is about.
    #[must_use]
    pub fn object(&self) -> &str {
        match self {
            Self::InvalidField { object, .. } => object,
        }
    }
}

/// `--nodeport-addresses primary`: node ports (and health-check node ports) only on the
/// node's primary IP of each family, as kube-proxy resolves it — the first InternalIP of
/// that family in the Node's `status.addresses` (the controller lists InternalIPs before
/// ExternalIPs, in the Node's order), else its first ExternalIP; loopback never.
///
/// The node's primary addresses among `addresses` (the plan's): one per family at most.
#[must_use]
pub fn primary_addresses(addresses: &[IpAddr]) -> Vec<IpAddr> {
    let first = |v6: bool| {
        addresses
            .iter()
            .copied()
            .find(|ip| ip.is_ipv6() == v6 && !ip.is_loopback())
    };
    [first(false), first(true)].into_iter().flatten().collect()
}

/// A node's plan with every layer merged: what the agent programs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergedPlan {
    /// The node's name.
    pub node_name: String,
    /// The node plan's revision.
    pub revision: String,
    /// Which Service plans were merged, by name and content revision: equal fingerprints
    /// (with equal node plan revisions) mean the same merged content.
    pub services_fingerprint: u64,
    /// The node's addresses.
    pub addresses: Vec<IpAddr>,
    /// Local-traffic detection.
    pub local_traffic: LocalTrafficDetection,
    /// The cluster's Service CIDRs (empty when unknown).
    pub service_cidrs: Vec<String>,
    /// Every service port entry, zone lists and overlays applied, sorted by key. Shared:
    /// an entry that did not change since an earlier merge with the same [`MergeCache`]
    /// is the same allocation.
    pub service_ports: Vec<Arc<ServicePortPlan>>,
    /// Service plans refused by validation, one error each: their last good version, if
    /// the cache had one, is merged instead; otherwise their entries are left out.
    pub refused: Vec<PlanError>,
    /// Keys of overlay overrides whose service port no merged Service plan has (it has
    /// not arrived yet, or is gone): nothing to override, so they are left out.
    pub unmatched: Vec<String>,
}

/// Validates `plan` and the Service plans, and merges them: node overlay over the node's
/// zone list over the Service's entry, by key.
///
/// # Errors
/// When the node plan itself is invalid (the first problem found, naming the field).
/// Problems of one Service plan are reported in [`MergedPlan::refused`].
pub fn merge(plan: &NodeProxyPlan, services: &[ServiceProxyPlan]) -> Result<MergedPlan, PlanError> {
    merge_cached(plan, services, &mut MergeCache::default())
}

/// The validated entries of Service plans from earlier merges, by object and
/// `resourceVersion`: an object seen again unchanged is neither validated nor copied
/// again, and its entries are shared (one [`Arc`] each) with the earlier merged plans,
/// so a consumer can tell unchanged entries by pointer. It also keeps each object's last
/// good entries, merged while a newer version of the object is refused.
#[derive(Debug, Default)]
pub struct MergeCache {
    objects: HashMap<CompactString, CachedObject>,
    /// Whether objects missing from a merge stay until [`MergeCache::forget`].
    keep_unnamed: bool,
    /// The last merge's overridden entries, so an unchanged override of an unchanged
    /// entry is neither checked nor copied again (and stays the same allocation).
    overridden: HashMap<usize, Overridden>,
    /// The last merge's entries, sorted: the next merge replaces only the entries of the
    /// objects that changed instead of sorting everything again.
    combined: Option<Combined>,
}

#[derive(Debug)]
struct CachedObject {
    /// `resourceVersion` of the entries held (the last good version).
    version: CompactString,
    /// `spec.revision` of that version.
    revision: CompactString,
    /// Its validated entries, zone lists included.
    base: Vec<Arc<ServicePortPlan>>,
    /// The zone `entries` are for.
    zone: Option<String>,
    /// `base` as a node of `zone` sees it.
    entries: Vec<Arc<ServicePortPlan>>,
    /// A newer version that was refused, with why: not validated again. Boxed, like
    /// every rarely set field here: the cache has one slot per Service plan.
    refused: Option<Box<(String, PlanError)>>,
}

/// Merged entries, sorted by key, with where each came from: `(entry, object, index in
/// the object)`.
type Located = (Arc<ServicePortPlan>, Arc<str>, usize);

/// An override applied by an earlier merge.
#[derive(Debug)]
struct Overridden {
    /// `resourceVersion` of the node plan the override is in.
    version: String,
    /// The entry it was applied to.
    base: Arc<ServicePortPlan>,
    /// The entry it made.
    result: Arc<ServicePortPlan>,
}

#[derive(Debug)]
struct Combined {
    /// Every object of the merge.
    objects: HashMap<Arc<str>, MergedObject>,
    zone: Option<String>,
    entries: Vec<Located>,
    /// Sum of the objects' fingerprint parts.
    fingerprint: u64,
    /// Entries left out as duplicates, by the object they came from. While there are
    /// any, the next merge sorts everything again (so an entry left out comes back once
    /// its twin is gone).
    duplicates: Vec<(Arc<str>, PlanError)>,
}

/// What one object brought to a merge.
#[derive(Debug)]
struct MergedObject {
    /// Whether it brought entries the cache holds (its removal then finds them there).
    cached: bool,
    /// Its part of the fingerprint (0 when no entries were used).
    part: u64,
    /// Why its newest version was refused, if it was.
    refused: Option<Box<PlanError>>,
}

impl MergedObject {
    fn of(name: &str, taken: &Taken) -> Self {
        let used = taken.entries.is_some();
        Self {
            cached: used && taken.version.is_some(),
            // By content revision, not resourceVersion: an object written again
            // unchanged (a label edit, a re-apply) changes nothing to program.
            part: if used {
                crate::stable_hash(format!("{name}\0{}", taken.revision).as_bytes())
            } else {
                0
            },
            refused: taken.refused.clone().map(Box::new),
        }
    }
}

impl Combined {
    /// The refusals to report: each object's (by name), then the duplicates.
    fn refused(&self) -> Vec<PlanError> {
        let mut named: Vec<(&Arc<str>, &PlanError)> = self
            .objects
            .iter()
            .filter_map(|(name, o)| Some((name, &**o.refused.as_ref()?)))
            .collect();
        named.sort_by(|a, b| a.0.cmp(b.0));
        named
            .into_iter()
            .map(|(_, e)| e.clone())
            .chain(self.duplicates.iter().map(|(_, e)| e.clone()))
            .collect()
    }
}

/// Sort order of merged entries: by key, equal keys by object and position (so the later
/// one is the duplicate).
fn located_order(a: &Located, b: &Located) -> std::cmp::Ordering {
    a.0.key
        .cmp(&b.0.key)
        .then_with(|| a.1.cmp(&b.1))
        .then(a.2.cmp(&b.2))
}

/// `base` (sorted, without the changed objects' entries) with `fresh` (sorted) merged in,
/// and where the fresh entries went. Each fresh entry is placed by binary search, so
/// unchanged entries are moved, not compared.
fn merge_sorted(base: Vec<Located>, fresh: Vec<Located>) -> (Vec<Located>, Vec<usize>) {
    let mut positions = Vec::with_capacity(fresh.len());
    let mut start = 0;
    for entry in &fresh {
        start += base
            .get(start..)
            .unwrap_or_default()
            .partition_point(|b| located_order(b, entry).is_lt());
        positions.push(start);
    }
    let mut out = Vec::with_capacity(base.len() + fresh.len());
    let mut placed = Vec::with_capacity(fresh.len());
    let mut base = base.into_iter();
    let mut taken = 0;
    for (entry, at) in fresh.into_iter().zip(positions) {
        out.extend(base.by_ref().take(at - taken));
        taken = at;
        placed.push(out.len());
        out.push(entry);
    }
    out.extend(base);
    (out, placed)
}

/// Removes every entry whose key equals its predecessor's, looking only next to `near`
/// (every new pair has one of its members there; `None`: everywhere), and names each
/// with the object it came from.
fn drop_duplicates(
    entries: &mut Vec<Located>,
    near: Option<&[usize]>,
) -> Vec<(Arc<str>, PlanError)> {
    let duplicate = |entries: &[Located], at: usize| {
        at > 0
            && entries
                .get(at)
                .zip(entries.get(at - 1))
                .is_some_and(|(b, a)| a.0.key == b.0.key)
    };
    let mut doomed: Vec<usize> = match near {
        None => (1..entries.len())
            .filter(|&at| duplicate(entries, at))
            .collect(),
        Some(near) => near
            .iter()
            .flat_map(|&at| [at, at + 1])
            .filter(|&at| duplicate(entries, at))
            .collect(),
    };
    doomed.sort_unstable();
    doomed.dedup();
    let mut errors = Vec::new();
    for &at in doomed.iter().rev() {
        let (entry, object, index) = entries.remove(at);
        let error = PlanError::InvalidField {
            object: format!("ServiceProxyPlan/{object}"),
            field: format!("spec.servicePorts[{index}].key"),
            reason: format!("duplicate key {}: left out", entry.key),
        };
        errors.push((object, error));
    }
    errors.reverse();
    errors
}

impl MergeCache {
    /// An empty cache.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty cache that keeps an object's entries until [`MergeCache::forget`], even
    /// while a merge does not see it: for a caller that drops its own copy of the entries
    /// of objects the cache [`MergeCache::holds`].
    #[must_use]
    pub fn keeping_unnamed() -> Self {
        Self {
            keep_unnamed: true,
            ..Self::default()
        }
    }

    /// Whether it holds the validated entries of object `namespace/name` at
    /// `resource_version`: a merge then never reads that object's entries.
    #[must_use]
    pub fn holds(&self, object: &str, resource_version: &str) -> bool {
        self.objects
            .get(object)
            .is_some_and(|c| c.version == resource_version)
    }

    /// Validates `object`'s entries as a merge for a node in `zone` would and holds them,
    /// for a caller that receives objects one at a time before it can merge (an initial
    /// list): returns whether the cache now holds this version, after which the caller may
    /// drop its copy of the entries. A refused or unversioned object is left to the
    /// merge, which reports it.
    pub fn hold(&mut self, object: &ServiceProxyPlan, zone: Option<&str>) -> bool {
        let key = object_key(object);
        let taken = take_cached(self, PlanRef::Object(object), &key, zone, |object| {
            ObjectEntries::Borrowed(&object.spec.service_ports)
        });
        taken.version.is_some() && taken.refused.is_none() && taken.entries.is_some()
    }

    /// Drops what it holds of object `namespace/name`.
    pub fn forget(&mut self, object: &str) {
        self.objects.remove(object);
        if let Some(combined) = &mut self.combined {
            if let Some(gone) = combined.objects.remove(object) {
                combined.fingerprint = combined.fingerprint.wrapping_sub(gone.part);
            }
            combined.entries.retain(|l| &*l.1 != object);
        }
    }

    /// Whether [`merge_update`] can bring the last merge up to date for a node in `zone`
    /// (otherwise the caller merges everything with [`merge_cached`]).
    #[must_use]
    pub fn can_update(&self, zone: Option<&str>) -> bool {
        self.combined
            .as_ref()
            .is_some_and(|c| c.zone.as_deref() == zone && c.duplicates.is_empty())
    }

    /// How many objects it holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Whether it holds no object.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

/// `namespace/name` of a Service plan: the key the cache and errors use.
#[must_use]
pub fn object_key(object: &ServiceProxyPlan) -> String {
    format!(
        "{}/{}",
        object.metadata.namespace.as_deref().unwrap_or_default(),
        object.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A Service plan as a merge reads it: the object, or only the identity of a version
/// whose validated entries the cache [`MergeCache::holds`] (a caller holding thousands
/// of Service plans then keeps no copy of them).
#[derive(Debug, Clone, Copy)]
pub enum PlanRef<'a> {
    /// The whole object.
    Object(&'a ServiceProxyPlan),
    /// A version the cache holds.
    Held {
        /// `namespace/name`.
        key: &'a str,
        /// Its `resourceVersion`.
        version: &'a str,
        /// Its `spec.revision`.
        revision: &'a str,
    },
}

impl PlanRef<'_> {
    fn key(&self) -> String {
        match self {
            Self::Object(object) => object_key(object),
            Self::Held { key, .. } => (*key).to_owned(),
        }
    }

    fn version(&self) -> Option<&str> {
        match self {
            Self::Object(object) => object.metadata.resource_version.as_deref(),
            Self::Held { version, .. } => Some(version),
        }
    }

    fn revision(&self) -> &str {
        match self {
            Self::Object(object) => &object.spec.revision,
            Self::Held { revision, .. } => revision,
        }
    }
}

/// [`merge`], reusing (and refreshing) `cache`: only objects whose `resourceVersion`
/// changed since the cache saw them are validated and copied. Objects without a
/// `resourceVersion` (read from files) are never cached.
///
/// # Errors
/// As [`merge`].
pub fn merge_cached(
    plan: &NodeProxyPlan,
    services: &[ServiceProxyPlan],
    cache: &mut MergeCache,
) -> Result<MergedPlan, PlanError> {
    let refs: Vec<PlanRef<'_>> = services.iter().map(PlanRef::Object).collect();
    merge_refs(plan, &refs, cache)
}

/// [`merge_cached`] for a caller that keeps only the identity of the objects whose
/// entries the cache holds ([`PlanRef::Held`]).
///
/// # Errors
/// As [`merge`].
pub fn merge_refs(
    plan: &NodeProxyPlan,
    services: &[PlanRef<'_>],
    cache: &mut MergeCache,
) -> Result<MergedPlan, PlanError> {
    merge_with(plan, services, cache, |_, object| {
        ObjectEntries::Borrowed(&object.spec.service_ports)
    })
}

/// [`merge`] for a caller that has no further use for `plan` and `services`: the entries
/// are moved into the merged plan instead of copied, so the merge needs no second copy
/// of them. Same result and same errors as [`merge`].
///
/// # Errors
/// As [`merge`].
pub fn merge_owned(
    plan: NodeProxyPlan,
    mut services: Vec<ServiceProxyPlan>,
) -> Result<MergedPlan, PlanError> {
    let mut entries: Vec<Vec<ServicePortPlan>> = services
        .iter_mut()
        .map(|s| std::mem::take(&mut s.spec.service_ports))
        .collect();
    let refs: Vec<PlanRef<'_>> = services.iter().map(PlanRef::Object).collect();
    merge_with(&plan, &refs, &mut MergeCache::default(), |index, _| {
        ObjectEntries::Owned(
            entries
                .get_mut(index)
                .map(std::mem::take)
                .unwrap_or_default(),
        )
    })
}

/// An object's entries, as the merge gets them.
enum ObjectEntries<'a> {
    /// Still in the caller's object: copied into the merged plan.
    Borrowed(&'a [ServicePortPlan]),
    /// Taken from the object: moved into the merged plan.
    Owned(Vec<ServicePortPlan>),
}

impl<'a> ObjectEntries<'a> {
    fn into_entries(self) -> impl Iterator<Item = Cow<'a, ServicePortPlan>> {
        let (borrowed, owned) = match self {
            Self::Borrowed(list) => (list, Vec::new()),
            Self::Owned(list) => (&[][..], list),
        };
        borrowed
            .iter()
            .map(Cow::Borrowed)
            .chain(owned.into_iter().map(Cow::Owned))
    }
}

/// Validates one object's entries and applies the node's zone list to each.
fn take_object<'a>(
    object: &ServiceProxyPlan,
    key: &str,
    entries: ObjectEntries<'a>,
) -> Result<Vec<Arc<ServicePortPlan>>, PlanError> {
    let label = format!("ServiceProxyPlan/{key}");
    let check = Checker { object: &label };
    let namespace = object.metadata.namespace.as_deref().unwrap_or_default();
    let service = service_of(object);
    let mut out = Vec::new();
    let mut keys = HashSet::new();
    for (i, entry) in entries.into_entries().enumerate() {
        let field = || format!("spec.servicePorts[{i}]");
        check.entry(&field, &entry)?;
        if entry.namespace != namespace || entry.name != service {
            return Err(check.fail(
                &|| format!("{}.key", field()),
                &format!(
                    "{} belongs to Service {}/{}, not to this object's Service {namespace}/{service}",
                    entry.key, entry.namespace, entry.name
                ),
            ));
        }
        if !keys.insert(entry.key.clone()) {
            return Err(check.fail(
                &|| format!("{}.key", field()),
                &format!("duplicate key {}", entry.key),
            ));
        }
        out.push(Arc::new(entry.into_owned()));
    }
    Ok(out)
}

/// `base` as a node of `zone` sees it: an entry with a list for that zone takes it as
/// its `clusterEndpoints`; no merged entry keeps zone lists. Entries without zone lists
/// are shared, not copied.
fn in_zone(base: &[Arc<ServicePortPlan>], zone: Option<&str>) -> Vec<Arc<ServicePortPlan>> {
    base.iter()
        .map(|entry| {
            if entry.zone_endpoints.is_empty() {
                return Arc::clone(entry);
            }
            let mut entry = ServicePortPlan::clone(entry);
            let chosen = zone.and_then(|z| entry.zone_endpoints.iter().position(|l| l.zone == z));
            if let Some(at) = chosen {
                let list = entry.zone_endpoints.swap_remove(at);
                replace_cluster_endpoints(&mut entry, list.endpoints);
            }
            entry.zone_endpoints = Vec::new();
            Arc::new(entry)
        })
        .collect()
}

/// Gives `entry` the cluster endpoints a node's zone or node hints select. A UDP entry
/// keeps the endpoints it no longer lists in `alsoServing`: they still serve, and their
/// conntrack entries stay (kube-proxy ignores topology when it cleans up UDP flows).
fn replace_cluster_endpoints(entry: &mut ServicePortPlan, list: Vec<Endpoint>) {
    let old = std::mem::replace(&mut entry.cluster_endpoints, list);
    if entry.protocol == Protocol::UDP {
        let kept: HashSet<&Endpoint> = entry.cluster_endpoints.iter().collect();
        let dropped: Vec<Endpoint> = old.into_iter().filter(|e| !kept.contains(e)).collect();
        entry.also_serving.extend(dropped);
    }
}

/// The Service a plan object is for: its `proxyplan.dev/service` label, else its name
/// up to a part suffix (`web.1` is part 1 of `web`).
fn service_of(object: &ServiceProxyPlan) -> &str {
    object
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SERVICE_LABEL))
        .map(String::as_str)
        .or_else(|| {
            let name = object.metadata.name.as_deref()?;
            Some(name.split_once('.').map_or(name, |(base, _)| base))
        })
        .unwrap_or_default()
}

/// The entries of one object for this merge and the version they are of, from the cache
/// when it holds them. `None` for entries: nothing usable.
struct Taken {
    entries: Option<Vec<Arc<ServicePortPlan>>>,
    /// Version of the entries used; `None` when uncached (no `resourceVersion`).
    version: Option<CompactString>,
    /// The object's `spec.revision` (what identifies uncached entries).
    revision: CompactString,
    refused: Option<PlanError>,
}

fn take_cached<'a>(
    cache: &mut MergeCache,
    plan_ref: PlanRef<'a>,
    key: &str,
    zone: Option<&str>,
    entries_of: impl FnOnce(&'a ServiceProxyPlan) -> ObjectEntries<'a>,
) -> Taken {
    let revision = CompactString::from(plan_ref.revision());
    // Without the object, only a version the cache holds can be taken.
    let object = match plan_ref {
        PlanRef::Object(object) => Some(object),
        PlanRef::Held { .. } => None,
    };
    let not_held = |version: &str| Taken {
        entries: None,
        version: None,
        revision: revision.clone(),
        refused: Some(PlanError::InvalidField {
            object: format!("ServiceProxyPlan/{key}"),
            field: "metadata.resourceVersion".to_owned(),
            reason: format!("version {version} was neither kept nor held by the merge cache"),
        }),
    };
    let Some(version) = plan_ref.version() else {
        cache.objects.remove(key);
        let Some(object) = object else {
            return not_held("(none)");
        };
        return match take_object(object, key, entries_of(object)) {
            Ok(base) => Taken {
                entries: Some(in_zone(&base, zone)),
                version: None,
                revision,
                refused: None,
            },
            Err(err) => Taken {
                entries: None,
                version: None,
                revision,
                refused: Some(err),
            },
        };
    };
    // The version held, or a refused newer one: no need to look at the object.
    let known = cache.objects.get_mut(key).and_then(|c| {
        let refused = match &c.refused {
            Some(refused) if refused.0 == version => Some(refused.1.clone()),
            _ if c.version == version => None,
            _ => return None,
        };
        Some((c, refused))
    });
    if let Some((c, refused)) = known {
        if c.zone.as_deref() != zone {
            c.entries = in_zone(&c.base, zone);
            c.zone = zone.map(str::to_owned);
        }
        return Taken {
            entries: Some(c.entries.clone()),
            version: Some(c.version.clone()),
            revision: c.revision.clone(),
            refused,
        };
    }
    let Some(object) = object else {
        return not_held(version);
    };
    match take_object(object, key, entries_of(object)) {
        Ok(base) => {
            let entries = in_zone(&base, zone);
            cache.objects.insert(
                key.into(),
                CachedObject {
                    version: version.into(),
                    revision: revision.clone(),
                    base,
                    zone: zone.map(str::to_owned),
                    entries: entries.clone(),
                    refused: None,
                },
            );
            Taken {
                entries: Some(entries),
                version: Some(version.into()),
                revision,
                refused: None,
            }
        }
        Err(err) => match cache.objects.get_mut(key) {
            Some(last_good) => {
                last_good.refused = Some(Box::new((version.to_owned(), err.clone())));
                if last_good.zone.as_deref() != zone {
                    last_good.entries = in_zone(&last_good.base, zone);
                    last_good.zone = zone.map(str::to_owned);
                }
                Taken {
                    entries: Some(last_good.entries.clone()),
                    version: Some(last_good.version.clone()),
                    revision: last_good.revision.clone(),
                    refused: Some(err),
                }
            }
            None => Taken {
                entries: None,
                version: None,
                revision,
                refused: Some(err),
            },
        },
    }
}

/// The node plan's own fields, checked: its addresses.
fn check_plan(plan: &NodeProxyPlan, check: &Checker<'_>) -> Result<Vec<IpAddr>, PlanError> {
    let spec = &plan.spec;
    check.name(&"spec.nodeName", &spec.node_name, 253)?;
    for (i, cidr) in spec.pod_cidrs.iter().enumerate() {
        check.cidr(&|| format!("spec.podCIDRs[{i}]"), cidr, None)?;
    }
    for (i, cidr) in spec.local_traffic.cidrs.iter().enumerate() {
        check.cidr(&|| format!("spec.localTraffic.cidrs[{i}]"), cidr, None)?;
    }
    let by_interface = matches!(
        spec.local_traffic.mode,
        LocalTrafficMode::BridgeInterface | LocalTrafficMode::InterfaceNamePrefix
    );
    match &spec.local_traffic.interface {
        Some(name)
            if name.is_empty()
                || name.len() > 15
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) =>
        {
            return Err(check.fail(
                &"spec.localTraffic.interface",
                &format!("{name:?} is not an interface name (1 to 15 of A-Z a-z 0-9 _ . -)"),
            ));
        }
        None if by_interface => {
            return Err(check.fail(
                &"spec.localTraffic.interface",
                &format!("missing: mode {:?} needs it", spec.local_traffic.mode),
            ));
        }
        _ => {}
    }
    for (i, cidr) in spec.service_cidrs.iter().enumerate() {
        check.cidr(&|| format!("spec.serviceCIDRs[{i}]"), cidr, None)?;
    }
    let mut addresses = Vec::with_capacity(spec.addresses.len());
    for (i, address) in spec.addresses.iter().enumerate() {
        addresses.push(check.ip(&|| format!("spec.addresses[{i}]"), address, None)?);
    }
    Ok(addresses)
}

/// The merge, with the entries of an object that is not in `cache` from
/// `entries_of(position in services, object)`.
fn merge_with<'a>(
    plan: &NodeProxyPlan,
    services: &[PlanRef<'a>],
    cache: &mut MergeCache,
    mut entries_of: impl FnMut(usize, &'a ServiceProxyPlan) -> ObjectEntries<'a>,
) -> Result<MergedPlan, PlanError> {
    let plan_name = kube::ResourceExt::name_any(plan);
    let object = format!("NodeProxyPlan/{plan_name}");
    let check = Checker { object: &object };
    let addresses = check_plan(plan, &check)?;
    let zone = plan.spec.zone.as_deref();

    // Each object's entries, from the cache where it holds them. Of two objects with one
    // name, the later wins.
    let mut seen: HashMap<String, usize> = HashMap::with_capacity(services.len());
    let mut taken: Vec<(Arc<str>, Taken)> = Vec::with_capacity(services.len());
    for (position, object) in services.iter().enumerate() {
        let key = object.key();
        let result = take_cached(cache, *object, &key, zone, |object| {
            entries_of(position, object)
        });
        let name: Arc<str> = Arc::from(key.as_str());
        match seen.get(&key) {
            Some(&at) => {
                if let Some(slot) = taken.get_mut(at) {
                    *slot = (name, result);
                }
            }
            None => {
                seen.insert(key, taken.len());
                taken.push((name, result));
            }
        }
    }
    if !cache.keep_unnamed {
        cache
            .objects
            .retain(|key, _| seen.contains_key(key.as_str()));
    }
    let all_versioned = taken
        .iter()
        .all(|(_, t)| t.entries.is_none() || t.version.is_some());
    cache.combined = None;
    let mut entries: Vec<Located> = taken
        .iter()
        .flat_map(|(name, t)| located(name, t))
        .collect();
    entries.sort_by(located_order);
    let duplicates = drop_duplicates(&mut entries, None);
    let mut objects = HashMap::with_capacity(taken.len());
    let mut fingerprint = 0u64;
    for (name, t) in &taken {
        let merged = MergedObject::of(name, t);
        fingerprint = fingerprint.wrapping_add(merged.part);
        objects.insert(Arc::clone(name), merged);
    }
    let combined = Combined {
        objects,
        zone: zone.map(str::to_owned),
        entries,
        fingerprint,
        duplicates,
    };
    finish(plan, &check, cache, combined, addresses, all_versioned)
}

/// Brings the last merge up to date after the objects named in `changed`
/// (`namespace/name`) changed, appeared or went, looking each up with `lookup`: only
/// their entries are validated, removed and placed again. `None` when the last merge
/// cannot be updated ([`MergeCache::can_update`]): merge everything instead.
///
/// # Errors
/// When the node plan itself is invalid.
pub fn merge_update<'a>(
    plan: &NodeProxyPlan,
    lookup: impl Fn(&str) -> Option<PlanRef<'a>>,
    changed: &[String],
    cache: &mut MergeCache,
) -> Option<Result<MergedPlan, PlanError>> {
    let zone = plan.spec.zone.as_deref();
    if !cache.can_update(zone) {
        return None;
    }
    let plan_name = kube::ResourceExt::name_any(plan);
    let object = format!("NodeProxyPlan/{plan_name}");
    let check = Checker { object: &object };
    let addresses = match check_plan(plan, &check) {
        Ok(addresses) => addresses,
        Err(err) => return Some(Err(err)),
    };
    let mut combined = cache.combined.take()?;
    let mut fresh: Vec<Located> = Vec::new();
    let changed: std::collections::BTreeSet<&String> = changed.iter().collect();
    for key in changed {
        let Some(name) = combined
            .objects
            .get_key_value(key.as_str())
            .map(|(name, _)| Arc::clone(name))
            .or_else(|| lookup(key).map(|_| Arc::from(key.as_str())))
        else {
            continue;
        };
        // Out with what it brought before.
        if let Some(old) = combined.objects.remove(&name) {
            combined.fingerprint = combined.fingerprint.wrapping_sub(old.part);
            if old.cached
                && let Some(held) = cache.objects.get(key.as_str())
            {
                for entry in &held.entries {
                    remove_located(&mut combined.entries, &entry.key, &name);
                }
            }
        }
        // In with what it brings now.
        let Some(object) = lookup(key) else {
            if !cache.keep_unnamed {
                cache.objects.remove(key.as_str());
            }
            continue;
        };
        let taken = take_cached(cache, object, key, zone, |object| {
            ObjectEntries::Borrowed(&object.spec.service_ports)
        });
        let merged = MergedObject::of(&name, &taken);
        combined.fingerprint = combined.fingerprint.wrapping_add(merged.part);
        fresh.extend(located(&name, &taken));
        combined.objects.insert(name, merged);
    }
    fresh.sort_by(located_order);
    let (mut entries, placed) = merge_sorted(std::mem::take(&mut combined.entries), fresh);
    combined.duplicates = drop_duplicates(&mut entries, Some(&placed));
    combined.entries = entries;
    Some(finish(plan, &check, cache, combined, addresses, true))
}

/// Removes the entry `key` that `object` brought, if there is one.
fn remove_located(entries: &mut Vec<Located>, key: &str, object: &Arc<str>) {
    let start = entries.partition_point(|l| l.0.key.as_str() < key);
    let found = entries
        .get(start..)
        .unwrap_or_default()
        .iter()
        .take_while(|l| l.0.key == key)
        .position(|l| Arc::ptr_eq(&l.1, object) || *l.1 == **object);
    if let Some(offset) = found {
        entries.remove(start + offset);
    }
}

/// The merged plan of `combined` with the node overlay; keeps `combined` for the next
/// merge when every object had a `resourceVersion`.
fn finish(
    plan: &NodeProxyPlan,
    check: &Checker<'_>,
    cache: &mut MergeCache,
    combined: Combined,
    addresses: Vec<IpAddr>,
    keep: bool,
) -> Result<MergedPlan, PlanError> {
    let spec = &plan.spec;
    let mut merged: Vec<Arc<ServicePortPlan>> = combined
        .entries
        .iter()
        .map(|(e, ..)| Arc::clone(e))
        .collect();
    let refused = combined.refused();
    let services_fingerprint = combined.fingerprint;
    if keep {
        cache.combined = Some(combined);
    }
    let unmatched = apply_overlay(plan, check, cache, &mut merged)?;
    Ok(MergedPlan {
        node_name: spec.node_name.clone(),
        revision: spec.revision.clone(),
        services_fingerprint,
        addresses,
        local_traffic: spec.local_traffic.clone(),
        service_cidrs: spec.service_cidrs.clone(),
        service_ports: merged,
        refused,
        unmatched,
    })
}

/// An object's entries placed for sorting.
fn located(name: &Arc<str>, taken: &Taken) -> Vec<Located> {
    taken
        .entries
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, e)| (Arc::clone(e), Arc::clone(name), i))
        .collect()
}

/// Applies the node overlay; returns the keys it has no entry for.
fn apply_overlay(
    plan: &NodeProxyPlan,
    check: &Checker<'_>,
    cache: &mut MergeCache,
    merged: &mut [Arc<ServicePortPlan>],
) -> Result<Vec<String>, PlanError> {
    let previous = std::mem::take(&mut cache.overridden);
    let version = plan.metadata.resource_version.as_deref();
    let mut unmatched = Vec::new();
    let mut keys = HashSet::new();
    for (i, o) in plan.spec.overlay.iter().enumerate() {
        let field = || format!("spec.overlay[{i}]");
        check.key(&|| format!("{}.key", field()), &o.key)?;
        if !keys.insert(o.key.as_str()) {
            return Err(check.fail(
                &|| format!("{}.key", field()),
                &format!("duplicate key {}", o.key),
            ));
        }
        let Ok(at) = merged.binary_search_by(|e| e.key.as_str().cmp(o.key.as_str())) else {
            unmatched.push(o.key.clone());
            continue;
        };
        if let Some(version) = version
            && let Some(earlier) = previous.get(&i)
            && earlier.version == version
            && merged
                .get(at)
                .is_some_and(|e| Arc::ptr_eq(e, &earlier.base))
            && let Some(slot) = merged.get_mut(at)
        {
            *slot = Arc::clone(&earlier.result);
            cache.overridden.insert(
                i,
                Overridden {
                    version: version.to_owned(),
                    base: Arc::clone(&earlier.base),
                    result: Arc::clone(&earlier.result),
                },
            );
            continue;
        }
        let Some(slot) = merged.get_mut(at) else {
            continue;
        };
        let base = Arc::clone(slot);
        apply_override(check, &field, slot, o)?;
        if let Some(version) = version {
            cache.overridden.insert(
                i,
                Overridden {
                    version: version.to_owned(),
                    base,
                    result: Arc::clone(slot),
                },
            );
        }
    }
    Ok(unmatched)
}

fn apply_override(
    check: &Checker<'_>,
    field: &impl Field,
    entry: &mut Arc<ServicePortPlan>,
    o: &EndpointOverride,
) -> Result<(), PlanError> {
    let family = entry.family;
    if let Some(list) = &o.cluster_endpoints {
        check.endpoints(
            &|| format!("{}.clusterEndpoints", field.path()),
            list,
            family,
        )?;
    }
    if let Some(list) = &o.local_endpoints {
        check.endpoints(&|| format!("{}.localEndpoints", field.path()), list, family)?;
    }
    // Copied only now: the cached entry stays as its object has it.
    let entry = Arc::make_mut(entry);
    if let Some(list) = &o.cluster_endpoints {
        replace_cluster_endpoints(entry, list.clone());
    }
    if let Some(list) = &o.local_endpoints {
        entry.local_endpoints.clone_from(list);
        entry.local_terminating = o.local_terminating;
    }
    Ok(())
}

struct Checker<'a> {
    object: &'a str,
}

/// A field path, built only when a check fails (building paths for every endpoint of a
/// large plan would cost more than the checks themselves).
trait Field {
    fn path(&self) -> String;
}

impl Field for &str {
    fn path(&self) -> String {
        (*self).to_owned()
    }
}

impl Field for String {
    fn path(&self) -> String {
        self.clone()
    }
}

impl<F: Fn() -> String> Field for F {
    fn path(&self) -> String {
        self()
    }
}

/// Whether `text` is a DNS label as Kubernetes names (namespaces, Service and port
/// names) spell it: 1 to 63 lowercase letters, digits and `-`, starting and ending with a
/// letter or digit.
fn is_dns_label(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Why an address cannot be a VIP or an endpoint, if it cannot.
fn unusable_address(ip: IpAddr) -> Option<&'static str> {
    if ip.is_unspecified() {
        Some("the unspecified address")
    } else if ip.is_loopback() {
        Some("a loopback address")
    } else if ip.is_multicast() {
        Some("a multicast address")
    } else if match ip {
        IpAddr::V4(v4) => v4.is_link_local() || v4.is_broadcast(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    } {
        Some("a link-local or broadcast address")
    } else {
        None
    }
}

impl Checker<'_> {
    fn fail(&self, field: &impl Field, reason: &str) -> PlanError {
        PlanError::InvalidField {
            object: self.object.to_owned(),
            field: field.path(),
            reason: reason.to_owned(),
        }
    }

    fn ip(
        &self,
        field: &impl Field,
        text: &str,
        family: Option<IpFamily>,
    ) -> Result<IpAddr, PlanError> {
        let ip: IpAddr = text
            .parse()
            .map_err(|_| self.fail(field, &format!("{text:?} is not an IP address")))?;
        if let Some(family) = family
            && family_of(ip) != family
        {
            return Err(self.fail(field, &format!("{text} is not an {family} address")));
        }
        Ok(ip)
    }

    /// An address traffic may be captured at or sent to.
    fn usable_ip(
        &self,
        field: &impl Field,
        text: &str,
        family: IpFamily,
    ) -> Result<IpAddr, PlanError> {
        let ip = self.ip(field, text, Some(family))?;
        match unusable_address(ip) {
            Some(why) => Err(self.fail(field, &format!("{text} is {why}"))),
            None => Ok(ip),
        }
    }

    fn cidr(
        &self,
        field: &impl Field,
        text: &str,
        family: Option<IpFamily>,
    ) -> Result<(), PlanError> {
        let bad = || self.fail(field, &format!("{text:?} is not a CIDR"));
        let (ip, len) = text.split_once('/').ok_or_else(bad)?;
        let ip = self.ip(field, ip, family)?;
        let len: u8 = len.parse().map_err(|_| bad())?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        if len > max {
            return Err(bad());
        }
        Ok(())
    }

    fn port(&self, field: &impl Field, port: u16) -> Result<(), PlanError> {
        if port == 0 {
            return Err(self.fail(field, "port must be between 1 and 65535"));
        }
        Ok(())
    }

    /// A Kubernetes object name: printable, no quotes or white space, at most `max` bytes.
    fn name(&self, field: &impl Field, text: &str, max: usize) -> Result<(), PlanError> {
        let ok = !text.is_empty()
            && text.len() <= max
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
        if ok {
            Ok(())
        } else {
            Err(self.fail(
                field,
                &format!(
                    "{text:?} is not a Kubernetes name (1 to {max} letters, digits, '-', '.', '_')"
                ),
            ))
        }
    }

    /// An entry key as the controller writes it: `namespace/name:port/PROTOCOL/family`
    /// of DNS labels.
    fn key(&self, field: &impl Field, key: &str) -> Result<(), PlanError> {
        let parsed = key.split_once('/').and_then(|(namespace, rest)| {
            let (name, rest) = rest.split_once(':')?;
            let (port, rest) = rest.split_once('/')?;
            let (protocol, family) = rest.split_once('/')?;
            let port_ok = port.is_empty() || is_dns_label(port);
            (is_dns_label(namespace)
                && is_dns_label(name)
                && port_ok
                && matches!(protocol, "TCP" | "UDP" | "SCTP")
                && matches!(family, "IPv4" | "IPv6"))
            .then_some(())
        });
        if parsed.is_some() {
            Ok(())
        } else {
            Err(self.fail(
                field,
                &format!(
                    "{key:?} is not a service port key (namespace/name:port/PROTOCOL/family of \
                     DNS labels)"
                ),
            ))
        }
    }

    fn endpoints(
        &self,
        field: &impl Field,
        list: &[Endpoint],
        family: IpFamily,
    ) -> Result<(), PlanError> {
        let mut seen = HashSet::with_capacity(list.len());
        for (i, ep) in list.iter().enumerate() {
            self.usable_ip(&|| format!("{}[{i}].ip", field.path()), &ep.ip, family)?;
            self.port(&|| format!("{}[{i}].port", field.path()), ep.port)?;
            if !seen.insert(ep) {
                return Err(self.fail(
                    &|| format!("{}[{i}]", field.path()),
                    &format!("duplicate endpoint {}:{}", ep.ip, ep.port),
                ));
            }
        }
        Ok(())
    }

    fn entry(&self, field: &impl Field, e: &ServicePortPlan) -> Result<(), PlanError> {
        let at = |sub: &'static str| move || format!("{}.{sub}", field.path());
        self.key(&at("key"), &e.key)?;
        let expected = format!(
            "{}/{}:{}/{}/{}",
            e.namespace, e.name, e.port_name, e.protocol, e.family
        );
        if e.key != expected {
            return Err(self.fail(
                &at("key"),
                &format!(
                    "{:?} does not match the entry's namespace, name, portName, protocol and \
                     family ({expected:?})",
                    e.key
                ),
            ));
        }
        self.port(&at("port"), e.port)?;
        if let Some(p) = e.node_port {
            self.port(&at("nodePort"), p)?;
        }
        if let Some(p) = e.health_check_node_port {
            self.port(&at("healthCheckNodePort"), p)?;
        }
        self.usable_ip(&at("clusterIP"), &e.cluster_ip, e.family)?;
        for (i, ip) in e.external_ips.iter().enumerate() {
            self.usable_ip(
                &|| format!("{}.externalIPs[{i}]", field.path()),
                ip,
                e.family,
            )?;
        }
        for (i, lb) in e.load_balancer_ips.iter().enumerate() {
            self.usable_ip(
                &|| format!("{}.loadBalancerIPs[{i}].ip", field.path()),
                &lb.ip,
                e.family,
            )?;
        }
        for (i, r) in e.load_balancer_source_ranges.iter().enumerate() {
            self.cidr(
                &|| format!("{}.loadBalancerSourceRanges[{i}]", field.path()),
                r,
                Some(e.family),
            )?;
        }
        if let Some(a) = e.session_affinity
            && !(1..=86_400).contains(&a.timeout_seconds)
        {
            return Err(self.fail(
                &at("sessionAffinity.timeoutSeconds"),
                "must be between 1 and 86400",
            ));
        }
        self.endpoints(&at("clusterEndpoints"), &e.cluster_endpoints, e.family)?;
        let mut zones = HashSet::new();
        for (z, list) in e.zone_endpoints.iter().enumerate() {
            let path = || format!("{}.zoneEndpoints[{z}]", field.path());
            if list.zone.is_empty() || !zones.insert(list.zone.as_str()) {
                return Err(self.fail(
                    &|| format!("{}.zone", path()),
                    &format!("{:?}: empty or listed twice", list.zone),
                ));
            }
            self.endpoints(
                &|| format!("{}.endpoints", path()),
                &list.endpoints,
                e.family,
            )?;
        }
        self.endpoints(&at("alsoServing"), &e.also_serving, e.family)?;
        self.endpoints(&at("localEndpoints"), &e.local_endpoints, e.family)
    }
}

fn family_of(ip: IpAddr) -> IpFamily {
    if ip.is_ipv4() {
        IpFamily::IPv4
    } else {
        IpFamily::IPv6
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        for good in ["a", "web", "web-1", "0abc", "a-b-c"] {
            assert!(is_dns_label(good), "{good}");
        }
        let long = "a".repeat(64);
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a_b",
            "a.b",
            "a\"b",
            "a\nb",
            long.as_str(),
        ] {
            assert!(!is_dns_label(bad), "{bad:?}");
        }
    }

    #[test]
    fn unusable_addresses() {
        for bad in [
            "0.0.0.0",
            "127.0.0.1",
            "169.254.1.1",
            "224.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fe80::1",
            "ff02::1",
        ] {
            let ip: IpAddr = bad.parse().expect("an address");
            assert!(unusable_address(ip).is_some(), "{bad}");
        }
        for good in ["10.96.0.1", "192.0.2.1", "fd00::1", "2001:db8::1"] {
            let ip: IpAddr = good.parse().expect("an address");
            assert_eq!(unusable_address(ip), None, "{good}");
        }
    }
}

#[cfg(test)]
mod primary_tests {
    use super::*;

    #[test]
    fn the_first_non_loopback_address_of_each_family() {
        let ips = |s: &[&str]| -> Vec<IpAddr> { s.iter().map(|a| a.parse().unwrap()).collect() };
        assert_eq!(
            primary_addresses(&ips(&[
                "127.0.0.1",
                "10.0.0.5",
                "fd00::5",
                "10.0.0.6",
                "203.0.113.9"
            ])),
            ips(&["10.0.0.5", "fd00::5"])
        );
        assert_eq!(primary_addresses(&ips(&["::1"])), Vec::<IpAddr>::new());
    }
}
