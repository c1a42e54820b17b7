//! The allocator itself: the slices and classes it works over, what is already allocated, and
//! its caches (device facts, class outcomes, compiled selectors). The search (`search`) and the
//! explanation (`explain`) are its entry points.
use super::facts::{CounterRefs, DeviceCache};
use super::types::{Counters, DeviceId, FastMap, FastSet, SimNode};
use crate::cel::{self, Cache, value::quantity::Quantity};
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim, ResourceSlice};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// State of already-allocated claims, as the scheduler derives it. Built with
/// [`AllocatedState::from_claims`] and grown with [`AllocatedState::add`], which keep an index of
/// the pools and devices in use, so that a node with nothing allocated costs no lookups.
#[derive(Default, Clone)]
pub struct AllocatedState {
    pub devices: HashSet<DeviceId>,
    pub shared: HashSet<DeviceId>,
    pub capacity: HashMap<DeviceId, BTreeMap<String, Quantity>>,
    /// hashes of (driver, pool) and of (driver, pool, device) of everything in `devices` and
    /// `shared`: looked up without building the owned id (three strings) per device checked
    index: FastSet<u64>,
    /// `devices.len() + shared.len()` when `index` was last updated: if the sets were changed
    /// directly since, the index is not trusted
    indexed: usize,
}

impl AllocatedState {
    pub fn from_claims<'a>(claims: impl IntoIterator<Item = &'a ResourceClaim>) -> Self {
        let mut s = AllocatedState::default();
        for c in claims {
            if let Some(a) = c.status.as_ref().and_then(|st| st.allocation.as_ref()) {
                s.add(a);
            }
        }
        s
    }

    /// Counts one more allocation as in use (what a scheduler does when it assumes a claim), so
    /// that a run over many pods updates the state in place instead of rebuilding it.
    pub fn add(&mut self, allocation: &AllocationResult) {
        let results = allocation.devices.as_ref().and_then(|d| d.results.as_ref());
        for r in results.into_iter().flatten() {
            if r.admin_access == Some(true) {
                continue;
            }
            self.index_id(&r.driver, &r.pool, &r.device);
            let id = (r.driver.clone(), r.pool.clone(), r.device.clone());
            if r.share_id.is_some() {
                self.shared.insert(id.clone());
                let agg = self.capacity.entry(id).or_default();
                for (k, v) in r.consumed_capacity.iter().flatten() {
                    if let Ok(q) = Quantity::parse(&v.0) {
                        let e = agg.entry(k.clone()).or_insert(Quantity::ZERO);
                        *e = e.add(&q).unwrap_or(*e);
                    }
                }
            } else {
                self.devices.insert(id);
            }
        }
        self.indexed = self.devices.len() + self.shared.len();
    }

    fn index_id(&mut self, driver: &str, pool: &str, device: &str) {
        self.index.insert(id_hash(driver, pool, None));
        self.index.insert(id_hash(driver, pool, Some(device)));
    }

    fn index_trusted(&self) -> bool {
        self.indexed == self.devices.len() + self.shared.len()
    }

    /// Whether a device of the pool may be allocated or shared (false: certainly none is).
    pub(super) fn pool_maybe_used(&self, driver: &str, pool: &str) -> bool {
        if self.devices.is_empty() && self.shared.is_empty() {
            return false;
        }
        !self.index_trusted() || self.index.contains(&id_hash(driver, pool, None))
    }

    /// Whether the device may be allocated or shared (false: certainly not).
    pub(super) fn maybe_used(&self, driver: &str, pool: &str, device: &str) -> bool {
        if self.devices.is_empty() && self.shared.is_empty() {
            return false;
        }
        !self.index_trusted() || self.index.contains(&id_hash(driver, pool, Some(device)))
    }
}

/// A hash of a pool's or a device's id; the separators keep ("a", "bc") apart from ("ab", "c").
pub(super) fn id_hash(driver: &str, pool: &str, device: Option<&str>) -> u64 {
    use std::hash::{Hash, Hasher};
    // SipHash with fixed keys: strings hash well, and the same on every run
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (driver, pool, device).hash(&mut h);
    h.finish()
}

/// One allocator over a fixed set of slices and classes, reusable for many nodes (like the
/// scheduler's per-cycle allocator). CEL device values and compiled selectors are cached.
pub struct Allocator<'a> {
    pub classes: HashMap<String, &'a DeviceClass>,
    pub slices: &'a [ResourceSlice],
    slices_on_node: HashMap<&'a str, Vec<usize>>,
    slices_shared: Vec<usize>,
    pub allocated: AllocatedState,
    pub cel: Cache,
    cache: Arc<DeviceCache>,
    /// compiled selectors by the expression's address (claims and classes outlive the allocator),
    /// so that the text is hashed once per selector rather than per device or node
    pub(super) programs: std::cell::RefCell<FastMap<(usize, usize), CompiledSelector>>,
}

