//! `decide` on 8×H100 nodes: carving, placement policy, safety, hold-down, pre-carve, unmet demand.
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gpu_dra_api::miglayout::MigPlacement;
use gpu_dra_api::profiles;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use serde_json::json;

use super::model::{GpuState, NodeState, fits, free_starts, node_slices};
use super::*;
use crate::controller::crd::{MigPolicy, PreCarve};

fn classes() -> Vec<DeviceClass> {
    [
        include_str!("../../../../deviceclasses/gpu.nvidia.com.yaml"),
        include_str!("../../../../deviceclasses/mig.nvidia.com.yaml"),
    ]
    .iter()
    .map(|y| serde_yaml::from_str(y).unwrap())
    .collect()
}

fn node(name: &str, gpus: u32) -> NodeState {
    let model = profiles::lookup("h100").unwrap();
    NodeState {
        name: name.into(),
        gpus: (0..gpus)
            .map(|i| GpuState {
                uuid: format!("GPU-{name}-{i}"),
                minor: i,
                model: Some(model),
                mig_capable: true,
                existing: Vec::new(),
                wanted: None,
            })
            .collect(),
    }
}

fn mig(profile: &str, start: u32) -> MigPlacement {
    MigPlacement {
        profile: profile.into(),
        start,
    }
}

/// A pending claim for one device of `class` whose selector is `cel` (none when empty).
fn pending(name: &str, class: &str, cel: &str) -> PendingClaim {
    let mut exactly = json!({ "deviceClassName": class, "count": 1 });
    if !cel.is_empty() {
        exactly["selectors"] = json!([{ "cel": { "expression": cel } }]);
    }
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": "default", "uid": format!("uid-{name}") },
        "spec": { "devices": { "requests": [{ "name": "r", "exactly": exactly }] } },
    }))
    .unwrap();
    PendingClaim {
        key: format!("default/{name}"),
        pod: format!("default/pod-{name}"),
        claim,
        node_selector: BTreeMap::new(),
    }
}

fn profile_claim(name: &str, profile: &str) -> PendingClaim {
    pending(
        name,
        "mig.nvidia.com",
        &format!("device.attributes['gpu.nvidia.com'].profile == '{profile}'"),
    )
}

/// A claim holding `device` of `node`.
fn allocated(name: &str, node: &str, device: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": "default" },
        "spec": { "devices": { "requests": [{ "name": "r", "exactly": { "deviceClassName": "mig.nvidia.com" } }] } },
        "status": { "allocation": { "devices": { "results": [
            { "request": "r", "driver": "gpu.nvidia.com", "pool": node, "device": device }
        ] } } },
    }))
    .unwrap()
}

fn policy(placement: MigPolicy) -> Policy {
    Policy {
        placement,
        hold_down: Duration::from_secs(300),
        pre_carve: Vec::new(),
    }
}

struct Pass {
    nodes: Vec<NodeState>,
    allocated: Vec<ResourceClaim>,
    pending: Vec<PendingClaim>,
    node_labels: BTreeMap<String, BTreeMap<String, String>>,
    idle_since: BTreeMap<String, std::time::Instant>,
}

impl Pass {
    fn new(nodes: Vec<NodeState>) -> Self {
        Self {
            nodes,
            allocated: Vec::new(),
            pending: Vec::new(),
            node_labels: BTreeMap::new(),
            idle_since: BTreeMap::new(),
        }
    }

    fn run(&self, policy: &Policy, now: Instant) -> Decision {
        let classes = classes();
        // What the plugins publish: the devices that exist.
        let published: Vec<_> = self
            .nodes
            .iter()
            .flat_map(|n| node_slices(n, |g| g.existing.as_slice()))
            .collect();
        decide(
            State {
                nodes: self.nodes.clone(),
                slices: &published,
                classes: &classes,
                allocated: &self.allocated,
                pending: self.pending.clone(),
                node_labels: self.node_labels.clone(),
                idle_since: self.idle_since.clone(),
            },
            policy,
            now,
        )
    }

