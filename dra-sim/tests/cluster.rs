//! The whole-cluster run (`dra_sim::cluster`) against the simulate path's way: each pod
//! allocated from scratch — a fresh allocator over the state rebuilt from every claim allocated so
//! far — on the first node by name where it fits. Below 100 nodes the scheduler visits every node
//! from the first, so both must place every pod on the same node with the same devices.
use dra_sim::alloc::{AllocatedState, Allocator, DeviceCache, SimNode};
use dra_sim::cluster::{ClusterRun, Placement, pod_kinds, pod_sequence};
use dra_sim::{cli, input};
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim, ResourceClaimStatus};
use std::sync::Arc;

const NODES: usize = 20;
const PODS: usize = 100;

fn cluster() -> (input::Objects, Vec<SimNode>) {
    let mut objs = input::Objects::default();
    for (name, text) in cli::EMBEDDED_CLASSES {
        input::load_str(name, text, &mut objs).expect("classes");
    }
    let names: Vec<String> = (0..NODES).map(|i| format!("node-{i:02}")).collect();
    for n in &names {
        // small nodes, so that the cluster fills up; two larger ones, so that not every node
        // offers the same
        let gpus = if n.ends_with('3') {
            "h100-80gb:8"
        } else {
            "h100-80gb:2"
        };
        objs.slices.extend(
            gpu_dra_api::slices::simulated_node_slices(n, &[gpus], None, true).expect("slices"),
        );
    }
    let nodes = names
        .into_iter()
        .map(|name| SimNode {
            name,
            labels: Default::default(),
        })
        .collect();
    (objs, nodes)
}

/// Pod after pod, each from nothing but the claims allocated before it.
fn from_scratch(
    objs: &input::Objects,
    nodes: &[SimNode],
    pods: &[&ResourceClaim],
) -> Vec<Placement> {
    let mut done: Vec<ResourceClaim> = Vec::new();
    let mut out = Vec::new();
    for claim in pods {
        let claims = vec![(*claim).clone()];
        let a = Allocator::new(
            &objs.classes,
            &objs.slices,
            AllocatedState::from_claims(&done),
        );
        let hit = nodes
            .iter()
            .enumerate()
            .find_map(|(i, n)| match a.allocate(n, &claims) {
                Ok(Some(r)) => Some((i, r)),
                _ => None,
            });
        let Some((node, results)) = hit else {
            out.push(Placement {
                node: None,
                results: vec![],
            });
            continue;
        };
        let mut c = (*claim).clone();
        c.status = Some(ResourceClaimStatus {
            allocation: Some(results[0].clone()),
            ..Default::default()
        });
        done.push(c);
        out.push(Placement {
            node: Some(node),
            results,
        });
    }
    out
}

fn devices(r: &[AllocationResult]) -> Vec<String> {
    r.iter()
        .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
        .map(|d| format!("{}/{}", d.pool, d.device))
        .collect()
}

fn same_placements(whole_gpus_only: bool) {
    let (objs, nodes) = cluster();
    let kinds = pod_kinds(whole_gpus_only);
    let claims: Vec<Vec<ResourceClaim>> = kinds.iter().map(|(_, c)| vec![c.clone()]).collect();
    let seq = pod_sequence(PODS, kinds.len());
    let cache = Arc::new(DeviceCache::new(&objs.slices));
    let mut run = ClusterRun::new(
        &objs.classes,
        &objs.slices,
        cache,
        &nodes,
        AllocatedState::default(),
    );
    let fast: Vec<Placement> = seq.iter().map(|&k| run.schedule(&claims[k])).collect();
    let pods: Vec<&ResourceClaim> = seq.iter().map(|&k| &claims[k][0]).collect();
    let slow = from_scratch(&objs, &nodes, &pods);
    for (i, (f, s)) in fast.iter().zip(&slow).enumerate() {
        assert_eq!(f.node, s.node, "pod {i} ({})", kinds[seq[i]].0);
        assert_eq!(devices(&f.results), devices(&s.results), "pod {i}");
        assert_eq!(f, s, "pod {i}");
    }
    // the cluster fills up: some pods must be left over, or the test says little about counters
    let placed = fast.iter().filter(|p| p.node.is_some()).count();
    assert!(placed > 20 && placed < PODS, "placed {placed} of {PODS}");
    assert_eq!(run.stats.placed, placed as u64);
}

