//! The vocabulary every phase of the allocator shares: device and request identities, the
//! normalized request, the node, the search's hash maps, and accessors on claims and classes.
use crate::cel::value::quantity::Quantity;
use k8s_openapi::api::resource::v1::{
    AllocationResult, CapacityRequirements, DeviceClass, DeviceSelector, DeviceToleration,
    ResourceClaim,
};
use std::collections::{BTreeMap, HashMap, HashSet};

pub const ALLOCATION_RESULTS_MAX_SIZE: usize = 32;

/// (driver, pool, device)
pub type DeviceId = (String, String, String);

/// What the allocator reports: per-claim results, `None` for "no solution on this node", or a
/// fatal error (bad CEL, missing class, ...).
pub type Outcome = Result<Option<Vec<AllocationResult>>, String>;

/// A node as the allocator sees it: its name and labels.
#[derive(Clone, Debug, Default)]
pub struct SimNode {
    pub name: String,
    pub labels: BTreeMap<String, String>,
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
    pub mode: &'a str,
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

/// counter set -> counter -> quantity
pub(super) type Counters = BTreeMap<String, BTreeMap<String, Quantity>>;

/// Counter sets borrowed from the slice facts, shared with what a long run keeps between Filter
/// calls (see `memo`), or owned once changed.
pub enum SharedCounters<'a> {
    Borrowed(&'a Counters),
    Shared(std::sync::Arc<Counters>),
    Owned(Counters),
}

impl std::ops::Deref for SharedCounters<'_> {
    type Target = Counters;
    fn deref(&self) -> &Counters {
        match self {
            SharedCounters::Borrowed(c) => c,
            SharedCounters::Shared(c) => c,
            SharedCounters::Owned(c) => c,
        }
    }
}

impl SharedCounters<'_> {
    /// The sets to change, copied first unless owned already.
    pub fn to_mut(&mut self) -> &mut Counters {
        if !matches!(self, SharedCounters::Owned(_)) {
            *self = SharedCounters::Owned((**self).clone());
        }
        match self {
            SharedCounters::Owned(c) => c,
            _ => unreachable!("made owned above"),
        }
    }

    /// Another handle on the same sets: a copy only of owned ones.
    pub fn share(&self) -> Self {
        match self {
            SharedCounters::Borrowed(c) => SharedCounters::Borrowed(c),
            SharedCounters::Shared(c) => SharedCounters::Shared(c.clone()),
            SharedCounters::Owned(c) => SharedCounters::Owned(c.clone()),
        }
    }

    pub fn into_arc(self) -> std::sync::Arc<Counters> {
        match self {
            SharedCounters::Shared(c) => c,
            other => std::sync::Arc::new((*other).clone()),
        }
    }
}

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

pub(crate) type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<FastHasher>>;
pub(crate) type FastSet<K> = HashSet<K, std::hash::BuildHasherDefault<FastHasher>>;

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