    /// Makes the decision's specs the nodes' specs and what exists (the plugin applied them).
    fn apply(&mut self, d: &Decision) {
        for n in &mut self.nodes {
            let Some(spec) = d.layouts.get(&n.name) else {
                continue;
            };
            for g in &mut n.gpus {
                if let Some(l) = spec.iter().find(|l| l.uuid == g.uuid) {
                    g.wanted = Some(l.devices.clone());
                    g.existing = l.devices.clone();
                }
            }
        }
        self.idle_since = d.idle_since.clone();
    }
}

fn carves(d: &Decision) -> Vec<(String, String, MigPlacement)> {
    d.changes
        .iter()
        .filter(|c| c.kind == ChangeKind::Carve)
        .map(|c| (c.node.clone(), c.gpu.clone(), c.placement.clone().unwrap()))
        .collect()
}

#[test]
fn h100_geometry_refuses_overlaps_and_foreign_placements() {
    let h100 = profiles::lookup("h100").unwrap();
    let p3 = h100.profile("3g.40gb").unwrap();
    let p4 = h100.profile("4g.40gb").unwrap();
    assert_eq!(free_starts(h100, &[], p3), vec![0, 4]);
    assert_eq!(free_starts(h100, &[mig("3g.40gb", 0)], p3), vec![4]);
    assert!(
        fits(h100, &[mig("3g.40gb", 4)], p4, 0),
        "4g+3g is a valid H100 layout"
    );
    assert!(!fits(h100, &[], p3, 2), "not a placement NVIDIA allows");
    let p1 = h100.profile("1g.10gb").unwrap();
    let sevens: Vec<_> = (0..7).map(|s| mig("1g.10gb", s)).collect();
    assert!(free_starts(h100, &sevens, p1).is_empty(), "max instances");
    assert!(free_starts(h100, &[mig("3g.40gb", 0), mig("3g.40gb", 4)], p3).is_empty());
}

#[test]
fn a_3g_claim_on_a_free_node_carves_one_device() {
    let mut pass = Pass::new(vec![node("n1", 8)]);
    pass.pending = vec![profile_claim("a", "3g.40gb")];
    let d = pass.run(&policy(MigPolicy::BinPack), Instant::now());
    assert_eq!(
        carves(&d),
        vec![("n1".into(), "GPU-n1-7".into(), mig("3g.40gb", 0))]
    );
    assert!(d.unmet.is_empty());
    let spec = &d.layouts["n1"];
    assert_eq!(spec.len(), 1, "only the carved GPU becomes managed");
    assert_eq!(spec[0].devices, vec![mig("3g.40gb", 0)]);
}

#[test]
fn a_planned_device_is_not_carved_twice() {
    let mut pass = Pass::new(vec![node("n1", 8)]);
    pass.pending = vec![profile_claim("a", "3g.40gb")];
    let t0 = Instant::now();
    let first = pass.run(&policy(MigPolicy::BinPack), t0);
    pass.apply(&first);
    let again = pass.run(&policy(MigPolicy::BinPack), t0);
    assert!(again.changes.is_empty(), "{:?}", again.changes);
    assert!(again.layouts.is_empty());
}

#[test]
fn binpack_puts_the_second_3g_on_the_same_gpu_and_spread_on_another() {
    let mut pass = Pass::new(vec![node("n1", 8)]);
    pass.pending = vec![profile_claim("a", "3g.40gb"), profile_claim("b", "3g.40gb")];
    let packed = pass.run(&policy(MigPolicy::BinPack), Instant::now());
    let gpus: Vec<_> = carves(&packed).into_iter().map(|c| (c.1, c.2)).collect();
    assert_eq!(
        gpus,
        vec![
            ("GPU-n1-7".into(), mig("3g.40gb", 0)),
            ("GPU-n1-7".into(), mig("3g.40gb", 4))
        ]
    );
    let spread = pass.run(&policy(MigPolicy::Spread), Instant::now());
    let gpus: Vec<_> = carves(&spread).into_iter().map(|c| c.1).collect();
    assert_eq!(gpus, vec!["GPU-n1-7".to_string(), "GPU-n1-6".to_string()]);
}

