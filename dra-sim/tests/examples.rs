//! Our own examples run as whole files through `simulate`, on the embedded default node.
use dra_sim::cli::{SimulateArgs, build_scenario, run_pods};
use dra_sim::input::Objects;
use std::path::PathBuf;

#[test]
fn the_workload_example_schedules_every_pod() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let args = SimulateArgs {
        files: vec![root.join("examples/workloads/inference-deployment.yaml")],
        ..Default::default()
    };
    let sc = build_scenario(&args, Objects::default(), vec![]).expect("loads");
    let pods = run_pods(&sc);
    let placed: Vec<(&str, usize)> = pods
        .iter()
        .filter(|p| p.node.is_some())
        .map(|p| (p.pod.as_str(), p.claims.len()))
        .collect();
    assert_eq!(
        placed,
        [
            ("inference/inference-0", 1),
            ("inference/inference-1", 1),
            ("inference/inference-2", 1),
            ("inference/classic", 1)
        ]
    );
    // each replica its own claim, on its own device
    let mut devices: Vec<String> = pods
        .iter()
        .flat_map(|p| &p.claims)
        .flat_map(|c| {
            c.allocation
                .devices
                .iter()
                .flat_map(|d| d.results.iter().flatten())
        })
        .map(|r| r.device.clone())
        .collect();
    devices.sort();
    devices.dedup();
    assert_eq!(devices.len(), 4, "{devices:?}");
    assert_eq!(sc.objs.ignored.len(), 1, "the Namespace");
}
