//! A whole-cluster run: pods scheduled one after another as kube-scheduler schedules them, each
//! pod's DRA Filter (the structured allocator) run per node until enough feasible nodes are
//! found, the pod placed on one of them and its allocation kept for every pod after it.
//!
//! What is mirrored from the scheduler (`schedule_one.go`, `findNodesThatPassFilters`):
//! - the number of feasible nodes a cycle looks for, `numFeasibleNodesToFind` with the default
//!   adaptive `percentageOfNodesToScore` ([`feasible_nodes_to_find`]);
//! - the nodes visited round-robin from `nextStartNodeIndex`, which moves on by the number of
//!   nodes processed in each cycle;
//! - allocated devices and the shared counters they consume carried over from pod to pod.
//!
//! What is not: Score. No default Score plugin looks at DRA devices, so the pod goes to the first
//! feasible node found (in visit order); below 100 nodes every node is visited from the first,
//! which makes this the simulate path's rule (first node by name where the pod fits). Filter runs
//! on one thread by default, or on several ([`ClusterRun::with_threads`]; the scheduler runs 16
//! goroutines), each with its own allocator, the outcome the same as on one.
//!
//! Why it is fast: one allocator per thread for the whole run (compiled selectors, class outcomes
//! and slice facts kept across pods), what [`Kept`] keeps between Filter calls (each node's pools,
//! each pool's counters and allocated devices, claim selector outcomes), and the allocated state
//! updated in place after each placement rather than rebuilt from every allocated claim.
use crate::alloc::SimNode;
use crate::alloc::{AllocatedState, Allocator, DeviceCache, Kept, Outcome};
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim, ResourceSlice};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The scheduler's `minFeasibleNodesToFind`.
const MIN_FEASIBLE_NODES: usize = 100;
/// The scheduler's `minFeasibleNodesPercentageToFind`.
const MIN_FEASIBLE_PERCENT: usize = 5;

/// How many feasible nodes a scheduling cycle looks for among `nodes` (kube-scheduler's
/// `numFeasibleNodesToFind` with `percentageOfNodesToScore` unset: 50% − nodes/125, at least 5%,
/// and never fewer than 100 nodes).
pub fn feasible_nodes_to_find(nodes: usize) -> usize {
    if nodes < MIN_FEASIBLE_NODES {
        return nodes;
    }
    let percent = 50usize
        .saturating_sub(nodes / 125)
        .max(MIN_FEASIBLE_PERCENT);
    (nodes * percent / 100).max(MIN_FEASIBLE_NODES)
}

/// Where one pod went: the node's index and its claims' allocations, or `None` when no node fits.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub node: Option<usize>,
    pub results: Vec<AllocationResult>,
}

/// Counts over a run, for the report.
#[derive(Debug, Default, Clone, Copy)]
pub struct RunStats {
    /// allocator runs (one per pod and node visited)
    pub filter_calls: u64,
    /// of those, the ones computed rather than remembered (see [`ClusterRun::remember_outcomes`])
    pub computed: u64,
    /// nodes where the allocator returned an error (counted as infeasible, as Filter does)
    pub filter_errors: u64,
    pub placed: u64,
    pub unschedulable: u64,
}

/// The cluster while pods are scheduled onto it.
pub struct ClusterRun<'a> {
    /// one per thread running Filter, each with the same allocated state
    workers: Vec<Worker<'a>>,
    classes: &'a [DeviceClass],
    slices: &'a [ResourceSlice],
    cache: Arc<DeviceCache>,
    nodes: &'a [SimNode],
    next_start: usize,
    to_find: usize,
    /// every pool lies on one node, so an allocation changes that node's outcomes only
    isolated: bool,
    pub stats: RunStats,
}

/// An allocator and what it keeps between Filter calls (neither is shared between threads).
struct Worker<'a> {
    alloc: Allocator<'a>,
    /// `None`: every Filter call computed from nothing but the allocator's own caches (the
    /// reference the kept path is tested against)
    kept: Option<Kept>,
    /// per node, the outcome for each pod shape (claims' address) since the node last changed
    outcomes: Option<RefCell<Vec<Remembered>>>,
}

