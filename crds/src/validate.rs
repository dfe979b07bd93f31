//! Validation and merging of a node plan with its shards: the contract between the
//! controller, which writes plans, and the agent, which must refuse a bad plan whole.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use crate::{
    Endpoint, EndpointOverride, IpFamily, LocalTrafficDetection, NodeProxyPlan, ProxyPlanShard,
    ServicePortPlan, ShardScope,
};

/// Why a plan cannot be used. Each variant names the object and the field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    /// A field holds a value the agent cannot program.
    #[error("{object}: {field}: {reason}")]
    InvalidField {
        /// `NodeProxyPlan/<name>` or `ProxyPlanShard/<name>`.
        object: String,
        /// JSON path of the field, e.g. `spec.servicePorts[3].clusterIP`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The plan names a shard that is not available.
    #[error("NodeProxyPlan/{plan}: spec.shards[{index}].name: shard {shard} not found")]
    MissingShard {
        /// The plan's name.
        plan: String,
        /// Index in `spec.shards`.
        index: usize,
        /// The missing shard's name.
        shard: String,
    },
}

impl PlanError {
    /// A short stable label for metrics.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::InvalidField { .. } => "invalid_field",
            Self::MissingShard { .. } => "missing_shard",
        }
    }
}

/// A node's plan with every layer merged: what the agent programs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergedPlan {
    /// The node's name.
    pub node_name: String,
    /// The node plan's revision.
    pub revision: String,
    /// Revision of each merged shard, by name.
    pub shard_revisions: BTreeMap<String, String>,
    /// The node's addresses.
    pub addresses: Vec<IpAddr>,
    /// Local-traffic detection.
    pub local_traffic: LocalTrafficDetection,
    /// Every service port entry, overlays applied, sorted by key. Shared: an entry that
    /// did not change since an earlier merge with the same [`MergeCache`] is the same
    /// allocation.
    pub service_ports: Vec<Arc<ServicePortPlan>>,
}

/// Validates `plan` and the `shards` it names, and merges them: node overlay over zone
/// shard over cluster shard, by key. Shards the plan does not name are ignored.
///
/// # Errors
/// The first problem found, naming the object and field.
pub fn merge(plan: &NodeProxyPlan, shards: &[ProxyPlanShard]) -> Result<MergedPlan, PlanError> {
    merge_cached(plan, shards, &mut MergeCache::default())
}

/// The validated entries of cluster shards from earlier merges, by shard name and
/// `resourceVersion`: a shard seen again unchanged is neither validated nor copied again,
/// and its entries are shared (one [`Arc`] each) with the earlier merged plans, so a
/// consumer can tell unchanged entries by pointer.
#[derive(Debug, Default)]
pub struct MergeCache {
    shards: HashMap<String, CachedShard>,
    /// Whether shards a plan no longer names stay until [`MergeCache::forget`].
    keep_unnamed: bool,
    /// The last merge's overridden entries, so an unchanged override of an unchanged
    /// entry is neither checked nor copied again (and stays the same allocation).
    overridden: HashMap<(String, usize), Overridden>,
    /// The last merge's cluster entries, sorted: the next merge replaces only the
    /// entries of the shards that changed instead of sorting everything again.
    combined: Option<Combined>,
}

/// Cluster entries of a merge, sorted by key and then shard order, with where each came
/// from: `(entry, index in spec.shards, index in the shard)`.
type Located = (Arc<ServicePortPlan>, usize, usize);

/// An override applied by an earlier merge.
#[derive(Debug)]
struct Overridden {
    /// `resourceVersion` of the object the override is in.
    version: String,
    /// The entry it was applied to.
    base: Arc<ServicePortPlan>,
    /// The entry it made.
    result: Arc<ServicePortPlan>,
}

#[derive(Debug)]
struct Combined {
    /// The cluster shards merged: `(index in spec.shards, name, resourceVersion)`.
    shards: Vec<(usize, String, String)>,
    entries: Vec<Located>,
}

