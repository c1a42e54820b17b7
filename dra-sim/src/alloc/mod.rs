//! The scheduler's structured allocator (`k8s.io/dynamic-resource-allocation/structured`, the
//! "incubating" variant the 1.37 scheduler uses with its default feature gates): pool gathering,
//! first-fit depth-first search with full backtracking over all claims of a pod, `firstAvailable`,
//! `All`, admin access, constraints, shared counters, taints, consumable capacity.
//!
//! The search mirrors the upstream control flow step by step (same order of checks, same lazy CEL
//! evaluation), so the first solution found and the errors raised are the scheduler's.
pub mod explain;
mod pools;

use crate::cel::{self, Cache, value::quantity::Quantity};
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, CapacityRequirements, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceAttribute, DeviceCapacity, DeviceClass, DeviceRequestAllocationResult, DeviceSelector,
    DeviceToleration, ResourceClaim, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as KQuantity;
pub use pools::{Pool, SimNode, node_matches};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

pub const ALLOCATION_RESULTS_MAX_SIZE: usize = 32;

/// (driver, pool, device)
pub type DeviceId = (String, String, String);

/// What the allocator reports: per-claim results, `None` for "no solution on this node", or a
/// fatal error (bad CEL, missing class, ...).
pub type Outcome = Result<Option<Vec<AllocationResult>>, String>;

/// State of already-allocated claims, as the scheduler derives it.
#[derive(Default, Clone)]
pub struct AllocatedState {
    pub devices: HashSet<DeviceId>,
    pub shared: HashSet<DeviceId>,
    pub capacity: HashMap<DeviceId, BTreeMap<String, Quantity>>,
}

impl AllocatedState {
    pub fn from_claims<'a>(claims: impl IntoIterator<Item = &'a ResourceClaim>) -> Self {
        let mut s = AllocatedState::default();
        for c in claims {
            let Some(results) = c
                .status
                .as_ref()
                .and_then(|st| st.allocation.as_ref())
                .and_then(|a| a.devices.as_ref())
                .and_then(|d| d.results.as_ref())
            else {
                continue;
            };
            for r in results {
                if r.admin_access == Some(true) {
                    continue;
                }
                let id = (r.driver.clone(), r.pool.clone(), r.device.clone());
                if r.share_id.is_some() {
                    s.shared.insert(id.clone());
                    let agg = s.capacity.entry(id).or_default();
                    for (k, v) in r.consumed_capacity.iter().flatten() {
                        if let Ok(q) = Quantity::parse(&v.0) {
                            let e = agg.entry(k.clone()).or_insert(Quantity::ZERO);
                            *e = e.add(&q).unwrap_or(*e);
                        }
                    }
                } else {
                    s.devices.insert(id);
                }
            }
        }
        s
    }
}

/// What can be known about a set of slices without any class or claim, each fact computed once
/// per slice: whether each device converts to a CEL `device` value, the slice's shared counters,
/// the counters its devices consume, and duplicate device names. The Go allocator works these
/// out again for every pod and node (it converts every slice it gathers and validates every
/// pool); a scheduler holding this next to its slice informer, as upstream's converting
/// ResourceSlice informer does for the conversion, computes them when a slice arrives.
/// Facts are made lazily, when the search first reaches a slice, or all at once with
/// [`SliceFacts::build`].
pub struct SliceFacts {
    /// per slice, per device: `cel::device_check`, the device's conversion error if any
    checks: Vec<PerDevice<OnceLock<Result<(), String>>>>,
    /// per slice: parsed shared counters (counter set -> counter -> quantity)
    counters: Vec<OnceLock<Counters>>,
    /// per slice: the first device name that occurs twice in it
    dup_name: Vec<OnceLock<Option<String>>>,
    /// per slice: the counters its devices consume, by counter set, in order of first use
    counter_refs: Vec<OnceLock<CounterRefs>>,
    /// per set of device slices of one pool: the first device name found twice
    dup_across: Mutex<FastMap<Vec<usize>, Option<String>>>,
}

type CounterRefs = Vec<(String, Vec<String>)>;

/// One entry per device of a slice, made when the slice is first reached.
type PerDevice<T> = OnceLock<Box<[T]>>;

/// class name -> all of the class's selectors true on the device
type ClassOutcomes = Mutex<Vec<(String, bool)>>;

impl SliceFacts {
    pub fn new(slices: &[ResourceSlice]) -> Self {
        SliceFacts {
            checks: slices.iter().map(|_| OnceLock::new()).collect(),
            counters: slices.iter().map(|_| OnceLock::new()).collect(),
            dup_name: slices.iter().map(|_| OnceLock::new()).collect(),
            counter_refs: slices.iter().map(|_| OnceLock::new()).collect(),
            dup_across: Mutex::default(),
        }
    }

    /// Every slice's facts, computed now (as slices arrive) rather than during a search, the
    /// slices shared out over the machine's cores.
    pub fn build(slices: &[ResourceSlice]) -> Self {
        let f = Self::new(slices);
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let chunk = slices.len().div_ceil(threads).max(1);
        std::thread::scope(|scope| {
            for start in (0..slices.len()).step_by(chunk) {
                let f = &f;
                scope.spawn(move || {
                    for i in start..(start + chunk).min(slices.len()) {
                        f.fill(slices, i);
                    }
                });
            }
        });
        f
    }

    fn fill(&self, slices: &[ResourceSlice], i: usize) {
        let s = &slices[i];
        self.counters(slices, i);
        self.dup_name(slices, i);
        self.counter_refs(slices, i);
        for (j, d) in s.spec.devices.iter().flatten().enumerate() {
            self.check(slices, i, j, || cel::RawDevice::of(&s.spec.driver, d));
        }
    }

    fn check<'d>(
        &self,
        slices: &[ResourceSlice],
        slice: usize,
        device: usize,
        raw: impl FnOnce() -> cel::RawDevice<'d>,
    ) -> &Result<(), String> {
        self.checks[slice].get_or_init(|| {
            (0..slices[slice].spec.devices.as_ref().map_or(0, |d| d.len()))
                .map(|_| OnceLock::new())
                .collect()
        })[device]
            .get_or_init(|| cel::device_check(&raw()))
    }

    fn counters(&self, slices: &[ResourceSlice], i: usize) -> &Counters {
        self.counters[i].get_or_init(|| {
            let mut sets = Counters::new();
            for cs in slices[i].spec.shared_counters.iter().flatten() {
                let m = cs
                    .counters
                    .iter()
                    .map(|(k, c)| {
                        (
                            k.clone(),
                            Quantity::parse(&c.value.0).unwrap_or(Quantity::ZERO),
                        )
                    })
                    .collect();
                sets.entry(cs.name.clone()).or_insert(m);
            }
            sets
        })
    }

    fn counter_refs(&self, slices: &[ResourceSlice], i: usize) -> &CounterRefs {
        self.counter_refs[i]
            .get_or_init(|| counter_refs_of(slices[i].spec.devices.as_deref().unwrap_or(&[])))
    }

    fn dup_name(&self, slices: &[ResourceSlice], i: usize) -> Option<&str> {
        self.dup_name[i]
            .get_or_init(|| {
                let devices = slices[i].spec.devices.as_deref().unwrap_or(&[]);
                devices.iter().for_each(|d| prefetch(d.name.as_ptr()));
                let mut seen = FastSet::with_capacity_and_hasher(devices.len(), Default::default());
                devices
                    .iter()
                    .find(|d| !seen.insert(d.name.as_str()))
                    .map(|d| d.name.clone())
            })
            .as_deref()
    }

    fn dup_name_across(&self, slices: &[ResourceSlice], device_slices: &[usize]) -> Option<String> {
        if let Some(r) = self
            .dup_across
            .lock()
            .expect("dup cache lock")
            .get(device_slices)
        {
            return r.clone();
        }
        let devices = || {
            device_slices
                .iter()
                .flat_map(|&i| slices[i].spec.devices.iter().flatten())
        };
        devices().for_each(|d| prefetch(d.name.as_ptr()));
        let mut seen = FastSet::with_capacity_and_hasher(devices().count(), Default::default());
        let r = devices()
            .find(|d| !seen.insert(d.name.as_str()))
            .map(|d| d.name.clone());
        self.dup_across
            .lock()
            .expect("dup cache lock")
            .insert(device_slices.to_vec(), r.clone());
        r
    }
}