#[test]
fn spread_prefers_the_emptier_node_and_binpack_the_busier() {
    let mut busy = node("n1", 2);
    busy.gpus[0].wanted = Some(vec![mig("1g.10gb", 0)]);
    busy.gpus[0].existing = vec![mig("1g.10gb", 0)];
    let mut pass = Pass::new(vec![busy, node("n2", 2)]);
    pass.allocated = vec![allocated("x", "n1", "gpu-0-mig-1g10gb-19-0")];
    pass.pending = vec![profile_claim("a", "3g.40gb")];
    let packed = carves(&pass.run(&policy(MigPolicy::BinPack), Instant::now()));
    assert_eq!(packed[0].1, "GPU-n1-0");
    assert_eq!(packed[0].2, mig("3g.40gb", 4));
    let spread = carves(&pass.run(&policy(MigPolicy::Spread), Instant::now()));
    assert_eq!(spread[0].0, "n2");
}

#[test]
fn a_whole_gpu_allocated_is_never_carved() {
    let mut pass = Pass::new(vec![node("n1", 2)]);
    pass.allocated = vec![allocated("x", "n1", "gpu-1")];
    pass.pending = vec![profile_claim("a", "3g.40gb")];
    let d = pass.run(&policy(MigPolicy::BinPack), Instant::now());
    assert_eq!(carves(&d)[0].1, "GPU-n1-0");
}

#[test]
fn a_gpu_allocated_whole_before_its_carve_stays_whole_and_the_claim_moves() {
    let mut n = node("n1", 2);
    n.gpus[1].wanted = Some(vec![mig("3g.40gb", 0)]);
    let mut pass = Pass::new(vec![n]);
    pass.allocated = vec![allocated("x", "n1", "gpu-1")];
    pass.pending = vec![profile_claim("a", "3g.40gb")];
    let d = pass.run(&policy(MigPolicy::BinPack), Instant::now());
    let kinds: Vec<_> = d.changes.iter().map(|c| (c.kind, c.gpu.as_str())).collect();
    assert_eq!(
        kinds,
        [
            (ChangeKind::Restore, "GPU-n1-1"),
            (ChangeKind::Carve, "GPU-n1-0")
        ]
    );
    assert_eq!(d.layouts["n1"][1].devices, vec![]);
}

#[test]
fn an_allocated_device_is_kept_through_hold_down_and_restored_if_dropped() {
    let mut n = node("n1", 1);
    n.gpus[0].existing = vec![mig("3g.40gb", 0)];
    n.gpus[0].wanted = Some(vec![]);
    let mut pass = Pass::new(vec![n]);
    pass.allocated = vec![allocated("x", "n1", "gpu-0-mig-3g40gb-9-0")];
    let t0 = Instant::now();
    let d = pass.run(&policy(MigPolicy::BinPack), t0);
    assert_eq!(d.layouts["n1"][0].devices, vec![mig("3g.40gb", 0)]);
    assert_eq!(d.changes[0].kind, ChangeKind::Restore);
    pass.apply(&d);
    let later = pass.run(&policy(MigPolicy::BinPack), t0 + Duration::from_secs(3600));
    assert!(later.layouts.is_empty(), "{:?}", later.layouts);
}

#[test]
fn hold_down_returns_an_idle_gpu_to_whole_only_after_the_duration() {
    let mut n = node("n1", 1);
    n.gpus[0].existing = vec![mig("3g.40gb", 0)];
    n.gpus[0].wanted = Some(vec![mig("3g.40gb", 0)]);
    let mut pass = Pass::new(vec![n]);
    let p = policy(MigPolicy::BinPack);
    let t0 = Instant::now();
    let first = pass.run(&p, t0);
    assert!(first.layouts.is_empty());
    assert_eq!(first.next_check, Some(Duration::from_secs(300)));
    pass.apply(&first);
    let early = pass.run(&p, t0 + Duration::from_secs(299));
    assert!(early.layouts.is_empty());
    assert_eq!(early.next_check, Some(Duration::from_secs(1)));
    pass.apply(&early);
    let due = pass.run(&p, t0 + Duration::from_secs(300));
    assert_eq!(due.layouts["n1"][0].devices, vec![]);
    assert_eq!(due.changes[0].kind, ChangeKind::Merge);
}