/// Sort order of merged cluster entries: by key, equal keys in shard order (so the later
/// one is the duplicate).
fn located_order(a: &Located, b: &Located) -> std::cmp::Ordering {
    a.0.key
        .cmp(&b.0.key)
        .then(a.1.cmp(&b.1))
        .then(a.2.cmp(&b.2))
}

/// `base` (sorted, without the changed shards' entries) with `fresh` (sorted) merged in,
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

/// The first two neighbours with the same key, looking only at `near` (every pair
/// with the same key has one of them; `None`: every pair).
fn first_duplicate<'a>(entries: &'a [Located], near: Option<&[usize]>) -> Option<&'a [Located]> {
    let same = |at: usize| {
        entries
            .get(at..at + 2)
            .filter(|w| matches!(w, [a, b] if a.0.key == b.0.key))
    };
    match near {
        None => entries
            .windows(2)
            .find(|w| matches!(w, [a, b] if a.0.key == b.0.key)),
        Some(near) => near
            .iter()
            .flat_map(|&at| [at.checked_sub(1), Some(at)])
            .flatten()
            .filter_map(|at| same(at).map(|w| (at, w)))
            .min_by_key(|(at, _)| *at)
            .map(|(_, w)| w),
    }
}

#[derive(Debug)]
struct CachedShard {
    resource_version: String,
    entries: Vec<Arc<ServicePortPlan>>,
}

impl MergeCache {
    /// An empty cache.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty cache that keeps a shard's entries until [`MergeCache::forget`], even
    /// while no plan names it: for a caller that drops its own copy of the entries of
    /// shards the cache [`MergeCache::holds`].
    #[must_use]
    pub fn keeping_unnamed() -> Self {
        Self {
            keep_unnamed: true,
            ..Self::default()
        }
    }

    /// Whether it holds the validated entries of shard `name` at `resource_version`: a
    /// merge then never reads that object's entries.
    #[must_use]
    pub fn holds(&self, name: &str, resource_version: &str) -> bool {
        self.shards
            .get(name)
            .is_some_and(|c| c.resource_version == resource_version)
    }

    /// Drops what it holds of shard `name`.
    pub fn forget(&mut self, name: &str) {
        self.shards.remove(name);
        self.combined = None;
    }

    /// How many shards it holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// Whether it holds no shard.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }
}

/// [`merge`], reusing (and refreshing) `cache`: only cluster shards whose
/// `resourceVersion` changed since the cache saw them are validated and copied. Objects
/// without a `resourceVersion` (read from files) are never cached.
///
/// # Errors
/// As [`merge`].
pub fn merge_cached(
    plan: &NodeProxyPlan,
    shards: &[ProxyPlanShard],
    cache: &mut MergeCache,
) -> Result<MergedPlan, PlanError> {
    merge_with(plan, shards, cache, |_, shard| {
        ShardEntries::Borrowed(&shard.spec.service_ports)
    })
}

/// [`merge`] for a caller that has no further use for `plan` and `shards`: the cluster
/// shards' entries are moved into the merged plan instead of copied, so the merge needs
/// no second copy of them. Same result and same errors as [`merge`].
///
/// # Errors
/// As [`merge`].
pub fn merge_owned(
    plan: NodeProxyPlan,
    mut shards: Vec<ProxyPlanShard>,
) -> Result<MergedPlan, PlanError> {
    let mut named = HashSet::with_capacity(plan.spec.shards.len());
    if !plan
        .spec
        .shards
        .iter()
        .all(|r| named.insert(r.name.as_str()))
    {
        // A shard named twice is merged twice (and refused if it has entries): only the
        // copying merge can see its entries a second time.
        return merge(&plan, &shards);
    }
    let mut entries: Vec<Vec<ServicePortPlan>> = shards
        .iter_mut()
        .map(|s| std::mem::take(&mut s.spec.service_ports))
        .collect();
    merge_with(&plan, &shards, &mut MergeCache::default(), |index, _| {
        ShardEntries::Owned(
            entries
                .get_mut(index)
                .map(std::mem::take)
                .unwrap_or_default(),
        )
    })
}

