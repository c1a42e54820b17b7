//! The search: first-fit depth-first over all claims of a pod, requests in order, subrequests of
//! `firstAvailable` in order, devices in pool order, with full backtracking.
use super::allocator::Allocator;
use super::capacity;
use super::constraints::{constraint_add, constraint_remove};
use super::memo::Kept;
use super::pools;
use super::run::{ResultDev, Run};
use super::taints::taint_prevents;
use super::types::{
    ALLOCATION_RESULTS_MAX_SIZE, DevRef, Outcome, ReqKey, SimNode, claim_name, requests_of,
};
use crate::cel::value::quantity::Quantity;
use k8s_openapi::api::resource::v1::{CapacityRequirements, ResourceClaim};
use std::collections::BTreeMap;

impl<'a> Allocator<'a> {
    /// Allocates all `claims` (one pod) on `node`.
    pub fn allocate(&'a self, node: &'a SimNode, claims: &'a [ResourceClaim]) -> Outcome {
        let slices_for_node = self.slices_for_node(node);
        let pools = pools::gather_pools(self, &slices_for_node, node)
            .map_err(|e| format!("gather pool information: {e}"))?;
        self.search(Run::new(self, node, claims, pools, None))
    }

    /// Like [`Allocator::allocate`], with what `kept` holds from earlier calls over the same
    /// slices, classes and nodes (see [`Kept`]); `kept` must be told of every allocation added.
    pub fn allocate_kept(
        &'a self,
        node: &'a SimNode,
        claims: &'a [ResourceClaim],
        kept: &'a Kept,
    ) -> Outcome {
        let pools = kept
            .pools(self, node)
            .map_err(|e| format!("gather pool information: {e}"))?;
        let mut run = Run::new(self, node, claims, pools, Some(kept));
        run.load_kept();
        self.search(run)
    }

    fn search(&'a self, mut run: Run<'a>) -> Outcome {
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

/// Why a branch of the search ends without a solution: a fatal error, or more devices than a
/// claim may hold.
enum Stop {
    Err(String),
    MaxSize,
}

/// The search's position: claim, request, subrequest, and device of that request.
#[derive(Clone, Copy, Default, Debug)]
struct Idx {
    claim: usize,
    request: usize,
    sub: usize,
    device: usize,
}

/// Where the scan over the pools' devices starts: pool, slice, device.
#[derive(Clone, Copy, Default, Debug)]
struct Loc {
    pool: usize,
    slice: usize,
    device: usize,
}

impl<'a> Run<'a> {
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
            return self.allocate_subrequests(r, key);
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
            return self.allocate_all_next(r, key, allocate_sub);
        }
        self.allocate_first_fit(r, key, allocate_sub, admin, start)
    }

    /// A request with `firstAvailable`: its subrequests tried in order, the first that leads to a
    /// solution recorded as selected; `MaxSize` when every one of them exceeds the claim limit.
    fn allocate_subrequests(&mut self, r: Idx, key: ReqKey) -> Result<bool, Stop> {
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

    /// The next device of an `All` request, which must be allocated: it is the one collected
    /// while preparing, not one searched for.
    fn allocate_all_next(&mut self, r: Idx, key: ReqKey, allocate_sub: bool) -> Result<bool, Stop> {
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
            Ok(true) => Ok(true),
            other => {
                self.rollback(r, key, d, undo.expect("undo"));
                other
            }
        }
    }

    /// First fit from `start` on: each device of the gathered pools that is free, selectable and
    /// has the capacity asked for is allocated in turn and the search goes on from the next one;
    /// backtracks when nothing after it leads to a solution.
    fn allocate_first_fit(
        &mut self,
        r: Idx,
        key: ReqKey,
        allocate_sub: bool,
        admin: bool,
        start: Loc,
    ) -> Result<bool, Stop> {
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
        let mut undo = Undo {
            counters: false,
            constraints: 0,
            marked: false,
            capacity: None,
            result: false,
        };
        match self.take_counters(d, multi)? {
            None => return Ok((false, None)),
            Some(taken) => undo.counters = taken,
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
        if !self.add_to_constraints(r.claim, base, sub, d, &mut undo) {
            self.rollback(r, key, d, undo);
            if must {
                let id = self.device_id(d);
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
        self.commit_device(r, key, d, multi, undo)
    }

    /// The second half of `allocate_device`, the device having passed its counters, taints
    /// and constraints: marked as allocated, its capacity checked and a share taken, the result
    /// recorded.
    fn commit_device(
        &mut self,
        r: Idx,
        key: ReqKey,
        d: DevRef,
        multi: bool,
        mut undo: Undo,
    ) -> Result<(bool, Option<Undo>), String> {
        let (admin, parent, name) = {
            let rd = &self.req_data[&key];
            (rd.req.admin_access, rd.req.parent, rd.req.name)
        };
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
                let (id, c) = self.take_share(d, req.capacity)?;
                share_id = Some(id);
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

    /// Takes the counters the device consumes, unless it allows multiple allocations and its
    /// capacity is in use already (the shares before it took them): `None` when they are not
    /// available, else whether any were taken.
    fn take_counters(&mut self, d: DevRef, multi: bool) -> Result<Option<bool>, String> {
        let dev = self.device(d);
        // the owned id (three strings) only when the index says the device may be shared
        let shared_before = || {
            if !self.maybe_allocated(d) {
                return false;
            }
            let id = self.device_id(d);
            self.a.allocated.capacity.contains_key(&id) || self.a.allocated.shared.contains(&id)
        };
        let capacity_in_use =
            multi && (self.allocating_capacity.contains_key(&d) || shared_before());
        let skip_counters = multi && capacity_in_use;
        if !skip_counters
            && dev
                .consumes_counters
                .as_ref()
                .is_some_and(|c| !c.is_empty())
        {
            if !self.check_counters(d)? {
                return Ok(None);
            }
            return Ok(Some(true));
        }
        Ok(Some(false))
    }

    /// Adds the device to each of the claim's constraints in turn, counting in `undo` those it
    /// was added to; false at the first it would not satisfy.
    fn add_to_constraints(
        &mut self,
        claim: usize,
        base: &str,
        sub: Option<&str>,
        d: DevRef,
        undo: &mut Undo,
    ) -> bool {
        let dev = self.device(d);
        let driver = self.pools[d.pool].driver;
        let n_cons = self.constraints[claim].len();
        for ci in 0..n_cons {
            let ok = constraint_add(&mut self.constraints[claim][ci], base, sub, dev, driver);
            if !ok {
                return false;
            }
            undo.constraints += 1;
        }
        true
    }

    /// A new share of a device that allows multiple allocations: its share ID and the capacity
    /// the request consumes, added to what the pod is allocating on the device.
    fn take_share(
        &mut self,
        d: DevRef,
        request: Option<&CapacityRequirements>,
    ) -> Result<(String, BTreeMap<String, Quantity>), String> {
        let dev = self.device(d);
        let c = capacity::consumed_from_request(request, dev.capacity.as_ref())?;
        self.share_seq += 1;
        let share_id = format!("00000000-0000-4000-8000-{:012x}", self.share_seq);
        let entry = self.allocating_capacity.entry(d).or_default();
        for (k, v) in &c {
            let e = entry.entry(k.clone()).or_insert(Quantity::ZERO);
            *e = e.add(v)?;
        }
        Ok((share_id, c))
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
}

/// What allocating one device changed, for `rollback` to take back.
struct Undo {
    counters: bool,
    constraints: usize,
    marked: bool,
    capacity: Option<BTreeMap<String, Quantity>>,
    result: bool,
}