/// Per-device data derived from a fixed set of slices and classes, shareable between allocators
/// (one per pod, like the scheduler's per-cycle allocator) as long as the slices and classes stay
/// the same: the slices' [`SliceFacts`] and the outcome of each class's selectors on each device
/// (errors are not kept: they are raised again, with the claim's name). Per-device entries are
/// made for a slice when the search first reaches it.
pub struct DeviceCache {
    facts: Arc<SliceFacts>,
    /// per slice, per device: class name -> all class selectors true
    class_ok: Vec<PerDevice<ClassOutcomes>>,
}

impl DeviceCache {
    pub fn new(slices: &[ResourceSlice]) -> Self {
        Self::with_facts(slices, Arc::new(SliceFacts::new(slices)))
    }

    /// Fresh class outcomes over facts kept for these slices.
    pub fn with_facts(slices: &[ResourceSlice], facts: Arc<SliceFacts>) -> Self {
        assert_eq!(facts.checks.len(), slices.len(), "facts of other slices");
        DeviceCache {
            facts,
            class_ok: slices.iter().map(|_| OnceLock::new()).collect(),
        }
    }

    fn class_ok(&self, slices: &[ResourceSlice], slice: usize, device: usize) -> &ClassOutcomes {
        &self.class_ok[slice].get_or_init(|| {
            (0..slices[slice].spec.devices.as_ref().map_or(0, |d| d.len()))
                .map(|_| Mutex::default())
                .collect()
        })[device]
    }
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
    programs: std::cell::RefCell<FastMap<(usize, usize), CompiledSelector>>,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub(crate) struct ReqKey {
    pub claim: usize,
    pub request: usize,
    pub sub: usize,
}

/// A request or subrequest, normalized.
#[derive(Clone, Debug)]
pub(crate) struct Req<'a> {
    pub name: &'a str,
    pub parent: Option<&'a str>,
    pub class_name: &'a str,
    pub selectors: &'a [DeviceSelector],
    pub all: bool,
    pub count: i64,
    pub admin_access: bool,
    pub tolerations: &'a [DeviceToleration],
    pub capacity: Option<&'a CapacityRequirements>,
    pub mode: String,
}

impl Req<'_> {
    pub fn full_name(&self) -> String {
        match self.parent {
            Some(p) => format!("{p}/{}", self.name),
            None => self.name.to_string(),
        }
    }
}

pub(crate) struct ReqData<'a> {
    pub req: Req<'a>,
    pub class: Option<&'a DeviceClass>,
    pub num_devices: usize,
    pub all_devices: Vec<DevRef>,
    pub selected_sub: usize,
}

/// A device inside the gathered pools: (pool index, slice index within pool's targeting list,
/// device index).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DevRef {
    pub pool: usize,
    pub slice: usize,
    pub device: usize,
}

pub(crate) enum Constraint<'a> {
    Match {
        requests: HashSet<&'a str>,
        attr: &'a str,
        value: Option<&'a DeviceAttribute>,
        n: usize,
    },
    Distinct {
        requests: HashSet<&'a str>,
        attr: &'a str,
        values: Vec<&'a DeviceAttribute>,
    },
}

struct ResultDev<'a> {
    req_name: &'a str,
    parent: Option<&'a str>,
    dev: DevRef,
    admin: bool,
    share_id: Option<String>,
    consumed: Option<BTreeMap<String, Quantity>>,
}

type Counters = BTreeMap<String, BTreeMap<String, Quantity>>;

/// A small multiply-rotate hasher (FxHash-style) for the search's maps, whose keys are a few
/// machine words; SipHash showed up in profiles.
#[derive(Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

impl std::hash::Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut buf = [0u8; 8];
            buf[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(buf) ^ ((rest.len() as u64) << 56));
        }
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

/// Asks for the cache line at `p` ahead of use. A cold allocation walks thousands of nodes whose
/// device names and counter names each sit in their own heap block; asking for a slice's worth
/// at once lets the memory system fetch them side by side instead of one miss at a time.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that never faults, whatever the address; SSE is part of the
    // x86_64 baseline.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

type CompiledSelector = Arc<Result<cel::Program, String>>;

