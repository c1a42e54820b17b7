//! Shared counters: what a pool has left after the allocated claims, and what the devices being
//! allocated consume from it.
use super::run::Run;
use super::types::{Counters, DevRef};
use crate::cel::value::quantity::Quantity;
use std::borrow::Cow;
use std::collections::BTreeMap;

impl<'a> Run<'a> {
    fn available(&mut self, pool_idx: usize) -> &Counters {
        if !self.available_counters.contains_key(&pool_idx) {
            let pool = &self.pools[pool_idx];
            // Shared with the pool (and its cache) until a device allocated earlier takes some.
            let mut avail: Cow<'a, Counters> = match &pool.counter_sets {
                Cow::Borrowed(sets) => Cow::Borrowed(*sets),
                Cow::Owned(sets) => Cow::Owned(sets.clone()),
            };
            // most pools of a large cluster have nothing allocated: no scan over their devices
            let nothing_allocated = !self.a.allocated.pool_maybe_used(pool.driver, pool.name);
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

    pub(super) fn check_counters(&mut self, d: DevRef) -> Result<bool, String> {
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

    pub(super) fn release_counters(&mut self, d: DevRef) {
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
}
