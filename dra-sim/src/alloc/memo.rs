//! What a run over many pods keeps between Filter calls ([`Kept`]), for a cluster whose slices,
//! classes and nodes stay the same while claims are allocated (`cluster::ClusterRun`):
//! - each node's gathered pools: they depend on the slices and the node only;
//! - each pool's counters left after the allocated claims, dropped for the pools an allocation
//!   touches ([`Kept::allocated`]);
//! - the outcome of a claim's and a class's selectors on each device: selectors read the
//!   device only; and of the capacity check on a device nothing holds: it reads the request and
//!   the device only;
//! - each device's counter consumption, parsed.
//!
//! The claims and classes must outlive the `Kept`: their addresses name them.
//!
//! Each is what the allocator would compute anew on the call, so the outcomes do not change.
use super::allocator::Allocator;
use super::pools::{Pool, gather_pools};
use super::types::{Counters, FastMap, SharedCounters, SimNode};
use crate::cel::value::quantity::Quantity;
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceSlice};
use std::cell::RefCell;
use std::sync::Arc;

/// A gathered pool without borrows, rebuilt into a [`Pool`] for each call.
struct PoolPlan {
    rep: usize,
    incomplete: bool,
    invalid: Option<String>,
    slices: Vec<(usize, i64)>,
    not_targeting: Vec<(usize, i64)>,
    counter_sets: Arc<Counters>,
}

/// A device's counter consumption, parsed.
type Parsed = Arc<[Quantity]>;

/// A node's pools, or why gathering them failed.
type Gathered = Result<Vec<PoolPlan>, String>;

/// A pool as one node sees it: its counters left after the allocated claims, the counter sets
/// already overdrawn, and which of its devices the allocated claims hold.
pub(super) struct KeptAvail {
    pub driver: String,
    pub pool: String,
    /// the node whose view of the pool this is (pools shared by nodes may differ in slices)
    pub node: String,
    pub counters: Arc<Counters>,
    pub overdrawn: Vec<String>,
    /// `None` when nothing is allocated in the pool; else (global slice, per device: allocated
    /// or shared) for the slices the node sees
    pub used: Option<Vec<(usize, Vec<bool>)>>,
}

impl KeptAvail {
    /// Whether an allocated claim may hold the device (true when not known).
    pub fn used(&self, slice: usize, device: usize) -> bool {
        let Some(used) = &self.used else {
            return false;
        };
        used.iter()
            .find(|(s, _)| *s == slice)
            .is_none_or(|(_, v)| v.get(device).copied().unwrap_or(true))
    }
}

/// See the module documentation. Not shared between threads: each keeps its own.
#[derive(Default)]
pub struct Kept {
    pools: RefCell<FastMap<String, Arc<Gathered>>>,
    /// by the pool's id hash: each node's view of the pool
    avail: RefCell<FastMap<u64, Vec<Arc<KeptAvail>>>>,
    /// (selectors' address, their number, global slice) -> per device: 0 unknown, 1 no, 2 yes;
    /// also (capacity request's address, `CAPACITY_KEY`, global slice)
    selected: RefCell<FastMap<(usize, usize, usize), Vec<u8>>>,
    /// (global slice, device) -> each counter it consumes, parsed, in the slice's order
    consumption: RefCell<FastMap<(usize, usize), Parsed>>,
}