/// The counters the devices consume, by counter set, each name once, in order of first use.
fn counter_refs_of(devices: &[k8s_openapi::api::resource::v1::Device]) -> CounterRefs {
    // Devices of a slice mostly consume from one set and a few dozen counters: scanning
    // short lists beats hashing every (set, counter) pair, which a cold allocation over
    // thousands of nodes does a few thousand times per node. Long lists get a hash set.
    // Each name is a heap block of its own, so the slice's names are asked for at once.
    // Names are compared as (length, first 8 bytes, last 8 bytes), which is the whole
    // name up to 16 bytes: the counter names of a set mostly share a length
    // ("memory-slice-3"), so comparing them as text called memcmp for most candidates.
    enum Seen<'s> {
        Few(Vec<(NameKey, &'s str)>),
        Many(FastSet<&'s str>),
    }
    const SCAN: usize = 32;
    let mut refs: CounterRefs = Vec::new();
    let mut seen: Vec<Seen<'_>> = Vec::new();
    let mut last = usize::MAX;
    // Each step of the walk (the device's consumption list, the set name and map node, the
    // names) waits on the one before; a pass per step keeps a slice's misses in flight
    // together instead of one device at a time.
    for d in devices {
        if let Some(v) = &d.consumes_counters {
            prefetch(v.as_ptr().cast());
        }
    }
    for d in devices {
        for cc in d.consumes_counters.iter().flatten() {
            prefetch(cc.counter_set.as_ptr());
            if let Some((n, _)) = cc.counters.first_key_value() {
                prefetch(n.as_ptr());
            }
        }
    }
    for d in devices {
        for cc in d.consumes_counters.iter().flatten() {
            for n in cc.counters.keys().skip(1) {
                prefetch(n.as_ptr());
            }
        }
    }
    for d in devices {
        for cc in d.consumes_counters.iter().flatten() {
            let set = cc.counter_set.as_str();
            if refs.get(last).is_none_or(|(n, _)| n != set) {
                last = match refs.iter().position(|(n, _)| n == set) {
                    Some(i) => i,
                    None => {
                        refs.push((set.to_string(), Vec::new()));
                        seen.push(Seen::Few(Vec::new()));
                        refs.len() - 1
                    }
                };
            }
            for n in cc.counters.keys() {
                let new = match &mut seen[last] {
                    Seen::Many(h) => h.insert(n.as_str()),
                    Seen::Few(v) => {
                        let k = NameKey::of(n);
                        if v.iter().any(|(x, s)| *x == k && (k.exact() || s == n)) {
                            false
                        } else {
                            v.push((k, n.as_str()));
                            if v.len() > SCAN {
                                seen[last] = Seen::Many(v.drain(..).map(|(_, s)| s).collect());
                            }
                            true
                        }
                    }
                };
                if new {
                    refs[last].1.push(n.clone());
                }
            }
        }
    }
    refs
}

/// A name's length with its first and last 8 bytes (zero-padded when shorter): equal keys mean
/// equal names up to 16 bytes, and a cheap first test beyond.
#[derive(Clone, Copy, PartialEq, Eq)]
struct NameKey(usize, u64, u64);

impl NameKey {
    fn of(s: &str) -> Self {
        let b = s.as_bytes();
        let n = b.len();
        let word = |w: &[u8]| {
            let mut buf = [0u8; 8];
            buf[..w.len()].copy_from_slice(w);
            u64::from_le_bytes(buf)
        };
        if n <= 8 {
            NameKey(n, word(b), 0)
        } else {
            NameKey(n, word(&b[..8]), word(&b[n - 8..]))
        }
    }
    fn exact(&self) -> bool {
        self.0 <= 16
    }
}

pub(crate) type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<FastHasher>>;
pub(crate) type FastSet<K> = HashSet<K, std::hash::BuildHasherDefault<FastHasher>>;

pub(crate) struct Run<'a> {
    pub a: &'a Allocator<'a>,
    pub node: &'a SimNode,
    pub claims: &'a [ResourceClaim],
    pub pools: Vec<Pool<'a>>,
    pub req_data: FastMap<ReqKey, ReqData<'a>>,
    constraints: Vec<Vec<Constraint<'a>>>,
    matches: FastMap<(DevRef, ReqKey), bool>,
    allocating: FastMap<DevRef, Vec<usize>>,
    allocating_capacity: FastMap<DevRef, BTreeMap<String, Quantity>>,
    consumed_counters: FastMap<usize, Counters>,
    available_counters: FastMap<usize, Cow<'a, Counters>>,
    results: Vec<Vec<ResultDev<'a>>>,
    share_seq: u64,
}

enum Stop {
    Err(String),
    MaxSize,
}

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

    fn set_class_result(&self, slice_idx: usize, dev_idx: usize, class: &str, ok: bool) {
        let mut e = self
            .cache
            .class_ok(self.slices, slice_idx, dev_idx)
            .lock()
            .expect("class cache lock");
        if !e.iter().any(|(c, _)| c == class) {
            e.push((class.to_string(), ok));
        }
    }

    /// Allocates all `claims` (one pod) on `node`.
    pub fn allocate(&'a self, node: &'a SimNode, claims: &'a [ResourceClaim]) -> Outcome {
        let mut slices_for_node: Vec<usize> = self
            .slices_on_node
            .get(node.name.as_str())
            .cloned()
            .unwrap_or_default();
        slices_for_node.extend(self.slices_shared.iter().copied());
        let pools = pools::gather_pools(self, &slices_for_node, node)
            .map_err(|e| format!("gather pool information: {e}"))?;
        let mut run = Run {
            a: self,
            node,
            claims,
            pools,
            req_data: FastMap::default(),
            constraints: Vec::new(),
            matches: FastMap::default(),
            allocating: FastMap::default(),
            allocating_capacity: FastMap::default(),
            consumed_counters: FastMap::default(),
            available_counters: FastMap::default(),
            results: claims.iter().map(|_| Vec::new()).collect(),
            share_seq: 0,
        };
        run.prepare()?;
        match run.allocate_one(Idx::default(), false, Loc::default()) {
            Ok(true) => {}
            Ok(false) | Err(Stop::MaxSize) => {
                if run.pools.iter().any(|p| p.invalid.is_some()) {
                    return Err("invalid resource pools were encountered".to_string());
                }
                return Ok(None);
            }
            Err(Stop::Err(e)) => return Err(e),
        }
        Ok(Some(run.build_results()))
    }
}

pub(crate) fn class_spec(c: &DeviceClass) -> &k8s_openapi::api::resource::v1::DeviceClassSpec {
    static EMPTY: std::sync::OnceLock<k8s_openapi::api::resource::v1::DeviceClassSpec> =
        std::sync::OnceLock::new();
    c.spec
        .as_ref()
        .unwrap_or_else(|| EMPTY.get_or_init(Default::default))
}

pub(crate) fn claim_devices(
    c: &ResourceClaim,
) -> Option<&k8s_openapi::api::resource::v1::DeviceClaim> {
    c.spec.as_ref().and_then(|s| s.devices.as_ref())
}

pub(crate) fn claim_name(c: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        c.metadata.namespace.as_deref().unwrap_or(""),
        c.metadata.name.as_deref().unwrap_or("")
    )
}

pub(crate) fn requests_of(c: &ResourceClaim) -> &[k8s_openapi::api::resource::v1::DeviceRequest] {
    claim_devices(c)
        .and_then(|d| d.requests.as_deref())
        .unwrap_or(&[])
}

#[derive(Clone, Copy, Default, Debug)]
struct Idx {
    claim: usize,
    request: usize,
    sub: usize,
    device: usize,
}

#[derive(Clone, Copy, Default, Debug)]
struct Loc {
    pool: usize,
    slice: usize,
    device: usize,
}

impl<'a> Run<'a> {
    fn prepare(&mut self) -> Result<(), String> {
        let mut min_total = 0;
        for (ci, claim) in self.claims.iter().enumerate() {
            let mut min_per_claim = 0usize;
            for (ri, request) in requests_of(claim).iter().enumerate() {
                let subs = request.first_available.as_deref().unwrap_or(&[]);
                let min_per_request;
                if !subs.is_empty() {
                    let mut m = usize::MAX;
                    for (si, sub) in subs.iter().enumerate() {
                        let req = Req {
                            name: &sub.name,
                            parent: Some(&request.name),
                            class_name: &sub.device_class_name,
                            selectors: sub.selectors.as_deref().unwrap_or(&[]),
                            mode: sub
                                .allocation_mode
                                .clone()
                                .unwrap_or_else(|| "ExactCount".into()),
                            all: sub.allocation_mode.as_deref() == Some("All"),
                            count: sub.count.unwrap_or(1),
                            admin_access: false,
                            tolerations: sub.tolerations.as_deref().unwrap_or(&[]),
                            capacity: sub.capacity.as_ref(),
                        };
                        let key = ReqKey {
                            claim: ci,
                            request: ri,
                            sub: si,
                        };
                        let rd = self.validate_request(req, key)?;
                        m = m.min(rd.num_devices);
                        self.req_data.insert(key, rd);
                    }
                    min_per_request = m;
                } else {
                    let Some(ex) = request.exactly.as_ref() else {
                        return Err(format!(
                            "claim {}, request {}: missing device class name (unsupported request type?)",
                            claim_name(claim),
                            request.name
                        ));
                    };
                    let req = Req {
                        name: &request.name,
                        parent: None,
                        class_name: &ex.device_class_name,
                        selectors: ex.selectors.as_deref().unwrap_or(&[]),
                        mode: ex
                            .allocation_mode
                            .clone()
                            .unwrap_or_else(|| "ExactCount".into()),
                        all: ex.allocation_mode.as_deref() == Some("All"),
                        count: ex.count.unwrap_or(1),
                        admin_access: ex.admin_access.unwrap_or(false),
                        tolerations: ex.tolerations.as_deref().unwrap_or(&[]),
                        capacity: ex.capacity.as_ref(),
                    };
                    let key = ReqKey {
                        claim: ci,
                        request: ri,
                        sub: 0,
                    };
                    let rd = self.validate_request(req, key)?;
                    min_per_request = rd.num_devices;
                    self.req_data.insert(key, rd);
                }
                if min_per_request
                    > ALLOCATION_RESULTS_MAX_SIZE - min_per_claim.min(ALLOCATION_RESULTS_MAX_SIZE)
                {
                    return Err(format!(
                        "claim {}, request {}: adding {} devices exceeds the claim limit of {}, with {} already accounted for",
                        claim_name(claim),
                        request.name,
                        min_per_request,
                        ALLOCATION_RESULTS_MAX_SIZE,
                        min_per_claim
                    ));
                }
                min_per_claim += min_per_request;
            }
            let mut cons = Vec::new();
            for (i, c) in claim_devices(claim)
                .and_then(|d| d.constraints.as_deref())
                .unwrap_or(&[])
                .iter()
                .enumerate()
            {
                let requests: HashSet<&str> =
                    c.requests.iter().flatten().map(|s| s.as_str()).collect();
                if let Some(m) = &c.match_attribute {
                    cons.push(Constraint::Match {
                        requests,
                        attr: m,
                        value: None,
                        n: 0,
                    });
                } else if let Some(d) = &c.distinct_attribute {
                    cons.push(Constraint::Distinct {
                        requests,
                        attr: d,
                        values: Vec::new(),
                    });
                } else {
                    return Err(format!(
                        "claim {}, constraint #{i}: empty constraint (unsupported constraint type?)",
                        claim_name(claim)
                    ));
                }
            }
            self.constraints.push(cons);
            min_total += min_per_claim;
        }
        let _ = min_total;
        Ok(())
    }

