//! Shared counters: what a pool has left after the allocated claims, and what the devices being
//! allocated consume from it.
//!
//! Upstream checks every counter set of the pool after each device. A set's outcome changes only
//! when what is consumed from it changes, so the run keeps, per pool, the sets that are overdrawn
//! and updates only those the device consumes from: the same answer without the walk.
use super::memo::KeptAvail;
use super::run::Run;
use super::types::{Counters, DevRef, SharedCounters};
use crate::cel::value::quantity::Quantity;
use std::collections::{BTreeMap, BTreeSet};

impl<'a> Run<'a> {
    /// What the run keeps of each pool (computed and kept for those it does not hold yet).
    pub(super) fn load_kept(&mut self) {
        let Some(kept) = self.kept else { return };
        for pi in 0..self.pools.len() {
            let pool = &self.pools[pi];
            let k = match kept.available(pool.driver, pool.name, &self.node.name) {
                Some(k) => k,
                None => {
                    let counters = self.compute_available(pi).into_arc();
                    let k = KeptAvail {
                        driver: pool.driver.to_string(),
                        pool: pool.name.to_string(),
                        node: self.node.name.clone(),
                        overdrawn: overdrawn_at_start(&counters).into_iter().collect(),
                        counters,
                        used: self.compute_used(pi),
                    };
                    kept.keep_available(k)
                }
            };
            self.kept_pools.push(Some(k));
        }
    }

    /// Makes sure the pool's available counters (and its overdrawn sets) are known.
    fn available(&mut self, pool_idx: usize) {
        if self.available_counters.contains_key(&pool_idx) {
            return;
        }
        if let Some(Some(k)) = self.kept_pools.get(pool_idx) {
            let over = k.overdrawn.iter().cloned().collect();
            let counters = SharedCounters::Shared(k.counters.clone());
            self.available_counters.insert(pool_idx, counters);
            self.overdrawn.insert(pool_idx, over);
            return;
        }
        let avail = self.compute_available(pool_idx);
        self.overdrawn.insert(pool_idx, overdrawn_at_start(&avail));
        self.available_counters.insert(pool_idx, avail);
    }

    /// Per slice of the pool, whether the allocated claims hold each device; `None` when the
    /// pool has nothing allocated.
    fn compute_used(&self, pool_idx: usize) -> Option<Vec<(usize, Vec<bool>)>> {
        let pool = &self.pools[pool_idx];
        if !self.a.allocated.pool_maybe_used(pool.driver, pool.name) {
            return None;
        }
        let al = &self.a.allocated;
        let slice_used = |gs: usize| {
            let s = &self.a.slices[gs];
            let (driver, p) = (&s.spec.driver, &s.spec.pool.name);
            let used = s.spec.devices.iter().flatten().map(|dev| {
                if !al.maybe_used(driver, p, &dev.name) {
                    return false;
                }
                let id = (driver.clone(), p.clone(), dev.name.clone());
                al.devices.contains(&id) || al.shared.contains(&id) || al.capacity.contains_key(&id)
            });
            (gs, used.collect())
        };
        Some(pool.slices.iter().map(|&(gs, _)| slice_used(gs)).collect())
    }