#[test]
fn an_allocation_in_between_restarts_the_hold_down() {
    let mut n = node("n1", 1);
    n.gpus[0].existing = vec![mig("3g.40gb", 0)];
    n.gpus[0].wanted = Some(vec![mig("3g.40gb", 0)]);
    let mut pass = Pass::new(vec![n]);
    let p = policy(MigPolicy::BinPack);
    let t0 = Instant::now();
    let d = pass.run(&p, t0);
    pass.apply(&d);
    pass.allocated = vec![allocated("x", "n1", "gpu-0-mig-3g40gb-9-0")];
    let d = pass.run(&p, t0 + Duration::from_secs(200));
    pass.apply(&d);
    pass.allocated.clear();
    let d = pass.run(&p, t0 + Duration::from_secs(400));
    assert!(d.layouts.is_empty(), "idle for 0s only");
    pass.apply(&d);
    let d = pass.run(&p, t0 + Duration::from_secs(700));
    assert_eq!(d.layouts["n1"][0].devices, vec![]);
}

#[test]
fn a_device_carved_for_a_pending_claim_is_not_merged() {
    let mut pass = Pass::new(vec![node("n1", 1)]);
    pass.pending = vec![profile_claim("a", "3g.40gb")];
    let mut p = policy(MigPolicy::BinPack);
    p.hold_down = Duration::ZERO;
    let t0 = Instant::now();
    let d = pass.run(&p, t0);
    pass.apply(&d);
    let d = pass.run(&p, t0 + Duration::from_secs(10));
    assert!(d.layouts.is_empty(), "{:?}", d.changes);
    pass.pending.clear();
    let d = pass.run(&p, t0 + Duration::from_secs(20));
    assert_eq!(d.changes[0].kind, ChangeKind::Merge, "the claim is gone");
}

#[test]
fn unmet_demand_says_why() {
    let mut full = node("n1", 1);
    full.gpus[0].existing = vec![mig("3g.40gb", 0), mig("3g.40gb", 4)];
    full.gpus[0].wanted = Some(full.gpus[0].existing.clone());
    let mut pass = Pass::new(vec![full]);
    pass.allocated = vec![
        allocated("x", "n1", "gpu-0-mig-3g40gb-9-0"),
        allocated("y", "n1", "gpu-0-mig-3g40gb-9-4"),
    ];
    pass.pending = vec![
        profile_claim("busy", "1g.10gb"),
        profile_claim("none", "9g.500gb"),
    ];
    let d = pass.run(&policy(MigPolicy::BinPack), Instant::now());
    let reasons: Vec<_> = d.unmet.iter().map(|u| (u.pod.as_str(), u.reason)).collect();
    assert_eq!(
        reasons,
        vec![
            ("default/pod-busy", UnmetReason::AllCandidatesBusy),
            ("default/pod-none", UnmetReason::NoMatchingProfile)
        ]
    );
    assert!(d.layouts.is_empty());
}

#[test]
fn a_whole_gpu_claim_takes_an_uncarved_gpu_and_is_busy_when_all_are_carved() {
    let mut pass = Pass::new(vec![node("n1", 1)]);
    pass.pending = vec![pending("w", "gpu.nvidia.com", "")];
    let d = pass.run(&policy(MigPolicy::BinPack), Instant::now());
    assert!(d.unmet.is_empty() && d.changes.is_empty());
    pass.nodes[0].gpus[0].wanted = Some(vec![mig("1g.10gb", 0)]);
    pass.nodes[0].gpus[0].existing = vec![mig("1g.10gb", 0)];
    let d = pass.run(&policy(MigPolicy::BinPack), Instant::now());
    assert_eq!(d.unmet[0].reason, UnmetReason::AllCandidatesBusy);
}