/// A node's remembered outcomes: (claims' address, number of claims, outcome).
type Remembered = Vec<(usize, usize, Arc<Outcome>)>;

/// One Filter call's answer.
enum Verdict {
    Fits,
    No,
    Error,
}

/// What one thread found in a scheduling cycle: a verdict per position in the visit order it
/// took, and the first fit among them with its allocation.
#[derive(Default)]
struct Found {
    /// (position, answer, whether computed rather than remembered)
    verdicts: Vec<(usize, Verdict, bool)>,
    first: Option<(usize, Vec<AllocationResult>)>,
}

/// Positions of the visit order a thread takes at a time.
const BLOCK: usize = 8;

impl<'a> ClusterRun<'a> {
    /// A run over `nodes`, with `allocated` already in use; `cache` is built for `slices`.
    pub fn new(
        classes: &'a [DeviceClass],
        slices: &'a [ResourceSlice],
        cache: Arc<DeviceCache>,
        nodes: &'a [SimNode],
        allocated: AllocatedState,
    ) -> Self {
        let first = Worker {
            alloc: Allocator::with_cache(classes, slices, allocated, cache.clone()),
            kept: Some(Kept::default()),
            outcomes: None,
        };
        ClusterRun {
            workers: vec![first],
            classes,
            slices,
            cache,
            nodes,
            next_start: 0,
            to_find: feasible_nodes_to_find(nodes.len()),
            isolated: false,
            stats: RunStats::default(),
        }
    }

    /// The same run without what [`Kept`] keeps between Filter calls: slower, for comparison.
    pub fn without_kept(mut self) -> Self {
        for w in &mut self.workers {
            w.kept = None;
        }
        self
    }

    /// Runs Filter on `threads` threads (as the scheduler runs it on 16 goroutines); the pods
    /// land where they land on one.
    pub fn with_threads(mut self, threads: usize) -> Self {
        while self.workers.len() < threads.max(1) {
            let w = &self.workers[0];
            let alloc = Allocator::with_cache(
                self.classes,
                self.slices,
                w.alloc.allocated.clone(),
                self.cache.clone(),
            );
            let kept = w.kept.as_ref().map(|_| Kept::default());
            let outcomes = w.outcomes.as_ref().map(|_| fresh(self.nodes.len()));
            self.workers.push(Worker {
                alloc,
                kept,
                outcomes,
            });
        }
        self
    }

    /// Remembers each node's Filter outcome per pod shape until an allocation changes the node:
    /// the outcome is the allocator's for the same state, only not computed again. When a pool
    /// spans nodes or a slice is not bound to one node, an allocation forgets every node's.
    pub fn remember_outcomes(mut self) -> Self {
        let mut nodes_of: HashMap<(&str, &str), HashSet<&str>> = HashMap::new();
        let mut isolated = true;
        for s in self.slices {
            match s.spec.node_name.as_deref() {
                Some(n) if !n.is_empty() => {
                    let id = (s.spec.driver.as_str(), s.spec.pool.name.as_str());
                    nodes_of.entry(id).or_default().insert(n);
                }
                _ => isolated = false,
            }
        }
        self.isolated = isolated && nodes_of.values().all(|n| n.len() == 1);
        for w in &mut self.workers {
            w.outcomes = Some(fresh(self.nodes.len()));
        }
        self
    }

    /// One scheduling cycle for a pod with `claims`. The claims live as long as the run: the
    /// allocator keys compiled selectors by the selector text's address.
    pub fn schedule(&mut self, claims: &'a [ResourceClaim]) -> Placement {
        let n = self.nodes.len();
        let start = self.next_start;
        let mut found = self.filter_all(claims);
        let processed = self.count(&mut found);
        if n > 0 {
            self.next_start = (self.next_start + processed) % n;
        }
        let chosen = found
            .into_iter()
            .filter_map(|f| f.first)
            .min_by_key(|(pos, _)| *pos);
        let Some((pos, results)) = chosen else {
            self.stats.unschedulable += 1;
            return Placement {
                node: None,
                results: vec![],
            };
        };
        let node = (start + pos) % n;
        self.place(node, &results);
        Placement {
            node: Some(node),
            results,
        }
    }

