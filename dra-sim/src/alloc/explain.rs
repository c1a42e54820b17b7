//! "Why not": per request and subrequest, how many devices on the node passed each stage.
use super::allocator::Allocator;
use super::constraints::{constraint_add, constraint_remove};
use super::pools::{Pool, gather_pools};
use super::run::Run;
use super::taints::taint_prevents;
use super::types::{DevRef, Req, ReqKey, SimNode, claim_name, class_spec};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct StageCounts {
    pub claim: String,
    pub request: String,
    pub considered: usize,
    pub class_selectors: usize,
    pub request_selectors: usize,
    pub not_in_use: usize,
    pub capacity: usize,
    pub counters: usize,
    pub taints: usize,
    pub constraints: usize,
    pub wanted: String,
    pub errors: Vec<String>,
    pub pool_problems: Vec<String>,
}

impl<'a> Allocator<'a> {
    /// Counts, for each request/subrequest of each claim, the devices of `node` that pass each check
    /// in the allocator's order, each device checked on its own (no other request allocated).
    pub fn explain(&'a self, node: &'a SimNode, claims: &'a [ResourceClaim]) -> Vec<StageCounts> {
        let mut out = Vec::new();
        let slices_for_node = self.slices_for_node(node);
        let pools = match gather_pools(self, &slices_for_node, node) {
            Ok(p) => p,
            Err(e) => {
                out.push(StageCounts {
                    errors: vec![e],
                    ..Default::default()
                });
                return out;
            }
        };
        let pool_problems = pool_problems(&pools);
        let mut run = Run::new(self, node, claims, pools, None);
        if let Err(e) = run.prepare() {
            out.push(StageCounts {
                errors: vec![e],
                pool_problems,
                ..Default::default()
            });
            return out;
        }
        let mut keys: Vec<ReqKey> = run.req_data.keys().copied().collect();
        keys.sort_by_key(|k| (k.claim, k.request, k.sub));
        for key in keys {
            out.push(run.explain_request(key, &pool_problems));
        }
        out
    }
}

/// The pools on the node that the search skips: incomplete or invalid ones.
fn pool_problems(pools: &[Pool<'_>]) -> Vec<String> {
    pools
        .iter()
        .filter_map(|p| {
            if p.incomplete {
                Some(format!(
                    "pool {} is incomplete (being updated)",
                    p.id_string()
                ))
            } else {
                p.invalid
                    .as_ref()
                    .map(|r| format!("pool {} is invalid: {r}", p.id_string()))
            }
        })
        .collect()
}

impl<'a> Run<'a> {
    /// The stage counts of one request or subrequest over every device of the usable pools.
    fn explain_request(&mut self, key: ReqKey, pool_problems: &[String]) -> StageCounts {
        let rd = &self.req_data[&key];
        let req = rd.req.clone();
        let class = rd.class;
        let mut sc = StageCounts {
            claim: claim_name(&self.claims[key.claim]),
            request: req.full_name(),
            wanted: if req.all {
                "all".into()
            } else {
                req.count.to_string()
            },
            pool_problems: pool_problems.to_vec(),
            ..Default::default()
        };
        for pi in 0..self.pools.len() {
            if self.pools[pi].incomplete || self.pools[pi].invalid.is_some() {
                continue;
            }
            for si in 0..self.pools[pi].slices.len() {
                for di in 0..self.pools[pi].devices(si).len() {
                    let d = DevRef {
                        pool: pi,
                        slice: si,
                        device: di,
                    };
                    sc.considered += 1;
                    self.explain_device(key, &req, class, d, &mut sc);
                }
            }
        }
        sc
    }

    /// Takes one device through the checks in order, counting in `sc` each it passes, up to the
    /// first it fails.
    fn explain_device(
        &mut self,
        key: ReqKey,
        req: &Req<'a>,
        class: Option<&'a DeviceClass>,
        d: DevRef,
        sc: &mut StageCounts,
    ) {
        let n_cons = self.constraints[key.claim].len();
        let cls = class
            .map(|c| class_spec(c).selectors.as_deref().unwrap_or(&[]))
            .unwrap_or(&[]);
        match self.selectors_match(key, d, class, cls) {
            Ok(true) => sc.class_selectors += 1,
            Ok(false) => return,
            Err(e) => {
                if sc.errors.len() < 3 {
                    sc.errors.push(e);
                }
                return;
            }
        }
        match self.selectors_match(key, d, None, req.selectors) {
            Ok(true) => sc.request_selectors += 1,
            Ok(false) => return,
            Err(e) => {
                if sc.errors.len() < 3 {
                    sc.errors.push(e);
                }
                return;
            }
        }
        if !req.admin_access && self.in_use(d) {
            return;
        }
        sc.not_in_use += 1;
        if !self.capacity_fits(req, d, false).unwrap_or(false) {
            return;
        }
        sc.capacity += 1;
        let dev = self.device(d);
        if dev
            .consumes_counters
            .as_ref()
            .is_some_and(|c| !c.is_empty())
        {
            if !self.check_counters(d).unwrap_or(false) {
                return;
            }
            self.release_counters(d);
        }
        sc.counters += 1;
        if taint_prevents(dev, req.tolerations) {
            return;
        }
        sc.taints += 1;
        let driver = self.pools[d.pool].driver;
        let (base, sub) = match req.parent {
            None => (req.name, None),
            Some(p) => (p, Some(req.name)),
        };
        let mut ok = true;
        let mut added = 0;
        for ci in 0..n_cons {
            if constraint_add(&mut self.constraints[key.claim][ci], base, sub, dev, driver) {
                added += 1;
            } else {
                ok = false;
                break;
            }
        }
        for ci in (0..added).rev() {
            constraint_remove(&mut self.constraints[key.claim][ci], base, sub);
        }
        if ok {
            sc.constraints += 1;
        }
    }
}