    fn validate_request(&mut self, req: Req<'a>, key: ReqKey) -> Result<ReqData<'a>, String> {
        let claim = &self.claims[key.claim];
        for (i, s) in req.selectors.iter().enumerate() {
            if s.cel.is_none() {
                return Err(format!(
                    "claim {}, request {}, selector #{i}: CEL expression empty (unsupported selector type?)",
                    claim_name(claim),
                    req.name
                ));
            }
        }
        if req.class_name.is_empty() {
            return Err(format!(
                "claim {}, request {}: missing device class name (unsupported request type?)",
                claim_name(claim),
                req.name
            ));
        }
        let class = *self.a.classes.get(req.class_name).ok_or_else(|| {
            format!(
                "claim {}, request {}: could not retrieve device class {}: deviceclass.resource.k8s.io \"{}\" not found",
                claim_name(claim),
                req.name,
                req.class_name,
                req.class_name
            )
        })?;
        let mut rd = ReqData {
            req,
            class: Some(class),
            num_devices: 0,
            all_devices: Vec::new(),
            selected_sub: 0,
        };
        match rd.req.mode.as_str() {
            "ExactCount" => rd.num_devices = rd.req.count.max(0) as usize,
            "All" => {
                for pi in 0..self.pools.len() {
                    let pid = self.pools[pi].id_string();
                    if self.pools[pi].incomplete {
                        return Err(format!(
                            "claim {}, request {}: asks for all devices, but resource pool {} is currently being updated",
                            claim_name(claim),
                            rd.req.name,
                            pid
                        ));
                    }
                    if self.pools[pi].invalid.is_some() {
                        return Err(format!(
                            "claim {}, request {}: asks for all devices, but resource pool {} is currently invalid",
                            claim_name(claim),
                            rd.req.name,
                            pid
                        ));
                    }
                    for si in 0..self.pools[pi].slices.len() {
                        let nd = self.pools[pi].devices(si).len();
                        for di in 0..nd {
                            let d = DevRef {
                                pool: pi,
                                slice: si,
                                device: di,
                            };
                            if self.is_selectable(key, &rd, d)? {
                                let ok = self.capacity_fits(&rd.req, d, true)?;
                                if !ok {
                                    continue;
                                }
                                rd.all_devices.push(d);
                            }
                        }
                    }
                }
                rd.num_devices = rd.all_devices.len();
            }
            other => {
                return Err(format!(
                    "claim {}, request {}: unsupported count mode {other}",
                    claim_name(claim),
                    rd.req.name
                ));
            }
        }
        Ok(rd)
    }

    fn device(&self, d: DevRef) -> &'a k8s_openapi::api::resource::v1::Device {
        &self.pools[d.pool].devices(d.slice)[d.device]
    }

    fn device_id(&self, d: DevRef) -> DeviceId {
        let p = &self.pools[d.pool];
        (
            p.driver.to_string(),
            p.name.to_string(),
            self.device(d).name.clone(),
        )
    }

    pub(crate) fn selectors_match(
        &self,
        key: ReqKey,
        d: DevRef,
        class: Option<&DeviceClass>,
        selectors: &[DeviceSelector],
    ) -> Result<bool, String> {
        for (i, s) in selectors.iter().enumerate() {
            let expr = s.cel.as_ref().map(|c| c.expression.as_str()).unwrap_or("");
            let prog = self.program(expr);
            let who = || match class {
                Some(c) => format!("class {}", c.metadata.name.as_deref().unwrap_or("")),
                None => format!("claim {}", claim_name(&self.claims[key.claim])),
            };
            let prog = match prog.as_ref() {
                Ok(p) => p,
                Err(e) => return Err(format!("{}: selector #{i}: CEL compile error: {e}", who())),
            };
            let pool = &self.pools[d.pool];
            let (gslice, _) = pool.slices[d.slice];
            let r = match self.a.raw_device(gslice, d.device) {
                Ok(raw) => prog.eval_raw(raw),
                Err(e) => Err(e.clone()),
            };
            match r {
                Ok(true) => {}
                Ok(false) => return Ok(false),
                Err(e) => {
                    let id = self.device_id(d);
                    return Err(format!(
                        "{}: selector #{i} on device {}/{}/{}: CEL runtime error: {}",
                        who(),
                        id.0,
                        id.1,
                        id.2,
                        cel::enhance_runtime_error(&e)
                    ));
                }
            }
        }
        Ok(true)
    }

    /// The compiled selector, memoized by the expression's address (the claim and class objects
    /// outlive the run), so that the text is hashed once per selector rather than per device.
    fn program(&self, expr: &str) -> Arc<Result<cel::Program, String>> {
        let key = (expr.as_ptr() as usize, expr.len());
        if let Some(p) = self.a.programs.borrow().get(&key) {
            return p.clone();
        }
        let p = self.a.cel.get_or_compile(expr);
        self.a.programs.borrow_mut().insert(key, p.clone());
        p
    }

    pub(crate) fn is_selectable(
        &mut self,
        key: ReqKey,
        rd: &ReqData<'a>,
        d: DevRef,
    ) -> Result<bool, String> {
        if let Some(m) = self.matches.get(&(d, key)) {
            return Ok(*m);
        }
        if let Some(class) = rd.class {
            let cname = class.metadata.name.as_deref().unwrap_or("");
            let gslice = self.pools[d.pool].slices[d.slice].0;
            let ok = match self.a.class_result(gslice, d.device, cname) {
                Some(ok) => ok,
                None => {
                    let sels = class_spec(class).selectors.as_deref().unwrap_or(&[]);
                    let ok = self.selectors_match(key, d, Some(class), sels)?;
                    self.a.set_class_result(gslice, d.device, cname, ok);
                    ok
                }
            };
            if !ok {
                self.matches.insert((d, key), false);
                return Ok(false);
            }
        }
        if !self.selectors_match(key, d, None, rd.req.selectors)? {
            self.matches.insert((d, key), false);
            return Ok(false);
        }
        let pool = &self.pools[d.pool];
        let slice = &self.a.slices[pool.slices[d.slice].0];
        if slice.spec.per_device_node_selection == Some(true) {
            let dev = self.device(d);
            let m = node_matches(
                self.node,
                dev.node_name.as_deref().unwrap_or(""),
                dev.all_nodes.unwrap_or(false),
                dev.node_selector.as_ref(),
            )?;
            if !m {
                self.matches.insert((d, key), false);
                return Ok(false);
            }
        }
        self.matches.insert((d, key), true);
        Ok(true)
    }