impl Kept {
    /// The pools gathered for `node`, from what is kept or gathered now and kept.
    pub(super) fn pools<'a>(
        &self,
        a: &'a Allocator<'a>,
        node: &'a SimNode,
    ) -> Result<Vec<Pool<'a>>, String> {
        let hit = self.pools.borrow().get(node.name.as_str()).cloned();
        let plans = match hit {
            Some(p) => p,
            None => {
                let gathered = gather_pools(a, &a.slices_for_node(node), node);
                let plans = Arc::new(gathered.map(|v| v.into_iter().map(plan).collect()));
                self.pools
                    .borrow_mut()
                    .insert(node.name.clone(), plans.clone());
                plans
            }
        };
        match plans.as_ref() {
            Ok(v) => Ok(v.iter().map(|p| rebuild(p, a.slices)).collect()),
            Err(e) => Err(e.clone()),
        }
    }

    pub(super) fn available(&self, driver: &str, pool: &str, node: &str) -> Option<Arc<KeptAvail>> {
        let h = super::allocator::id_hash(driver, pool, None);
        let m = self.avail.borrow();
        m.get(&h)?
            .iter()
            .find(|k| k.node == node && k.driver == driver && k.pool == pool)
            .cloned()
    }

    pub(super) fn keep_available(&self, k: KeptAvail) -> Arc<KeptAvail> {
        let h = super::allocator::id_hash(&k.driver, &k.pool, None);
        let k = Arc::new(k);
        self.avail
            .borrow_mut()
            .entry(h)
            .or_default()
            .push(k.clone());
        k
    }

    /// Forgets the counters of the pools `allocation` takes devices from.
    pub fn allocated(&self, allocation: &AllocationResult) {
        let results = allocation.devices.as_ref().and_then(|d| d.results.as_ref());
        let mut m = self.avail.borrow_mut();
        for r in results.into_iter().flatten() {
            m.remove(&super::allocator::id_hash(&r.driver, &r.pool, None));
        }
    }

    /// The kept outcome of `selectors` (by address) on a device, if any.
    pub(super) fn selected(&self, key: (usize, usize, usize), device: usize) -> Option<bool> {
        let m = self.selected.borrow();
        match m.get(&key).and_then(|v| v.get(device)) {
            Some(1) => Some(false),
            Some(2) => Some(true),
            _ => None,
        }
    }

    pub(super) fn keep_selected(
        &self,
        key: (usize, usize, usize),
        devices: usize,
        device: usize,
        ok: bool,
    ) {
        let mut m = self.selected.borrow_mut();
        let v = m.entry(key).or_insert_with(|| vec![0; devices]);
        if let Some(x) = v.get_mut(device) {
            *x = if ok { 2 } else { 1 };
        }
    }
}

impl Kept {
    /// The counters device `device` of global slice `slice` consumes, parsed in order (`None`
    /// when one does not parse: the caller parses and reports it).
    pub(super) fn consumption(
        &self,
        slices: &[ResourceSlice],
        slice: usize,
        device: usize,
    ) -> Option<Parsed> {
        if let Some(c) = self.consumption.borrow().get(&(slice, device)) {
            return Some(c.clone());
        }
        let dev = &slices[slice].spec.devices.as_ref()?[device];
        let parsed: Result<Vec<Quantity>, String> = dev
            .consumes_counters
            .iter()
            .flatten()
            .flat_map(|cc| cc.counters.values())
            .map(|c| Quantity::parse(&c.value.0))
            .collect();
        let parsed: Parsed = parsed.ok()?.into();
        self.consumption
            .borrow_mut()
            .insert((slice, device), parsed.clone());
        Some(parsed)
    }
}

fn plan(p: Pool<'_>) -> PoolPlan {
    PoolPlan {
        rep: p.rep,
        incomplete: p.incomplete,
        invalid: p.invalid,
        slices: p.slices,
        not_targeting: p.not_targeting,
        counter_sets: p.counter_sets.into_arc(),
    }
}

fn rebuild<'a>(p: &PoolPlan, all: &'a [ResourceSlice]) -> Pool<'a> {
    let spec = &all[p.rep].spec;
    Pool {
        driver: &spec.driver,
        name: &spec.pool.name,
        incomplete: p.incomplete,
        invalid: p.invalid.clone(),
        slices: p.slices.clone(),
        not_targeting: p.not_targeting.clone(),
        counter_sets: SharedCounters::Shared(p.counter_sets.clone()),
        rep: p.rep,
        all,
    }
}