    /// Filter over the visit order from `next_start`, on every worker's thread at once.
    fn filter_all(&mut self, claims: &'a [ResourceClaim]) -> Vec<Found> {
        let (nodes, start, to_find) = (self.nodes, self.next_start, self.to_find);
        let cursor = AtomicUsize::new(0);
        let fits = AtomicUsize::new(0);
        let (first, rest) = self.workers.split_first_mut().expect("a worker");
        std::thread::scope(|s| {
            let others: Vec<_> = rest
                .iter_mut()
                .map(|w| {
                    let (cursor, fits) = (&cursor, &fits);
                    s.spawn(move || w.filter(nodes, start, claims, to_find, cursor, fits))
                })
                .collect();
            let mut found = vec![first.filter(nodes, start, claims, to_find, &cursor, &fits)];
            found.extend(others.into_iter().map(|h| h.join().expect("Filter thread")));
            found
        })
    }

    /// Counts the calls as one thread walking the visit order makes them, stopping at the
    /// `to_find`-th feasible node; returns the number of nodes processed.
    fn count(&mut self, found: &mut [Found]) -> usize {
        let mut verdicts: Vec<(usize, Verdict, bool)> = found
            .iter_mut()
            .flat_map(|f| f.verdicts.drain(..))
            .collect();
        verdicts.sort_unstable_by_key(|(pos, _, _)| *pos);
        let mut feasible = 0;
        let mut processed = 0;
        for (_, v, computed) in &verdicts {
            processed += 1;
            self.stats.filter_calls += 1;
            self.stats.computed += u64::from(*computed);
            match v {
                Verdict::Fits => feasible += 1,
                Verdict::No => {}
                Verdict::Error => self.stats.filter_errors += 1,
            }
            if feasible >= self.to_find {
                break;
            }
        }
        processed
    }

    /// The pod's allocation counted as in use by every worker, and what they remember of the
    /// node (or of every node) forgotten.
    fn place(&mut self, node: usize, results: &[AllocationResult]) {
        for w in &mut self.workers {
            for r in results {
                w.alloc.allocated.add(r);
                if let Some(k) = &w.kept {
                    k.allocated(r);
                }
            }
            if let Some(o) = &w.outcomes {
                let mut o = o.borrow_mut();
                if self.isolated {
                    o[node].clear();
                } else {
                    o.iter_mut().for_each(Vec::clear);
                }
            }
        }
        self.stats.placed += 1;
    }
}

