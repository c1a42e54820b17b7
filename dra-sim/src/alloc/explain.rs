//! "Why not": per request and subrequest, how many devices on the node passed each stage.
use super::*;

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
        let mut slices_for_node: Vec<usize> = self
            .slices_on_node
            .get(node.name.as_str())
            .cloned()
            .unwrap_or_default();
        slices_for_node.extend(self.slices_shared.iter().copied());
        let pools = match pools::gather_pools(self, &slices_for_node, node) {
            Ok(p) => p,
            Err(e) => {
                out.push(StageCounts {
                    errors: vec![e],
                    ..Default::default()
                });
                return out;
            }
        };
        let pool_problems: Vec<String> = pools
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
            .collect();
        let mut run = Run {
            a: self,
            node,
            claims,
            pools,
            req_data: super::FastMap::default(),
            constraints: Vec::new(),
            matches: super::FastMap::default(),
            allocating: super::FastMap::default(),
            allocating_capacity: super::FastMap::default(),
            consumed_counters: super::FastMap::default(),
            available_counters: super::FastMap::default(),
            results: claims.iter().map(|_| Vec::new()).collect(),
            share_seq: 0,
        };
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
            let rd = &run.req_data[&key];
            let req = rd.req.clone();
            let class = rd.class;
            let mut sc = StageCounts {
                claim: claim_name(&claims[key.claim]),
                request: req.full_name(),
                wanted: if req.all {
                    "all".into()
                } else {
                    req.count.to_string()
                },
                pool_problems: pool_problems.clone(),
                ..Default::default()
            };
            let n_cons = run.constraints[key.claim].len();
            for pi in 0..run.pools.len() {
                if run.pools[pi].incomplete || run.pools[pi].invalid.is_some() {
                    continue;
                }
                for si in 0..run.pools[pi].slices.len() {
                    for di in 0..run.pools[pi].devices(si).len() {
                        let d = DevRef {
                            pool: pi,
                            slice: si,
                            device: di,
                        };
                        sc.considered += 1;
                        let cls = class
                            .map(|c| class_spec(c).selectors.as_deref().unwrap_or(&[]))
                            .unwrap_or(&[]);
                        match run.selectors_match(key, d, class, cls) {
                            Ok(true) => sc.class_selectors += 1,
                            Ok(false) => continue,
                            Err(e) => {
                                if sc.errors.len() < 3 {
                                    sc.errors.push(e);
                                }
                                continue;
                            }
                        }
                        match run.selectors_match(key, d, None, req.selectors) {
                            Ok(true) => sc.request_selectors += 1,
                            Ok(false) => continue,
                            Err(e) => {
                                if sc.errors.len() < 3 {
                                    sc.errors.push(e);
                                }
                                continue;
                            }
                        }
                        if !req.admin_access && run.in_use(d) {
                            continue;
                        }
                        sc.not_in_use += 1;
                        if !run.capacity_fits(&req, d, false).unwrap_or(false) {
                            continue;
                        }
                        sc.capacity += 1;
                        let dev = run.device(d);
                        if dev
                            .consumes_counters
                            .as_ref()
                            .is_some_and(|c| !c.is_empty())
                        {
                            if !run.check_counters(d).unwrap_or(false) {
                                continue;
                            }
                            run.release_counters(d);
                        }
                        sc.counters += 1;
                        if taint_prevents(dev, req.tolerations) {
                            continue;
                        }
                        sc.taints += 1;
                        let driver = run.pools[pi].driver;
                        let (base, sub) = match req.parent {
                            None => (req.name, None),
                            Some(p) => (p, Some(req.name)),
                        };
                        let mut ok = true;
                        let mut added = 0;
                        for ci in 0..n_cons {
                            if constraint_add(
                                &mut run.constraints[key.claim][ci],
                                base,
                                sub,
                                dev,
                                driver,
                            ) {
                                added += 1;
                            } else {
                                ok = false;
                                break;
                            }
                        }
                        for ci in (0..added).rev() {
                            constraint_remove(&mut run.constraints[key.claim][ci], base, sub);
                        }
                        if ok {
                            sc.constraints += 1;
                        }
                    }
                }
            }
            out.push(sc);
        }
        out
    }
}