#[test]
fn pre_carve_keeps_idle_devices_and_spares_them_from_hold_down() {
    let mut pass = Pass::new(vec![node("n1", 2)]);
    let mut p = policy(MigPolicy::BinPack);
    p.hold_down = Duration::ZERO;
    p.pre_carve = vec![PreCarve {
        profile: "1g.10gb".into(),
        count: 2,
    }];
    let t0 = Instant::now();
    let d = pass.run(&p, t0);
    let pre: Vec<_> = d
        .changes
        .iter()
        .filter(|c| c.kind == ChangeKind::PreCarve)
        .map(|c| (c.gpu.as_str(), c.placement.clone().unwrap()))
        .collect();
    assert_eq!(
        pre,
        vec![
            ("GPU-n1-1", mig("1g.10gb", 0)),
            ("GPU-n1-1", mig("1g.10gb", 1))
        ]
    );
    pass.apply(&d);
    let d = pass.run(&p, t0 + Duration::from_secs(600));
    assert!(d.changes.is_empty(), "{:?}", d.changes);
}

#[test]
fn hold_down_durations_parse() {
    assert_eq!(parse_duration("5m"), Some(Duration::from_secs(300)));
    assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
    assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
    assert_eq!(parse_duration("5"), None);
    assert_eq!(parse_duration(""), None);
    assert_eq!(parse_duration("5x"), None);
}

#[test]
fn a_pods_node_selector_keeps_the_carve_on_nodes_it_may_use() {
    let mut pass = Pass::new(vec![node("n1", 1), node("n2", 1)]);
    pass.node_labels = BTreeMap::from([
        ("n1".into(), BTreeMap::from([("zone".into(), "a".into())])),
        ("n2".into(), BTreeMap::from([("zone".into(), "b".into())])),
    ]);
    let mut claim = profile_claim("a", "3g.40gb");
    claim.node_selector = BTreeMap::from([("zone".into(), "b".into())]);
    pass.pending = vec![claim];
    let d = pass.run(&policy(MigPolicy::BinPack), Instant::now());
    assert_eq!(carves(&d)[0].0, "n2");
    pass.pending[0].node_selector = BTreeMap::from([("zone".into(), "c".into())]);
    let d = pass.run(&policy(MigPolicy::BinPack), Instant::now());
    assert!(d.changes.is_empty());
    assert_eq!(d.unmet[0].reason, UnmetReason::AllCandidatesBusy);
}

/// Figures, not pass/fail: one pass over 1,000 nodes × 8 H100 with 50 pending 3g.40gb claims.
/// `cargo test --release -p dra-controller --lib decide_at_scale -- --ignored --nocapture`
#[test]
#[ignore]
fn decide_at_scale() {
    let mut pass = Pass::new((0..1000).map(|i| node(&format!("n{i:04}"), 8)).collect());
    pass.pending = (0..50)
        .map(|i| profile_claim(&format!("c{i:02}"), "3g.40gb"))
        .collect();
    let published: Vec<_> = pass
        .nodes
        .iter()
        .flat_map(|n| node_slices(n, |g| g.existing.as_slice()))
        .collect();
    let classes = classes();
    let state = State {
        nodes: pass.nodes.clone(),
        slices: &published,
        classes: &classes,
        allocated: &[],
        pending: pass.pending.clone(),
        node_labels: BTreeMap::new(),
        idle_since: BTreeMap::new(),
    };
    let start = Instant::now();
    let d = decide(state, &policy(MigPolicy::BinPack), start);
    println!(
        "decide: 1000 nodes x 8 H100, 50 pending 3g.40gb claims: {:?} {} carves",
        start.elapsed(),
        carves(&d).len()
    );
    assert_eq!(carves(&d).len(), 50);
}