#[test]
fn mixed_pods_land_where_allocating_from_scratch_puts_them() {
    same_placements(false);
}

#[test]
fn whole_gpu_pods_land_where_allocating_from_scratch_puts_them() {
    same_placements(true);
}

/// Above 100 nodes the scheduler stops at the 100th feasible node and starts the next pod where
/// it stopped: the run with what it keeps between Filter calls, on one thread or on three, and
/// remembering outcomes, must place every pod as the run without it does.
fn same_as_without_kept(whole_gpus_only: bool) {
    let mut objs = input::Objects::default();
    for (name, text) in cli::EMBEDDED_CLASSES {
        input::load_str(name, text, &mut objs).expect("classes");
    }
    let nodes: Vec<SimNode> = (0..BIG_NODES)
        .map(|i| SimNode {
            name: format!("node-{i:03}"),
            labels: Default::default(),
        })
        .collect();
    for n in &nodes {
        let gpus = if n.name.ends_with('7') {
            "h100-80gb:2"
        } else {
            "h100-80gb:1"
        };
        objs.slices.extend(
            gpu_dra_api::slices::simulated_node_slices(&n.name, &[gpus], None, true)
                .expect("slices"),
        );
    }
    let kinds = pod_kinds(whole_gpus_only);
    let claims: Vec<Vec<ResourceClaim>> = kinds.iter().map(|(_, c)| vec![c.clone()]).collect();
    let seq = pod_sequence(BIG_PODS, kinds.len());
    let run = |kept: bool, threads: usize, remember: bool| {
        let cache = Arc::new(DeviceCache::new(&objs.slices));
        let mut run = ClusterRun::new(
            &objs.classes,
            &objs.slices,
            cache,
            &nodes,
            AllocatedState::default(),
        );
        if !kept {
            run = run.without_kept();
        }
        run = run.with_threads(threads);
        if remember {
            run = run.remember_outcomes();
        }
        let out: Vec<Placement> = seq.iter().map(|&k| run.schedule(&claims[k])).collect();
        (out, (run.stats.filter_calls, run.stats.computed))
    };
    let (slow, slow_calls) = run(false, 1, false);
    let (fast, fast_calls) = run(true, 1, false);
    let (threaded, threaded_calls) = run(true, 3, false);
    let (remembered, remembered_calls) = run(true, 2, true);
    for (i, s) in slow.iter().enumerate() {
        assert_eq!(&fast[i], s, "pod {i} ({})", kinds[seq[i]].0);
        assert_eq!(&threaded[i], s, "pod {i} ({}), threads", kinds[seq[i]].0);
        assert_eq!(
            &remembered[i], s,
            "pod {i} ({}), remembered",
            kinds[seq[i]].0
        );
    }
    assert_eq!(fast_calls, slow_calls);
    assert_eq!(threaded_calls, slow_calls);
    assert_eq!(remembered_calls.0, slow_calls.0);
    // most calls answered from memory, or the test says little about forgetting
    assert!(
        remembered_calls.1 * 2 < remembered_calls.0,
        "{remembered_calls:?}"
    );
    // some pods placed after others filled nodes, and some left over: counters were exercised
    let placed = fast.iter().filter(|p| p.node.is_some()).count();
    assert!(
        placed > 100 && placed < BIG_PODS,
        "placed {placed} of {BIG_PODS}"
    );
}

const BIG_NODES: usize = 130;
const BIG_PODS: usize = 400;

#[test]
fn mixed_pods_land_where_they_land_without_kept_state() {
    same_as_without_kept(false);
}

#[test]
fn whole_gpu_pods_land_where_they_land_without_kept_state() {
    same_as_without_kept(true);
}