    fn in_use(&self, d: DevRef) -> bool {
        if self.allocating.get(&d).is_some_and(|v| !v.is_empty()) {
            return true;
        }
        if self.a.allocated.devices.is_empty() {
            return false;
        }
        self.a.allocated.devices.contains(&self.device_id(d))
    }

    fn allocating_for_claim(&self, d: DevRef, claim: usize) -> bool {
        self.allocating.get(&d).is_some_and(|v| v.contains(&claim))
    }

    /// `CmpRequestOverCapacity` for the current state (or an empty state when `empty`).
    fn capacity_fits(&self, req: &Req<'a>, d: DevRef, empty: bool) -> Result<bool, String> {
        let dev = self.device(d);
        let caps = dev.capacity.as_ref();
        let id = self.device_id(d);
        let current: BTreeMap<String, Quantity> = if empty {
            BTreeMap::new()
        } else {
            self.a
                .allocated
                .capacity
                .get(&id)
                .cloned()
                .unwrap_or_default()
        };
        let allocating = if empty {
            None
        } else {
            self.allocating_capacity.get(&d)
        };
        capacity::cmp_request_over_capacity(&current, req.capacity, caps, allocating).map_err(|e| {
            format!(
                "claim {}, request {}: checking capacity for device {}/{}/{}: {e}",
                claim_name(&self.claims[0]),
                req.name,
                id.0,
                id.1,
                id.2
            )
        })
    }

    fn allocate_one(&mut self, r: Idx, allocate_sub: bool, start: Loc) -> Result<bool, Stop> {
        if r.claim >= self.claims.len() {
            return Ok(true);
        }
        let claim = &self.claims[r.claim];
        if r.request >= requests_of(claim).len() {
            return match self.allocate_one(
                Idx {
                    claim: r.claim + 1,
                    ..Default::default()
                },
                false,
                Loc::default(),
            ) {
                Err(Stop::MaxSize) => Ok(false),
                x => x,
            };
        }
        let key = ReqKey {
            claim: r.claim,
            request: r.request,
            sub: r.sub,
        };
        let has_parent = self.req_data[&key].req.parent.is_some();
        if !allocate_sub && has_parent {
            let mut all_exceeded = true;
            let mut sub = 0;
            loop {
                let nk = ReqKey { sub, ..key };
                if !self.req_data.contains_key(&nk) {
                    if all_exceeded {
                        return Err(Stop::MaxSize);
                    }
                    return Ok(false);
                }
                let res = self.allocate_one(Idx { sub, ..r }, true, Loc::default());
                match res {
                    Err(Stop::MaxSize) => {
                        sub += 1;
                        continue;
                    }
                    Err(e) => return Err(e),
                    Ok(ok) => {
                        all_exceeded = false;
                        if ok {
                            self.req_data.get_mut(&key).expect("request").selected_sub = sub;
                            return Ok(true);
                        }
                    }
                }
                sub += 1;
            }
        }
        let (all, num, admin) = {
            let rd = &self.req_data[&key];
            (rd.req.all, rd.num_devices, rd.req.admin_access)
        };
        if all && self.req_data[&key].all_devices.is_empty() {
            return Ok(false);
        }
        if r.device >= num {
            return self.allocate_one(
                Idx {
                    claim: r.claim,
                    request: r.request + 1,
                    ..Default::default()
                },
                false,
                Loc::default(),
            );
        }
        let remaining = num - r.device;
        let available = ALLOCATION_RESULTS_MAX_SIZE.saturating_sub(self.results[r.claim].len());
        if remaining > available {
            return Err(Stop::MaxSize);
        }
        if all {
            let d = self.req_data[&key].all_devices[r.device];
            let (ok, undo) = self.allocate_device(r, key, d, true).map_err(Stop::Err)?;
            if !ok {
                return Ok(false);
            }
            let done = self.allocate_one(
                Idx {
                    device: r.device + 1,
                    ..r
                },
                allocate_sub,
                Loc::default(),
            );
            match done {
                Ok(true) => return Ok(true),
                other => {
                    self.rollback(r, key, d, undo.expect("undo"));
                    return other;
                }
            }
        }
        for pi in start.pool..self.pools.len() {
            if self.pools[pi].incomplete || self.pools[pi].invalid.is_some() {
                continue;
            }
            let slice_start = if pi == start.pool { start.slice } else { 0 };
            for si in slice_start..self.pools[pi].slices.len() {
                let dev_start = if pi == start.pool && si == start.slice {
                    start.device
                } else {
                    0
                };
                let nd = self.pools[pi].devices(si).len();
                for di in dev_start..nd {
                    let d = DevRef {
                        pool: pi,
                        slice: si,
                        device: di,
                    };
                    if admin && self.allocating_for_claim(d, r.claim) {
                        continue;
                    }
                    if !admin && self.in_use(d) {
                        continue;
                    }
                    let rd = self.req_data.remove(&key).expect("request data");
                    let sel = self.is_selectable(key, &rd, d);
                    let cap = match &sel {
                        Ok(true) => Some(self.capacity_fits(&rd.req, d, false)),
                        _ => None,
                    };
                    self.req_data.insert(key, rd);
                    if !sel.map_err(Stop::Err)? {
                        continue;
                    }
                    if let Some(c) = cap
                        && !c.map_err(Stop::Err)?
                    {
                        continue;
                    }
                    let (ok, undo) = self.allocate_device(r, key, d, false).map_err(Stop::Err)?;
                    if !ok {
                        continue;
                    }
                    let next = Loc {
                        pool: pi,
                        slice: si,
                        device: di + 1,
                    };
                    let done = self.allocate_one(
                        Idx {
                            device: r.device + 1,
                            ..r
                        },
                        allocate_sub,
                        next,
                    );
                    if let Ok(true) = done {
                        return Ok(true);
                    }
                    self.rollback(r, key, d, undo.expect("undo"));
                    done?;
                }
            }
        }
        Ok(false)
    }

    fn allocate_device(
        &mut self,
        r: Idx,
        key: ReqKey,
        d: DevRef,
        must: bool,
    ) -> Result<(bool, Option<Undo>), String> {
        let dev = self.device(d);
        let multi = dev.allow_multiple_allocations == Some(true);
        let (admin, parent, name) = {
            let rd = &self.req_data[&key];
            (rd.req.admin_access, rd.req.parent, rd.req.name)
        };
        if !multi && admin && self.allocating_for_claim(d, r.claim) {
            return Ok((false, None));
        }
        if !admin && self.in_use(d) {
            return Ok((false, None));
        }
        let id = self.device_id(d);
        let capacity_in_use = self.a.allocated.capacity.contains_key(&id)
            || self.a.allocated.shared.contains(&id)
            || self.allocating_capacity.contains_key(&d);
        let skip_counters = multi && capacity_in_use;
        let mut undo = Undo {
            counters: false,
            constraints: 0,
            marked: false,
            capacity: None,
            result: false,
        };
        if !skip_counters
            && dev
                .consumes_counters
                .as_ref()
                .is_some_and(|c| !c.is_empty())
        {
            if !self.check_counters(d)? {
                return Ok((false, None));
            }
            undo.counters = true;
        }
        let (base, sub) = match parent {
            None => (name, None),
            Some(p) => (p, Some(name)),
        };
        let tolerations = self.req_data[&key].req.tolerations;
        if taint_prevents(dev, tolerations) {
            self.rollback(r, key, d, undo);
            return Ok((false, None));
        }
        let driver = self.pools[d.pool].driver;
        let n_cons = self.constraints[r.claim].len();
        for ci in 0..n_cons {
            let ok = constraint_add(&mut self.constraints[r.claim][ci], base, sub, dev, driver);
            if !ok {
                self.rollback(r, key, d, undo);
                if must {
                    return Err(format!(
                        "claim {}, request {}: cannot add device {}/{}/{} because a claim constraint would not be satisfied",
                        claim_name(&self.claims[r.claim]),
                        name,
                        id.0,
                        id.1,
                        id.2
                    ));
                }
                return Ok((false, None));
            }
            undo.constraints += 1;
        }
        if !multi {
            self.allocating.entry(d).or_default().push(r.claim);
            undo.marked = true;
        }
        let mut consumed = None;
        let mut share_id = None;
        {
            let req = self.req_data[&key].req.clone();
            let fits = self.capacity_fits(&req, d, false);
            match fits {
                Err(e) => {
                    self.rollback(r, key, d, undo);
                    return Err(e);
                }
                Ok(false) => {
                    self.rollback(r, key, d, undo);
                    return Ok((false, None));
                }
                Ok(true) => {}
            }
            if multi {
                let c = capacity::consumed_from_request(req.capacity, dev.capacity.as_ref())?;
                self.share_seq += 1;
                share_id = Some(format!("00000000-0000-4000-8000-{:012x}", self.share_seq));
                let entry = self.allocating_capacity.entry(d).or_default();
                for (k, v) in &c {
                    let e = entry.entry(k.clone()).or_insert(Quantity::ZERO);
                    *e = e.add(v)?;
                }
                undo.capacity = Some(c.clone());
                consumed = Some(c);
            }
        }
        self.results[r.claim].push(ResultDev {
            req_name: name,
            parent,
            dev: d,
            admin,
            share_id,
            consumed: consumed.filter(|c| !c.is_empty()),
        });
        undo.result = true;
        Ok((true, Some(undo)))
    }

