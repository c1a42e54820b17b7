//! One allocation attempt on one node ([`Run`]): the gathered pools, the normalized requests, the
//! state the search changes, and the per-device checks every phase uses (selectors, in use,
//! capacity).
use super::allocator::Allocator;
use super::capacity;
use super::constraints::Constraint;
use super::memo::{Kept, KeptAvail};
use super::pools::{Pool, node_matches};
use super::types::{
    Counters, DevRef, DeviceId, FastMap, Req, ReqData, ReqKey, SharedCounters, SimNode, claim_name,
    class_spec,
};
use crate::cel::{self, value::quantity::Quantity};
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceSelector, ResourceClaim};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Marks a kept outcome as the capacity check's rather than selectors' (no selector list is this
/// long).
const CAPACITY_KEY: usize = usize::MAX;
/// The same for a class's selectors, the key's address being the class's.
const CLASS_KEY: usize = usize::MAX - 1;

/// One attempt at allocating a pod's claims on one node.
pub(crate) struct Run<'a> {
    pub a: &'a Allocator<'a>,
    pub node: &'a SimNode,
    pub claims: &'a [ResourceClaim],
    pub pools: Vec<Pool<'a>>,
    pub req_data: FastMap<ReqKey, ReqData<'a>>,
    pub(super) constraints: Vec<Vec<Constraint<'a>>>,
    pub(super) matches: FastMap<(DevRef, ReqKey), bool>,
    pub(super) allocating: FastMap<DevRef, Vec<usize>>,
    pub(super) allocating_capacity: FastMap<DevRef, BTreeMap<String, Quantity>>,
    pub(super) consumed_counters: FastMap<usize, Counters>,
    pub(super) available_counters: FastMap<usize, SharedCounters<'a>>,
    /// per pool, the counter sets of which more is consumed than is available
    pub(super) overdrawn: FastMap<usize, BTreeSet<String>>,
    pub(super) kept: Option<&'a Kept>,
    /// per pool, what `kept` holds of it (loaded by `load_kept`)
    pub(super) kept_pools: Vec<Option<Arc<KeptAvail>>>,
    pub(super) results: Vec<Vec<ResultDev<'a>>>,
    pub(super) share_seq: u64,
}

/// A device allocated to a request (or subrequest), as the search records it.
pub(super) struct ResultDev<'a> {
    pub req_name: &'a str,
    pub parent: Option<&'a str>,
    pub dev: DevRef,
    pub admin: bool,
    pub share_id: Option<String>,
    pub consumed: Option<BTreeMap<String, Quantity>>,
}

impl<'a> Run<'a> {
    /// A run over the pools gathered for `node`, nothing prepared or allocated yet.
    pub(super) fn new(
        a: &'a Allocator<'a>,
        node: &'a SimNode,
        claims: &'a [ResourceClaim],
        pools: Vec<Pool<'a>>,
        kept: Option<&'a Kept>,
    ) -> Self {
        Run {
            a,
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
            overdrawn: FastMap::default(),
            kept,
            kept_pools: Vec::new(),
            results: claims.iter().map(|_| Vec::new()).collect(),
            share_seq: 0,
        }
    }