type CompiledSelector = Arc<Result<cel::Program, String>>;

impl<'a> Allocator<'a> {
    pub fn new(
        classes: &'a [DeviceClass],
        slices: &'a [ResourceSlice],
        allocated: AllocatedState,
    ) -> Self {
        let cache = Arc::new(DeviceCache::new(slices));
        Self::with_cache(classes, slices, allocated, cache)
    }

    /// Like [`Allocator::new`], reusing per-device data (see [`DeviceCache`]) built for exactly
    /// these slices and classes.
    pub fn with_cache(
        classes: &'a [DeviceClass],
        slices: &'a [ResourceSlice],
        allocated: AllocatedState,
        cache: Arc<DeviceCache>,
    ) -> Self {
        assert_eq!(
            cache.class_ok.len(),
            slices.len(),
            "cache built for other slices"
        );
        let mut on_node: HashMap<&str, Vec<usize>> = HashMap::new();
        let mut shared = Vec::new();
        for (i, s) in slices.iter().enumerate() {
            match s.spec.node_name.as_deref() {
                Some(n) if !n.is_empty() => on_node.entry(n).or_default().push(i),
                _ => shared.push(i),
            }
        }
        Allocator {
            classes: classes
                .iter()
                .filter_map(|c| c.metadata.name.as_deref().map(|n| (n.to_string(), c)))
                .collect(),
            slices,
            slices_on_node: on_node,
            slices_shared: shared,
            allocated,
            cel: Cache::default(),
            cache,
            programs: Default::default(),
        }
    }

    /// Node names that have node-local slices, sorted.
    pub fn node_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.slices_on_node.keys().map(|s| s.to_string()).collect();
        v.sort();
        v
    }

    /// The slices that may hold devices for `node`: its node-local slices, then every slice not
    /// bound to one node by name.
    pub(super) fn slices_for_node(&self, node: &SimNode) -> Vec<usize> {
        let mut slices_for_node: Vec<usize> = self
            .slices_on_node
            .get(node.name.as_str())
            .cloned()
            .unwrap_or_default();
        slices_for_node.extend(self.slices_shared.iter().copied());
        slices_for_node
    }

    /// The device as selectors read it, or the error converting it to a CEL value gives.
    pub(crate) fn raw_device(
        &self,
        slice_idx: usize,
        dev_idx: usize,
    ) -> Result<cel::RawDevice<'a>, &String> {
        let s = &self.slices[slice_idx];
        let d = &s.spec.devices.as_ref().expect("device index")[dev_idx];
        let raw = cel::RawDevice::of(&s.spec.driver, d);
        match self
            .cache
            .facts
            .check(self.slices, slice_idx, dev_idx, || raw)
        {
            Ok(()) => Ok(raw),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn cache_counters(&self, slice_idx: usize) -> &Counters {
        self.cache.facts.counters(self.slices, slice_idx)
    }

    pub(crate) fn cache_counter_refs(&self, slice_idx: usize) -> &CounterRefs {
        self.cache.facts.counter_refs(self.slices, slice_idx)
    }

    pub(crate) fn cache_dup_name_across(&self, device_slices: &[usize]) -> Option<String> {
        self.cache.facts.dup_name_across(self.slices, device_slices)
    }

    pub(crate) fn cache_dup_name(&self, slice_idx: usize) -> Option<&str> {
        self.cache.facts.dup_name(self.slices, slice_idx)
    }

    pub(crate) fn class_result(
        &self,
        slice_idx: usize,
        dev_idx: usize,
        class: &str,
    ) -> Option<bool> {
        let e = self
            .cache
            .class_ok(self.slices, slice_idx, dev_idx)
            .lock()
            .expect("class cache lock");
        e.iter().find(|(c, _)| c == class).map(|(_, b)| *b)
    }

    pub(super) fn set_class_result(&self, slice_idx: usize, dev_idx: usize, class: &str, ok: bool) {
        let mut e = self
            .cache
            .class_ok(self.slices, slice_idx, dev_idx)
            .lock()
            .expect("class cache lock");
        if !e.iter().any(|(c, _)| c == class) {
            e.push((class.to_string(), ok));
        }
    }
}