    fn rollback(&mut self, r: Idx, key: ReqKey, d: DevRef, u: Undo) {
        if u.result {
            self.results[r.claim].pop();
        }
        if let Some(c) = u.capacity {
            if let Some(entry) = self.allocating_capacity.get_mut(&d) {
                for (k, v) in &c {
                    if let Some(e) = entry.get_mut(k) {
                        *e = e.sub(v).unwrap_or(*e);
                    }
                }
            }
            // the upstream collection drops the device entry once all its shares are removed
            let empty = self
                .allocating_capacity
                .get(&d)
                .is_some_and(|e| e.values().all(|q| q.sign() == 0));
            if empty && !self.results.iter().flatten().any(|x| x.dev == d) {
                self.allocating_capacity.remove(&d);
            }
        }
        if u.marked
            && let Some(v) = self.allocating.get_mut(&d)
            && let Some(pos) = v.iter().position(|c| *c == r.claim)
        {
            v.remove(pos);
        }
        let (base, sub) = {
            let rd = &self.req_data[&key];
            match rd.req.parent {
                None => (rd.req.name, None),
                Some(p) => (p, Some(rd.req.name)),
            }
        };
        for ci in (0..u.constraints).rev() {
            constraint_remove(&mut self.constraints[r.claim][ci], base, sub);
        }
        if u.counters {
            self.release_counters(d);
        }
    }