    pub(super) fn device(&self, d: DevRef) -> &'a k8s_openapi::api::resource::v1::Device {
        &self.pools[d.pool].devices(d.slice)[d.device]
    }

    pub(super) fn device_id(&self, d: DevRef) -> DeviceId {
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
    pub(super) fn program(&self, expr: &str) -> Arc<Result<cel::Program, String>> {
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
            // the run's own copy first: no lock, no name compared
            let kkey = (class as *const DeviceClass as usize, CLASS_KEY, gslice);
            let kept = self.kept.and_then(|k| k.selected(kkey, d.device));
            let ok = match kept.or_else(|| self.a.class_result(gslice, d.device, cname)) {
                Some(ok) => ok,
                None => {
                    let sels = class_spec(class).selectors.as_deref().unwrap_or(&[]);
                    let ok = self.selectors_match(key, d, Some(class), sels)?;
                    self.a.set_class_result(gslice, d.device, cname, ok);
                    ok
                }
            };
            if let Some(k) = self.kept
                && kept.is_none()
            {
                let n = self.pools[d.pool].devices(d.slice).len();
                k.keep_selected(kkey, n, d.device, ok);
            }
            if !ok {
                self.matches.insert((d, key), false);
                return Ok(false);
            }
        }
        if !self.claim_selectors_match(key, rd, d)? {
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

    /// The claim's own selectors on the device, from what is kept when a run keeps outcomes
    /// (the claims outlive it, so their selectors' address names them).
    fn claim_selectors_match(
        &self,
        key: ReqKey,
        rd: &ReqData<'a>,
        d: DevRef,
    ) -> Result<bool, String> {
        let sels = rd.req.selectors;
        let Some(kept) = self.kept.filter(|_| !sels.is_empty()) else {
            return self.selectors_match(key, d, None, sels);
        };
        let gslice = self.pools[d.pool].slices[d.slice].0;
        let k = (sels.as_ptr() as usize, sels.len(), gslice);
        if let Some(ok) = kept.selected(k, d.device) {
            return Ok(ok);
        }
        let ok = self.selectors_match(key, d, None, sels)?;
        let n = self.pools[d.pool].devices(d.slice).len();
        kept.keep_selected(k, n, d.device, ok);
        Ok(ok)
    }

    pub(super) fn in_use(&self, d: DevRef) -> bool {
        if self.allocating.get(&d).is_some_and(|v| !v.is_empty()) {
            return true;
        }
        if !self.maybe_allocated(d) {
            return false;
        }
        self.a.allocated.devices.contains(&self.device_id(d))
    }

    /// Whether an allocated claim may hold the device (false: certainly none does), from what
    /// the run keeps of the pool when it keeps it, else from the allocated state's index.
    pub(super) fn maybe_allocated(&self, d: DevRef) -> bool {
        if let Some(Some(k)) = self.kept_pools.get(d.pool) {
            return k.used(self.pools[d.pool].slices[d.slice].0, d.device);
        }
        let p = &self.pools[d.pool];
        self.a
            .allocated
            .maybe_used(p.driver, p.name, &self.device(d).name)
    }

    pub(super) fn allocating_for_claim(&self, d: DevRef, claim: usize) -> bool {
        self.allocating.get(&d).is_some_and(|v| v.contains(&claim))
    }

    /// `CmpRequestOverCapacity` for the current state (or an empty state when `empty`).
    pub(super) fn capacity_fits(
        &self,
        req: &Req<'a>,
        d: DevRef,
        empty: bool,
    ) -> Result<bool, String> {
        let dev = self.device(d);
        let caps = dev.capacity.as_ref();
        let held = !empty && self.maybe_allocated(d);
        let allocating = if empty {
            None
        } else {
            self.allocating_capacity.get(&d)
        };
        // nothing held or being allocated: the answer depends on the request and the device only
        let kept = self.kept.filter(|_| !held && allocating.is_none());
        let key = kept.map(|_| {
            let addr = req.capacity.map_or(0, |c| c as *const _ as usize);
            (addr, CAPACITY_KEY, self.pools[d.pool].slices[d.slice].0)
        });
        if let (Some(k), Some(key)) = (kept, key)
            && let Some(ok) = k.selected(key, d.device)
        {
            return Ok(ok);
        }
        // the owned id (three strings) only when the index says the device may hold shares
        let current: BTreeMap<String, Quantity> = if !held {
            BTreeMap::new()
        } else {
            let id = self.device_id(d);
            self.a
                .allocated
                .capacity
                .get(&id)
                .cloned()
                .unwrap_or_default()
        };
        let fits = capacity::cmp_request_over_capacity(&current, req.capacity, caps, allocating);
        if let (Some(k), Some(key), Ok(ok)) = (kept, key, &fits) {
            let n = self.pools[d.pool].devices(d.slice).len();
            k.keep_selected(key, n, d.device, *ok);
        }
        fits.map_err(|e| {
            let id = self.device_id(d);
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
}
