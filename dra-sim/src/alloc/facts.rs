//! What is known about the slices before any claim: per-slice facts ([`SliceFacts`]) and the
//! per-device outcome of class selectors ([`DeviceCache`]), shareable between allocators.
use super::types::{Counters, FastMap, FastSet, prefetch};
use crate::cel::{self, value::quantity::Quantity};
use k8s_openapi::api::resource::v1::ResourceSlice;
use std::sync::{Arc, Mutex, OnceLock};

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
    pub(super) checks: Vec<PerDevice<OnceLock<Result<(), String>>>>,
    /// per slice: parsed shared counters (counter set -> counter -> quantity)
    counters: Vec<OnceLock<Counters>>,
    /// per slice: the first device name that occurs twice in it
    dup_name: Vec<OnceLock<Option<String>>>,
    /// per slice: the counters its devices consume, by counter set, in order of first use
    counter_refs: Vec<OnceLock<CounterRefs>>,
    /// per set of device slices of one pool: the first device name found twice
    dup_across: Mutex<FastMap<Vec<usize>, Option<String>>>,
}

pub(super) type CounterRefs = Vec<(String, Vec<String>)>;

/// One entry per device of a slice, made when the slice is first reached.
type PerDevice<T> = OnceLock<Box<[T]>>;

/// class name -> all of the class's selectors true on the device
pub(super) type ClassOutcomes = Mutex<Vec<(String, bool)>>;

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

    pub(super) fn check<'d>(
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

    pub(super) fn counters(&self, slices: &[ResourceSlice], i: usize) -> &Counters {
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

    pub(super) fn counter_refs(&self, slices: &[ResourceSlice], i: usize) -> &CounterRefs {
        self.counter_refs[i]
            .get_or_init(|| counter_refs_of(slices[i].spec.devices.as_deref().unwrap_or(&[])))
    }

    pub(super) fn dup_name(&self, slices: &[ResourceSlice], i: usize) -> Option<&str> {
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

    pub(super) fn dup_name_across(
        &self,
        slices: &[ResourceSlice],
        device_slices: &[usize],
    ) -> Option<String> {
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
    pub(super) facts: Arc<SliceFacts>,
    /// per slice, per device: class name -> all class selectors true
    pub(super) class_ok: Vec<PerDevice<ClassOutcomes>>,
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

    pub(super) fn class_ok(
        &self,
        slices: &[ResourceSlice],
        slice: usize,
        device: usize,
    ) -> &ClassOutcomes {
        &self.class_ok[slice].get_or_init(|| {
            (0..slices[slice].spec.devices.as_ref().map_or(0, |d| d.len()))
                .map(|_| Mutex::default())
                .collect()
        })[device]
    }
}

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