    fn available(&mut self, pool_idx: usize) -> &Counters {
        if !self.available_counters.contains_key(&pool_idx) {
            let pool = &self.pools[pool_idx];
            // Shared with the pool (and its cache) until a device allocated earlier takes some.
            let mut avail: Cow<'a, Counters> = match &pool.counter_sets {
                Cow::Borrowed(sets) => Cow::Borrowed(*sets),
                Cow::Owned(sets) => Cow::Owned(sets.clone()),
            };
            let nothing_allocated =
                self.a.allocated.devices.is_empty() && self.a.allocated.shared.is_empty();
            let scan: &[(usize, i64)] = if nothing_allocated { &[] } else { &pool.slices };
            let scan_nt: &[(usize, i64)] = if nothing_allocated {
                &[]
            } else {
                &pool.not_targeting
            };
            for &(gs, _) in scan.iter().chain(scan_nt.iter()) {
                let s = &self.a.slices[gs];
                for dev in s.spec.devices.iter().flatten() {
                    let id = (
                        s.spec.driver.clone(),
                        s.spec.pool.name.clone(),
                        dev.name.clone(),
                    );
                    if !(self.a.allocated.devices.contains(&id)
                        || self.a.allocated.shared.contains(&id))
                    {
                        continue;
                    }
                    for cc in dev.consumes_counters.iter().flatten() {
                        if let Some(set) = avail.to_mut().get_mut(&cc.counter_set) {
                            for (n, c) in &cc.counters {
                                if let (Some(e), Ok(q)) =
                                    (set.get_mut(n), Quantity::parse(&c.value.0))
                                {
                                    *e = e.sub(&q).unwrap_or(*e);
                                }
                            }
                        }
                    }
                }
            }
            self.available_counters.insert(pool_idx, avail);
        }
        &self.available_counters[&pool_idx]
    }

    fn check_counters(&mut self, d: DevRef) -> Result<bool, String> {
        let dev = self.device(d);
        self.available(d.pool);
        let consumed = self.consumed_counters.entry(d.pool).or_default();
        for cc in dev.consumes_counters.iter().flatten() {
            if !consumed.contains_key(&cc.counter_set) {
                consumed.insert(cc.counter_set.clone(), BTreeMap::new());
            }
            let set = consumed.get_mut(&cc.counter_set).expect("inserted");
            for (n, c) in &cc.counters {
                let q = Quantity::parse(&c.value.0)?;
                match set.get_mut(n) {
                    Some(e) => *e = e.add(&q)?,
                    None => {
                        set.insert(n.clone(), q);
                    }
                }
            }
        }
        let avail = &self.available_counters[&d.pool];
        let consumed = &self.consumed_counters[&d.pool];
        let mut ok = true;
        'outer: for (set_name, counters) in avail.iter() {
            let cs = consumed.get(set_name);
            for (cn, av) in counters {
                let used = cs
                    .and_then(|m| m.get(cn))
                    .copied()
                    .unwrap_or(Quantity::ZERO);
                if av.cmp_q(&used) == std::cmp::Ordering::Less {
                    ok = false;
                    break 'outer;
                }
            }
        }
        if !ok {
            self.release_counters(d);
        }
        Ok(ok)
    }

    fn release_counters(&mut self, d: DevRef) {
        let dev = self.device(d);
        if let Some(consumed) = self.consumed_counters.get_mut(&d.pool) {
            for cc in dev.consumes_counters.iter().flatten() {
                if let Some(set) = consumed.get_mut(&cc.counter_set) {
                    for (n, c) in &cc.counters {
                        if let (Some(e), Ok(q)) = (set.get_mut(n), Quantity::parse(&c.value.0)) {
                            *e = e.sub(&q).unwrap_or(*e);
                        }
                    }
                }
            }
        }
    }

    fn build_results(&self) -> Vec<AllocationResult> {
        let mut out = Vec::new();
        for (ci, claim) in self.claims.iter().enumerate() {
            let mut results = Vec::new();
            for rdv in &self.results[ci] {
                let id = self.device_id(rdv.dev);
                let request = match rdv.parent {
                    Some(p) => format!("{p}/{}", rdv.req_name),
                    None => rdv.req_name.to_string(),
                };
                let tolerations = self
                    .req_data
                    .iter()
                    .find(|(k, rd)| k.claim == ci && rd.req.full_name() == request)
                    .map(|(_, rd)| rd.req.tolerations.to_vec())
                    .filter(|t| !t.is_empty());
                let dev = self.device(rdv.dev);
                results.push(DeviceRequestAllocationResult {
                    request,
                    driver: id.0,
                    pool: id.1,
                    device: id.2,
                    admin_access: if rdv.admin { Some(true) } else { None },
                    tolerations,
                    share_id: rdv.share_id.clone(),
                    consumed_capacity: rdv.consumed.as_ref().map(|c| {
                        c.iter()
                            .map(|(k, v)| (k.clone(), KQuantity(v.canonical())))
                            .collect()
                    }),
                    binding_conditions: dev.binding_conditions.clone(),
                    binding_failure_conditions: dev.binding_failure_conditions.clone(),
                    skip_node_operations: None,
                });
            }
            let config = self.build_config(ci, claim);
            let node_selector = self.node_selector(ci);
            out.push(AllocationResult {
                allocation_timestamp: None,
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config: if config.is_empty() {
                        None
                    } else {
                        Some(config)
                    },
                }),
                node_selector,
            });
        }
        out
    }

    fn build_config(&self, ci: usize, claim: &ResourceClaim) -> Vec<DeviceAllocationConfiguration> {
        let mut config: Vec<DeviceAllocationConfiguration> = Vec::new();
        let mut by_class: HashMap<String, (usize, usize)> = HashMap::new();
        let reqs = requests_of(claim);
        let selected = |ri: usize| -> &ReqData<'a> {
            let k = ReqKey {
                claim: ci,
                request: ri,
                sub: 0,
            };
            let rd = &self.req_data[&k];
            if rd.req.parent.is_some() {
                &self.req_data[&ReqKey {
                    sub: rd.selected_sub,
                    ..k
                }]
            } else {
                rd
            }
        };
        for ri in 0..reqs.len() {
            let rd = selected(ri);
            let Some(class) = rd.class else { continue };
            let cname = class.metadata.name.clone().unwrap_or_default();
            if let Some((s, e)) = by_class.get(&cname) {
                for c in config.iter_mut().take(*e).skip(*s) {
                    c.requests
                        .get_or_insert_with(Vec::new)
                        .push(rd.req.full_name());
                }
                continue;
            }
            let start = config.len();
            for c in class_spec(class).config.iter().flatten() {
                config.push(DeviceAllocationConfiguration {
                    source: "FromClass".into(),
                    requests: Some(vec![rd.req.full_name()]),
                    opaque: c.opaque.clone(),
                });
            }
            by_class.insert(cname, (start, config.len()));
        }
        for c in claim_devices(claim)
            .and_then(|d| d.config.as_ref())
            .into_iter()
            .flatten()
        {
            let creqs = c.requests.clone().unwrap_or_default();
            if creqs.is_empty() {
                config.push(DeviceAllocationConfiguration {
                    source: "FromClaim".into(),
                    requests: None,
                    opaque: c.opaque.clone(),
                });
                continue;
            }
            for (ri, req) in reqs.iter().enumerate() {
                if creqs.contains(&req.name) {
                    config.push(DeviceAllocationConfiguration {
                        source: "FromClaim".into(),
                        requests: Some(creqs.clone()),
                        opaque: c.opaque.clone(),
                    });
                    break;
                }
                let rd = selected(ri);
                if rd.req.parent.is_none() {
                    continue;
                }
                if creqs.contains(&rd.req.full_name()) {
                    config.push(DeviceAllocationConfiguration {
                        source: "FromClaim".into(),
                        requests: Some(creqs.clone()),
                        opaque: c.opaque.clone(),
                    });
                    break;
                }
            }
        }
        for c in config.iter_mut() {
            let Some(requests) = &c.requests else {
                continue;
            };
            if requests.is_empty() {
                continue;
            }
            let applies_to_all = reqs.iter().enumerate().all(|(ri, req)| {
                if requests.contains(&req.name) {
                    return true;
                }
                let rd = selected(ri);
                rd.req.parent.is_some() && requests.contains(&rd.req.full_name())
            });
            if applies_to_all {
                c.requests = None;
            }
        }
        config
    }

    fn node_selector(&self, ci: usize) -> Option<NodeSelector> {
        let mut term = NodeSelectorTerm::default();
        for rdv in &self.results[ci] {
            let pool = &self.pools[rdv.dev.pool];
            let slice = &self.a.slices[pool.slices[rdv.dev.slice].0];
            let dev = self.device(rdv.dev);
            let (node_name, ns) = if slice.spec.per_device_node_selection == Some(true) {
                (dev.node_name.as_ref(), dev.node_selector.as_ref())
            } else {
                (
                    slice.spec.node_name.as_ref(),
                    slice.spec.node_selector.as_ref(),
                )
            };
            if node_name.is_some() || dev.binds_to_node == Some(true) {
                return Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_fields: Some(vec![NodeSelectorRequirement {
                            key: "metadata.name".into(),
                            operator: "In".into(),
                            values: Some(vec![self.node.name.clone()]),
                        }]),
                        match_expressions: None,
                    }],
                });
            }
            if let Some(ns) = ns
                && let Some(t) = ns.node_selector_terms.first()
            {
                add_reqs(t.match_fields.as_deref(), &mut term.match_fields);
                add_reqs(t.match_expressions.as_deref(), &mut term.match_expressions);
            }
        }
        if term.match_fields.as_ref().is_some_and(|v| !v.is_empty())
            || term
                .match_expressions
                .as_ref()
                .is_some_and(|v| !v.is_empty())
        {
            return Some(NodeSelector {
                node_selector_terms: vec![term],
            });
        }
        None
    }
}

fn add_reqs(
    from: Option<&[NodeSelectorRequirement]>,
    to: &mut Option<Vec<NodeSelectorRequirement>>,
) {
    for r in from.into_iter().flatten() {
        let to = to.get_or_insert_with(Vec::new);
        let vals: HashSet<&String> = r.values.iter().flatten().collect();
        let exists = to.iter().any(|e| {
            e.key == r.key
                && e.operator == r.operator
                && e.values.iter().flatten().collect::<HashSet<_>>() == vals
        });
        if !exists {
            to.push(r.clone());
        }
    }
}

struct Undo {
    counters: bool,
    constraints: usize,
    marked: bool,
    capacity: Option<BTreeMap<String, Quantity>>,
    result: bool,
}

pub(crate) fn taint_prevents(
    dev: &k8s_openapi::api::resource::v1::Device,
    tolerations: &[DeviceToleration],
) -> bool {
    for t in dev.taints.iter().flatten() {
        if t.effect == "NoSchedule" || t.effect == "NoExecute" {
            let tolerated = tolerations.iter().any(|tol| {
                if tol
                    .effect
                    .as_deref()
                    .is_some_and(|e| !e.is_empty() && e != t.effect)
                {
                    return false;
                }
                if tol
                    .key
                    .as_deref()
                    .is_some_and(|k| !k.is_empty() && k != t.key)
                {
                    return false;
                }
                match tol.operator.as_deref().unwrap_or("") {
                    "" | "Equal" => {
                        tol.value.as_deref().unwrap_or("") == t.value.as_deref().unwrap_or("")
                    }
                    "Exists" => true,
                    _ => false,
                }
            });
            if !tolerated {
                return true;
            }
        }
    }
    false
}

fn applies(requests: &HashSet<&str>, base: &str, sub: Option<&str>) -> bool {
    if requests.is_empty() {
        return true;
    }
    match sub {
        None => requests.contains(base),
        Some(s) => requests.contains(base) || requests.contains(format!("{base}/{s}").as_str()),
    }
}

fn lookup_attr<'d>(
    dev: &'d k8s_openapi::api::resource::v1::Device,
    driver: &str,
    name: &str,
) -> Option<&'d DeviceAttribute> {
    let attrs = dev.attributes.as_ref()?;
    if let Some(a) = attrs.get(name) {
        return Some(a);
    }
    let i = name.find('/')?;
    if &name[..i] != driver {
        return None;
    }
    attrs.get(&name[i + 1..])
}