/// A cluster shard's entries, as the merge gets them.
enum ShardEntries<'a> {
    /// Still in the caller's shard: copied into the merged plan.
    Borrowed(&'a [ServicePortPlan]),
    /// Taken from the shard: moved into the merged plan.
    Owned(Vec<ServicePortPlan>),
}

impl<'a> ShardEntries<'a> {
    fn len(&self) -> usize {
        match self {
            Self::Borrowed(list) => list.len(),
            Self::Owned(list) => list.len(),
        }
    }

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

/// The merge, with the entries of a cluster shard that is not in `cache` from
/// `entries_of(position in shards, shard)`.
fn merge_with<'a>(
    plan: &NodeProxyPlan,
    shards: &'a [ProxyPlanShard],
    cache: &mut MergeCache,
    mut entries_of: impl FnMut(usize, &'a ProxyPlanShard) -> ShardEntries<'a>,
) -> Result<MergedPlan, PlanError> {
    let plan_name = kube::ResourceExt::name_any(plan);
    let object = format!("NodeProxyPlan/{plan_name}");
    let spec = &plan.spec;
    let check = Checker { object: &object };
    if spec.node_name.is_empty() {
        return Err(check.fail(&"spec.nodeName", "must not be empty"));
    }
    for (i, cidr) in spec.pod_cidrs.iter().enumerate() {
        check.cidr(&|| format!("spec.podCIDRs[{i}]"), cidr, None)?;
    }
    for (i, cidr) in spec.local_traffic.cidrs.iter().enumerate() {
        check.cidr(&|| format!("spec.localTraffic.cidrs[{i}]"), cidr, None)?;
    }
    let mut addresses = Vec::with_capacity(spec.addresses.len());
    for (i, address) in spec.addresses.iter().enumerate() {
        addresses.push(check.ip(&|| format!("spec.addresses[{i}]"), address, None)?);
    }

    // By name, the last of a name wins.
    let by_name: HashMap<String, (usize, &ProxyPlanShard)> = shards
        .iter()
        .enumerate()
        .map(|(position, s)| (kube::ResourceExt::name_any(s), (position, s)))
        .collect();
    let mut zone_overrides = Vec::new();
    let mut shard_revisions = BTreeMap::new();
    let mut used = HashSet::new();
    // Cluster shards in order: (index in spec.shards, name, resourceVersion).
    let mut cluster: Vec<(usize, &str, Option<&str>)> = Vec::new();
    // Entries of cluster shards that have no resourceVersion (never cached).
    let mut uncached: HashMap<usize, Vec<Arc<ServicePortPlan>>> = HashMap::new();
    for (index, shard_ref) in spec.shards.iter().enumerate() {
        let Some(&(position, shard)) = by_name.get(&shard_ref.name) else {
            return Err(PlanError::MissingShard {
                plan: plan_name,
                index,
                shard: shard_ref.name.clone(),
            });
        };
        let shard_object = format!("ProxyPlanShard/{}", shard_ref.name);
        let shard_check = Checker {
            object: &shard_object,
        };
        match shard.spec.scope {
            ShardScope::Cluster => {
                used.insert(shard_ref.name.as_str());
                let version = shard.metadata.resource_version.as_deref();
                cluster.push((index, shard_ref.name.as_str(), version));
                let cached = cache
                    .shards
                    .get(&shard_ref.name)
                    .is_some_and(|c| Some(c.resource_version.as_str()) == version);
                if !cached {
                    let list = entries_of(position, shard);
                    let mut fresh = Vec::with_capacity(list.len());
                    for (i, entry) in list.into_entries().enumerate() {
                        shard_check.entry(&|| format!("spec.servicePorts[{i}]"), &entry)?;
                        fresh.push(Arc::new(entry.into_owned()));
                    }
                    match version {
                        Some(version) => {
                            cache.shards.insert(
                                shard_ref.name.clone(),
                                CachedShard {
                                    resource_version: version.to_owned(),
                                    entries: fresh,
                                },
                            );
                        }
                        None => {
                            cache.shards.remove(&shard_ref.name);
                            uncached.insert(index, fresh);
                        }
                    }
                }
            }
            ShardScope::Zone => {
                if shard.spec.zone != spec.zone {
                    return Err(shard_check.fail(
                        &"spec.zone",
                        &format!(
                            "zone {:?} does not match the node's zone {:?}",
                            shard.spec.zone, spec.zone
                        ),
                    ));
                }
                let version = shard.metadata.resource_version.as_deref();
                for (i, o) in shard.spec.overrides.iter().enumerate() {
                    zone_overrides.push((shard_object.clone(), version, i, o));
                }
            }
        }
        shard_revisions.insert(shard_ref.name.clone(), shard.spec.revision.clone());
    }
    if !cache.keep_unnamed {
        cache.shards.retain(|name, _| used.contains(name.as_str()));
    }
    let located =
        |index: usize, name: &str, uncached: &mut HashMap<usize, Vec<Arc<ServicePortPlan>>>| {
            let list = match uncached.remove(&index) {
                Some(list) => list,
                None => cache
                    .shards
                    .get(name)
                    .map(|c| c.entries.clone())
                    .unwrap_or_default(),
            };
            list.into_iter()
                .enumerate()
                .map(move |(i, e)| (e, index, i))
                .collect::<Vec<Located>>()
        };
    // The same cluster shards as the last merge: only the changed ones' entries are
    // replaced, the rest stay sorted. Otherwise every entry is sorted.
    let previous = cache.combined.take();
    let reusable = previous.filter(|p| {
        p.shards.len() == cluster.len()
            && p.shards
                .iter()
                .zip(&cluster)
                .all(|((i, name, _), (index, now, version))| {
                    i == index && name == now && version.is_some()
                })
    });
    let (entries, placed): (Vec<Located>, Option<Vec<usize>>) = match reusable {
        Some(previous) => {
            let changed: HashSet<usize> = previous
                .shards
                .iter()
                .zip(&cluster)
                .filter(|((_, _, was), (_, _, now))| Some(was.as_str()) != *now)
                .map(|(_, (index, ..))| *index)
                .collect();
            let mut base = previous.entries;
            base.retain(|(_, index, _)| !changed.contains(index));
            let mut fresh = Vec::new();
            for &(index, name, _) in cluster.iter().filter(|(i, ..)| changed.contains(i)) {
                fresh.extend(located(index, name, &mut uncached));
            }
            fresh.sort_by(located_order);
            let (entries, placed) = merge_sorted(base, fresh);
            (entries, Some(placed))
        }
        None => {
            let mut all = Vec::new();
            for &(index, name, _) in &cluster {
                all.extend(located(index, name, &mut uncached));
            }
            all.sort_by(located_order);
            (all, None)
        }
    };
    // Sorted by key, equal keys in shard order: the later one is the duplicate. The
    // entries kept from the last merge had none among themselves.
    if let Some([_, (entry, shard, i)]) = first_duplicate(&entries, placed.as_deref()) {
        let name = spec.shards.get(*shard).map_or("", |s| s.name.as_str());
        return Err(PlanError::InvalidField {
            object: format!("ProxyPlanShard/{name}"),
            field: format!("spec.servicePorts[{i}].key"),
            reason: format!("duplicate key {}", entry.key),
        });
    }
    let mut merged: Vec<Arc<ServicePortPlan>> =
        entries.iter().map(|(e, ..)| Arc::clone(e)).collect();
    if cluster.iter().all(|(_, _, version)| version.is_some()) {
        cache.combined = Some(Combined {
            shards: cluster
                .iter()
                .map(|&(index, name, version)| {
                    (
                        index,
                        name.to_owned(),
                        version.unwrap_or_default().to_owned(),
                    )
                })
                .collect(),
            entries,
        });
    }
    let previous = std::mem::take(&mut cache.overridden);
    let mut apply = |object: &str,
                     version: Option<&str>,
                     field: &dyn Fn() -> String,
                     i: usize,
                     o: &EndpointOverride|
     -> Result<(), PlanError> {
        let check = Checker { object };
        let found = merged.binary_search_by(|e| e.key.as_str().cmp(o.key.as_str()));
        let (Some(version), Ok(at)) = (version, found) else {
            return apply_override(&check, &field, &mut merged, o);
        };
        let id = (object.to_owned(), i);
        if let Some(earlier) = previous.get(&id)
            && earlier.version == version
            && merged
                .get(at)
                .is_some_and(|e| Arc::ptr_eq(e, &earlier.base))
            && let Some(slot) = merged.get_mut(at)
        {
            *slot = Arc::clone(&earlier.result);
            cache.overridden.insert(
                id,
                Overridden {
                    version: version.to_owned(),
                    base: Arc::clone(&earlier.base),
                    result: Arc::clone(&earlier.result),
                },
            );
            return Ok(());
        }
        let Some(base) = merged.get(at).map(Arc::clone) else {
            return apply_override(&check, &field, &mut merged, o);
        };
        apply_override(&check, &field, &mut merged, o)?;
        if let Some(result) = merged.get(at) {
            cache.overridden.insert(
                id,
                Overridden {
                    version: version.to_owned(),
                    base,
                    result: Arc::clone(result),
                },
            );
        }
        Ok(())
    };
    for (object, version, i, o) in zone_overrides {
        apply(&object, version, &|| format!("spec.overrides[{i}]"), i, o)?;
    }
    let plan_version = plan.metadata.resource_version.as_deref();
    for (i, o) in spec.overlay.iter().enumerate() {
        apply(
            &object,
            plan_version,
            &|| format!("spec.overlay[{i}]"),
            i,
            o,
        )?;
    }
    Ok(MergedPlan {
        node_name: spec.node_name.clone(),
        revision: spec.revision.clone(),
        shard_revisions,
        addresses,
        local_traffic: spec.local_traffic.clone(),
        service_ports: merged,
    })
}

fn apply_override(
    check: &Checker<'_>,
    field: &impl Field,
    entries: &mut [Arc<ServicePortPlan>],
    o: &EndpointOverride,
) -> Result<(), PlanError> {
    let found = entries.binary_search_by(|e| e.key.as_str().cmp(o.key.as_str()));
    let Some(entry) = found.ok().and_then(|i| entries.get_mut(i)) else {
        return Err(check.fail(
            &|| format!("{}.key", field.path()),
            &format!("no service port {}", o.key),
        ));
    };
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
    // Copied only now: the cached entry stays as the shard has it.
    let entry = Arc::make_mut(entry);
    if let Some(list) = &o.cluster_endpoints {
        entry.cluster_endpoints.clone_from(list);
    }
    if let Some(list) = &o.local_endpoints {
        entry.local_endpoints.clone_from(list);
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

    fn endpoints(
        &self,
        field: &impl Field,
        list: &[Endpoint],
        family: IpFamily,
    ) -> Result<(), PlanError> {
        let mut seen = HashSet::with_capacity(list.len());
        for (i, ep) in list.iter().enumerate() {
            self.ip(
                &|| format!("{}[{i}].ip", field.path()),
                &ep.ip,
                Some(family),
            )?;
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
        if e.key.is_empty() {
            return Err(self.fail(&at("key"), "must not be empty"));
        }
        self.port(&at("port"), e.port)?;
        if let Some(p) = e.node_port {
            self.port(&at("nodePort"), p)?;
        }
        if let Some(p) = e.health_check_node_port {
            self.port(&at("healthCheckNodePort"), p)?;
        }
        self.ip(&at("clusterIP"), &e.cluster_ip, Some(e.family))?;
        for (i, ip) in e.external_ips.iter().enumerate() {
            self.ip(
                &|| format!("{}.externalIPs[{i}]", field.path()),
                ip,
                Some(e.family),
            )?;
        }
        for (i, lb) in e.load_balancer_ips.iter().enumerate() {
            self.ip(
                &|| format!("{}.loadBalancerIPs[{i}].ip", field.path()),
                &lb.ip,
                Some(e.family),
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