impl Worker<'_> {
    /// Filter on the nodes at the positions of the visit order this thread takes, `BLOCK` at a
    /// time, until `to_find` feasible nodes are found by all threads together. Every position
    /// taken is finished, so the positions done are the first ones of the order with no gap.
    fn filter<'r>(
        &'r self,
        nodes: &'r [SimNode],
        start: usize,
        claims: &'r [ResourceClaim],
        to_find: usize,
        cursor: &AtomicUsize,
        fits: &AtomicUsize,
    ) -> Found {
        let n = nodes.len();
        let mut found = Found::default();
        while fits.load(Ordering::Relaxed) < to_find {
            let from = cursor.fetch_add(BLOCK, Ordering::Relaxed);
            if from >= n {
                break;
            }
            for pos in from..(from + BLOCK).min(n) {
                let (outcome, computed) = self.outcome((start + pos) % n, nodes, claims);
                let v = match outcome.as_ref() {
                    Ok(Some(results)) => {
                        fits.fetch_add(1, Ordering::Relaxed);
                        if found.first.is_none() {
                            found.first = Some((pos, results.clone()));
                        }
                        Verdict::Fits
                    }
                    Ok(None) => Verdict::No,
                    Err(_) => Verdict::Error,
                };
                found.verdicts.push((pos, v, computed));
            }
        }
        found
    }

    /// Filter on node `i`: the remembered outcome, or the allocator's (and whether computed).
    fn outcome<'r>(
        &'r self,
        i: usize,
        nodes: &'r [SimNode],
        claims: &'r [ResourceClaim],
    ) -> (Arc<Outcome>, bool) {
        let shape = (claims.as_ptr() as usize, claims.len());
        if let Some(o) = &self.outcomes
            && let Some((_, _, hit)) = o.borrow()[i].iter().find(|(a, l, _)| (*a, *l) == shape)
        {
            return (hit.clone(), false);
        }
        let outcome = Arc::new(match &self.kept {
            Some(k) => self.alloc.allocate_kept(&nodes[i], claims, k),
            None => self.alloc.allocate(&nodes[i], claims),
        });
        if let Some(o) = &self.outcomes {
            o.borrow_mut()[i].push((shape.0, shape.1, outcome.clone()));
        }
        (outcome, true)
    }
}

fn fresh(nodes: usize) -> RefCell<Vec<Remembered>> {
    RefCell::new(vec![Vec::new(); nodes])
}

/// The kinds of pod in a benchmark mix, each one claim, as `(name, claim)`.
pub fn pod_kinds(whole_gpus_only: bool) -> Vec<(&'static str, ResourceClaim)> {
    let gpu = |n: u32| serde_json::json!({"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": n}});
    let mig = |profile: &str| {
        serde_json::json!({"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com",
            "selectors": [{"cel": {"expression":
                format!("device.attributes['gpu.nvidia.com'].profile == '{profile}'")}}]}})
    };
    let mut kinds = vec![("1 GPU", gpu(1)), ("2 GPUs", gpu(2))];
    if !whole_gpus_only {
        kinds.push(("MIG 1g.10gb", mig("1g.10gb")));
        kinds.push(("MIG 3g.40gb", mig("3g.40gb")));
    }
    kinds
        .into_iter()
        .map(|(name, req)| {
            let claim = serde_json::json!({
                "metadata": {"name": name.replace([' ', '.'], "-").to_lowercase(), "namespace": "default"},
                "spec": {"devices": {"requests": [req]}}
            });
            (name, serde_json::from_value(claim).expect("claim"))
        })
        .collect()
}

/// A fixed pseudo-random sequence of `pods` kind indices: with four kinds 40% one GPU, 15% two,
/// 25% MIG 1g.10gb, 20% MIG 3g.40gb; with two, 70% one GPU and 30% two.
pub fn pod_sequence(pods: usize, kinds: usize) -> Vec<usize> {
    let weights: &[u64] = if kinds == 4 {
        &[40, 15, 25, 20]
    } else {
        &[70, 30]
    };
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..pods)
        .map(|_| {
            // xorshift: deterministic and the same on every machine
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut r = x % 100;
            weights
                .iter()
                .position(|&w| {
                    let hit = r < w;
                    r = r.saturating_sub(w);
                    hit
                })
                .unwrap_or(0)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feasible_nodes_follow_the_scheduler() {
        assert_eq!(feasible_nodes_to_find(20), 20);
        assert_eq!(feasible_nodes_to_find(150), 100);
        assert_eq!(feasible_nodes_to_find(1000), 420);
        assert_eq!(feasible_nodes_to_find(5000), 500);
        assert_eq!(feasible_nodes_to_find(100_000), 5000);
    }

    #[test]
    fn sequence_follows_the_weights() {
        let s = pod_sequence(10_000, 4);
        let share = |k| s.iter().filter(|&&x| x == k).count() as f64 / 100.0;
        assert!((share(0) - 40.0).abs() < 3.0, "{}", share(0));
        assert!((share(3) - 20.0).abs() < 3.0, "{}", share(3));
    }
}