fn same_attr(a: &DeviceAttribute, b: &DeviceAttribute) -> Option<bool> {
    if let Some(x) = &a.string {
        return Some(b.string.as_ref() == Some(x));
    }
    if let Some(x) = a.int {
        return Some(b.int == Some(x));
    }
    if let Some(x) = a.bool {
        return Some(b.bool == Some(x));
    }
    if let Some(x) = &a.version {
        return Some(b.version.as_ref() == Some(x));
    }
    None
}

fn constraint_add<'a>(
    c: &mut Constraint<'a>,
    base: &str,
    sub: Option<&str>,
    dev: &'a k8s_openapi::api::resource::v1::Device,
    driver: &str,
) -> bool {
    match c {
        Constraint::Match {
            requests,
            attr,
            value,
            n,
        } => {
            if !requests.is_empty() && !applies(requests, base, sub) {
                return true;
            }
            let Some(a) = lookup_attr(dev, driver, attr) else {
                return false;
            };
            if *n == 0 {
                *value = Some(a);
                *n = 1;
                return true;
            }
            match same_attr(a, value.expect("first value")) {
                Some(true) => {
                    *n += 1;
                    true
                }
                _ => false,
            }
        }
        Constraint::Distinct {
            requests,
            attr,
            values,
        } => {
            if !requests.is_empty() && !applies(requests, base, sub) {
                return true;
            }
            let Some(a) = lookup_attr(dev, driver, attr) else {
                return false;
            };
            for v in values.iter() {
                if same_attr(a, v) == Some(true) {
                    return false;
                }
            }
            values.push(a);
            true
        }
    }
}

fn constraint_remove(c: &mut Constraint<'_>, base: &str, sub: Option<&str>) {
    match c {
        Constraint::Match { requests, n, .. } => {
            if !requests.is_empty() && !applies(requests, base, sub) {
                return;
            }
            *n -= 1;
        }
        Constraint::Distinct {
            requests, values, ..
        } => {
            if !requests.is_empty() && !applies(requests, base, sub) {
                return;
            }
            values.pop();
        }
    }
}

pub mod capacity {
    //! Consumable capacity (`consumable_capacity.go`): rounding requests by the request policy and
    //! checking the sum of shares against the device's capacity.
    use super::*;

    fn q(k: &KQuantity) -> Result<Quantity, String> {
        Quantity::parse(&k.0)
    }

    fn use_milli(r: &k8s_openapi::api::resource::v1::CapacityRequestPolicyRange) -> bool {
        for (i, x) in [Some(&r.min), r.max.as_ref(), r.step.as_ref()]
            .into_iter()
            .enumerate()
        {
            let Some(x) = x else { continue };
            let Ok(v) = q(x) else { return false };
            if Quantity::from_milli(v.milli()).cmp_q(&v) != std::cmp::Ordering::Equal {
                return false;
            }
            if i == 2 && v.milli() < 1 {
                return false;
            }
        }
        true
    }

    fn consumed_for(req: Option<&KQuantity>, cap: &DeviceCapacity) -> Result<Quantity, String> {
        let Some(req) = req else {
            if let Some(d) = cap.request_policy.as_ref().and_then(|p| p.default.as_ref()) {
                return q(d);
            }
            return q(&cap.value);
        };
        let rq = q(req)?;
        let Some(p) = &cap.request_policy else {
            return Ok(rq);
        };
        if let Some(r) = &p.valid_range {
            let min = q(&r.min)?;
            if rq.cmp_q(&min) == std::cmp::Ordering::Less {
                return Ok(min);
            }
            let Some(step) = &r.step else { return Ok(rq) };
            let step = q(step)?;
            if use_milli(r) {
                let rm = rq.milli();
                let (sm, mm) = (step.milli(), min.milli());
                let added = rm - mm;
                let mut n = added / sm;
                if added % sm != 0 {
                    n += 1;
                }
                return Ok(Quantity::from_milli(mm + sm * n).with_format(step.format()));
            }
            let (ri, si, mi) = (rq.value_ceil(), step.value_ceil(), min.value_ceil());
            let added = ri - mi;
            let mut n = added / si;
            if added % si != 0 {
                n += 1;
            }
            return Ok(Quantity::from_milli((mi + si * n) * 1000).with_format(step.format()));
        }
        if let Some(vals) = &p.valid_values {
            for v in vals {
                let v = q(v)?;
                if rq.cmp_q(&v) != std::cmp::Ordering::Greater {
                    return Ok(v);
                }
            }
        }
        Ok(rq)
    }

    fn violates(v: &Quantity, cap: &DeviceCapacity) -> Result<bool, String> {
        let Some(p) = &cap.request_policy else {
            return Ok(false);
        };
        if let Some(d) = &p.default
            && q(d)? == *v
        {
            return Ok(false);
        }
        if let Some(r) = &p.valid_range {
            if let Some(max) = &r.max
                && v.cmp_q(&q(max)?) == std::cmp::Ordering::Greater
            {
                return Ok(true);
            }
            if let Some(step) = &r.step {
                let step = q(step)?;
                let min = q(&r.min)?;
                let (a, s, m) = if use_milli(r) {
                    (v.milli(), step.milli(), min.milli())
                } else {
                    (v.value_ceil(), step.value_ceil(), min.value_ceil())
                };
                if s != 0 && (a - m) % s != 0 {
                    return Ok(true);
                }
            }
            return Ok(false);
        }
        if let Some(vals) = &p.valid_values
            && !vals.is_empty()
        {
            for x in vals {
                if v.cmp_q(&q(x)?) == std::cmp::Ordering::Equal {
                    return Ok(false);
                }
            }
            return Ok(true);
        }
        Ok(false)
    }

    pub fn cmp_request_over_capacity(
        current: &BTreeMap<String, Quantity>,
        request: Option<&CapacityRequirements>,
        caps: Option<&BTreeMap<String, DeviceCapacity>>,
        allocating: Option<&BTreeMap<String, Quantity>>,
    ) -> Result<bool, String> {
        let empty = BTreeMap::new();
        let caps = caps.unwrap_or(&empty);
        let reqs = request.and_then(|r| r.requests.as_ref());
        if let Some(reqs) = reqs
            && reqs.keys().any(|k| !caps.contains_key(k))
        {
            return Ok(false);
        }
        let mut consumed = BTreeMap::new();
        for (name, cap) in caps {
            let c = consumed_for(reqs.and_then(|r| r.get(name)), cap)
                .map_err(|e| format!("capacity {name:?}: {e}"))?;
            if c.sign() < 0 {
                return Err(format!("capacity {name:?}: capacity value is negative"));
            }
            consumed.insert(name, c);
        }
        for (name, cap) in caps {
            let c = consumed[name];
            if violates(&c, cap)? {
                return Ok(false);
            }
            let mut total = current
                .get(name)
                .copied()
                .unwrap_or(Quantity::ZERO)
                .add(&c)?;
            if let Some(a) = allocating.and_then(|m| m.get(name)) {
                total = total.add(a)?;
            }
            if total.cmp_q(&q(&cap.value)?) == std::cmp::Ordering::Greater {
                return Ok(false);
            }
        }
        Ok(true)
    }

    pub fn consumed_from_request(
        request: Option<&CapacityRequirements>,
        caps: Option<&BTreeMap<String, DeviceCapacity>>,
    ) -> Result<BTreeMap<String, Quantity>, String> {
        let reqs = request.and_then(|r| r.requests.as_ref());
        let mut out = BTreeMap::new();
        for (name, cap) in caps.into_iter().flatten() {
            out.insert(
                name.clone(),
                consumed_for(reqs.and_then(|r| r.get(name)), cap)?,
            );
        }
        Ok(out)
    }
}