    fn compute_available(&self, pool_idx: usize) -> SharedCounters<'a> {
        let pool = &self.pools[pool_idx];
        // Shared with the pool (and its cache) until a device allocated earlier takes some.
        let mut avail = pool.counter_sets.share();
        // most pools of a large cluster have nothing allocated: no scan over their devices
        if !self.a.allocated.pool_maybe_used(pool.driver, pool.name) {
            return avail;
        }
        for &(gs, _) in pool.slices.iter().chain(pool.not_targeting.iter()) {
            let s = &self.a.slices[gs];
            for dev in s.spec.devices.iter().flatten() {
                let p = &s.spec.pool.name;
                if !self.a.allocated.maybe_used(&s.spec.driver, p, &dev.name) {
                    continue;
                }
                let id = (s.spec.driver.clone(), p.clone(), dev.name.clone());
                if !(self.a.allocated.devices.contains(&id)
                    || self.a.allocated.shared.contains(&id))
                {
                    continue;
                }
                for cc in dev.consumes_counters.iter().flatten() {
                    if let Some(set) = avail.to_mut().get_mut(&cc.counter_set) {
                        for (n, c) in &cc.counters {
                            if let (Some(e), Ok(q)) = (set.get_mut(n), Quantity::parse(&c.value.0))
                            {
                                *e = e.sub(&q).unwrap_or(*e);
                            }
                        }
                    }
                }
            }
        }
        avail
    }

    /// The counters the device consumes, parsed, when the run keeps them.
    fn parsed(&self, d: DevRef) -> Option<std::sync::Arc<[Quantity]>> {
        let gslice = self.pools[d.pool].slices[d.slice].0;
        self.kept?.consumption(self.a.slices, gslice, d.device)
    }

    pub(super) fn check_counters(&mut self, d: DevRef) -> Result<bool, String> {
        let dev = self.device(d);
        self.available(d.pool);
        let parsed = self.parsed(d);
        let consumed = self.consumed_counters.entry(d.pool).or_default();
        let mut res = Ok(());
        let mut i = 0;
        'add: for cc in dev.consumes_counters.iter().flatten() {
            if !consumed.contains_key(&cc.counter_set) {
                consumed.insert(cc.counter_set.clone(), BTreeMap::new());
            }
            let set = consumed.get_mut(&cc.counter_set).expect("inserted");
            for (n, c) in &cc.counters {
                let q = match &parsed {
                    Some(p) => Ok(p[i]),
                    None => Quantity::parse(&c.value.0),
                };
                i += 1;
                let q = q.and_then(|q| match set.get_mut(n) {
                    Some(e) => e.add(&q).map(|x| *e = x),
                    None => {
                        set.insert(n.clone(), q);
                        Ok(())
                    }
                });
                if let Err(e) = q {
                    res = Err(e);
                    break 'add;
                }
            }
        }
        // even after an error, as what was added so far stays consumed
        self.update_overdrawn(d);
        res?;
        let ok = self.overdrawn[&d.pool].is_empty();
        if !ok {
            self.release_counters(d);
        }
        Ok(ok)
    }

    /// Whether each set the device consumes from is overdrawn now.
    fn update_overdrawn(&mut self, d: DevRef) {
        let dev = self.device(d);
        let avail = &self.available_counters[&d.pool];
        let consumed = self.consumed_counters.get(&d.pool);
        let over = self.overdrawn.entry(d.pool).or_default();
        for cc in dev.consumes_counters.iter().flatten() {
            let name = &cc.counter_set;
            if set_overdrawn(avail, consumed, name) {
                if !over.contains(name) {
                    over.insert(name.clone());
                }
            } else {
                over.remove(name);
            }
        }
    }

    pub(super) fn release_counters(&mut self, d: DevRef) {
        let dev = self.device(d);
        let parsed = self.parsed(d);
        if let Some(consumed) = self.consumed_counters.get_mut(&d.pool) {
            let mut i = 0;
            for cc in dev.consumes_counters.iter().flatten() {
                let set = consumed.get_mut(&cc.counter_set);
                let Some(set) = set else {
                    i += cc.counters.len();
                    continue;
                };
                for (n, c) in &cc.counters {
                    let q = match &parsed {
                        Some(p) => Ok(p[i]),
                        None => Quantity::parse(&c.value.0),
                    };
                    i += 1;
                    if let (Some(e), Ok(q)) = (set.get_mut(n), q) {
                        *e = e.sub(&q).unwrap_or(*e);
                    }
                }
            }
        }
        if self.available_counters.contains_key(&d.pool) {
            self.update_overdrawn(d);
        }
    }
}

/// The sets overdrawn before anything is consumed: those with a counter below zero.
fn overdrawn_at_start(avail: &Counters) -> BTreeSet<String> {
    avail
        .iter()
        .filter(|(_, cs)| {
            cs.values()
                .any(|q| q.cmp_q(&Quantity::ZERO) == std::cmp::Ordering::Less)
        })
        .map(|(n, _)| n.clone())
        .collect()
}

/// Whether any counter of the set is below what is consumed from it (a set the pool lacks never
/// is: upstream walks the available sets).
fn set_overdrawn(avail: &Counters, consumed: Option<&Counters>, name: &str) -> bool {
    let Some(counters) = avail.get(name) else {
        return false;
    };
    let cs = consumed.and_then(|c| c.get(name));
    counters.iter().any(|(cn, av)| {
        let used = cs
            .and_then(|m| m.get(cn))
            .copied()
            .unwrap_or(Quantity::ZERO);
        av.cmp_q(&used) == std::cmp::Ordering::Less
    })
}
