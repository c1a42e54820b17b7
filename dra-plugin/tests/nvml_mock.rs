//! The NVML backend against the mock libnvidia-ml (mock-nvml/, built here with gcc), fed from the
//! same hardware profiles as the simulated backend: both must see the same node and publish the
//! same ResourceSlices, and MIG changes must go through NVML with the hardware's rules.
#[path = "../../mock-nvml/harness.rs"]
mod harness;

use std::time::Duration;

use dra_plugin::backend::nvml::{NvmlBackend, NvmlOptions};
use dra_plugin_core::backend::simulated::SimulatedBackend;
use dra_plugin_core::backend::{ComputeMode, DeviceBackend, HealthEventKind};
use gpu_dra_api::inventory::Inventory;
use gpu_dra_api::profiles;
use gpu_dra_api::simulated::{GpuGroup, simulate_node};
use gpu_dra_api::slices::{SliceOptions, TaintMap, build_pool, to_resource_slices};
use harness::MockNode;

/// Whether the mock can be built; only a machine without gcc may skip these tests.
fn can_build() -> bool {
    if harness::have_cc() {
        return true;
    }
    eprintln!("SKIPPED: no gcc on this machine to build the mock libnvidia-ml (mock-nvml/)");
    false
}

/// Node `node-1` with one group of GPUs, `<profile>:<count>` (e.g. `"a100-80gb:1"`).
fn node_of(group: &str) -> Inventory {
    simulate_node("node-1", &[GpuGroup::parse(group).unwrap()], None).unwrap()
}

fn nvml(node: &MockNode) -> NvmlBackend {
    NvmlBackend::with_options(NvmlOptions {
        driver_root: Some(node.driver_root.clone()),
        sysfs_root: node.sysfs.clone(),
        enable_mig_mode: true,
    })
}

/// MIG devices in placement order with GPU-instance IDs cleared: real GPUs number instances by
/// their placement (the mock too), the simulated backend by creation. PCI facts are cleared
/// too: NVML has none, the plugin reads them from sysfs under PassthroughSupport.
fn comparable(mut inv: Inventory) -> Inventory {
    for g in &mut inv.gpus {
        g.pci = None;
        if let Some(m) = &mut g.mig {
            m.devices
                .sort_by_key(|d| (d.placement_start, d.gi_profile_id));
            for d in &mut m.devices {
                d.gi_id = 0;
            }
        }
    }
    inv
}

fn slices_json(inv: &Inventory, dynamic_mig: bool) -> serde_json::Value {
    let opts = SliceOptions {
        driver: "gpu.nvidia.com".into(),
        node_name: "node-1".into(),
        dynamic_mig,
        split_counters: true,
    };
    let slices = to_resource_slices(build_pool(inv, &opts, &TaintMap::new()), &opts, 1, None);
    serde_json::to_value(slices).unwrap()
}

#[test]
fn discovery_matches_the_simulated_backend_for_every_profile() {
    if !can_build() {
        return;
    }
    let mut checked = 0;
    for model in profiles::catalog() {
        // No MIG devices, then layouts with some (every one this model accepts).
        let mut layouts: Vec<Option<String>> = vec![None];
        if let Some(first) = model.profiles.first() {
            layouts.push(Some(format!("all-{}", first.name)));
            layouts.push(Some("all-balanced".into()));
        }
        layouts.retain(|l| {
            l.as_deref()
                .is_none_or(|l| gpu_dra_api::simulated::plan_layout(model, l).is_ok())
        });
        for layout in &layouts {
            let groups = [GpuGroup::parse(&format!("{}:2", model.key)).unwrap()];
            let sim = SimulatedBackend::new("node-1", &groups, layout.as_deref()).unwrap();
            let expected = sim.discover().unwrap();
            let dir = tempfile::tempdir().unwrap();
            let node = MockNode::new(dir.path(), &expected);
            let got = nvml(&node).discover().unwrap_or_else(|e| {
                panic!("{} {layout:?}: {e}", model.key);
            });
            assert_eq!(
                comparable(got.clone()),
                comparable(expected.clone()),
                "{} with layout {layout:?}",
                model.key
            );
            for dynamic in [false, true] {
                assert_eq!(
                    slices_json(&got, dynamic),
                    slices_json(&expected, dynamic),
                    "slices of {} with layout {layout:?}, DynamicMIG={dynamic}",
                    model.key
                );
            }
            checked += 1;
        }
    }
    assert!(
        checked >= 30,
        "every model, with and without MIG devices: {checked}"
    );
}

#[test]
fn mixed_node_matches_too() {
    if !can_build() {
        return;
    }
    let mut groups = [
        GpuGroup::parse("h100-80gb:4").unwrap(),
        GpuGroup::parse("l4:2").unwrap(),
        GpuGroup::parse("a100-40gb:2").unwrap(),
    ];
    groups[0].mig_layout = Some("all-3g.40gb".into());
    groups[2].mig_layout = Some("1g.5gb,2g.10gb".into());
    let expected = simulate_node("node-1", &groups, None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let node = MockNode::new(dir.path(), &expected);
    let got = nvml(&node).discover().unwrap();
    assert_eq!(comparable(got.clone()), comparable(expected.clone()));
    assert_eq!(got.gpus.len(), 8);
    assert_eq!(got.gpus[1].pcie_root, got.gpus[0].pcie_root, "from sysfs");
    assert_eq!(got.gpus[7].numa_node, Some(1), "from sysfs");
    assert_eq!(got.gpus[0].addressing_mode.as_deref(), Some("HMM"));
    assert!(got.gpus[4].mig.is_none(), "L4 cannot do MIG");
}

/// The same calls on both backends give the same answers (errors compared by their text).
#[test]
fn mig_create_and_destroy_behave_like_the_simulated_backend() {
    if !can_build() {
        return;
    }
    let groups = [GpuGroup::parse("h100-80gb:2").unwrap()];
    let sim = SimulatedBackend::new("node-1", &groups, None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let node = MockNode::new(dir.path(), &sim.discover().unwrap());
    let real = nvml(&node);

    let steps: &[(&str, u32, u32, u32)] = &[
        ("create", 0, 9, 4),   // 3g.40gb at 4
        ("create", 0, 9, 4),   // idempotent
        ("create", 0, 19, 5),  // 1g.10gb at 5 overlaps
        ("create", 0, 9, 3),   // not a placement of 3g.40gb
        ("create", 3, 9, 0),   // no such GPU
        ("create", 0, 77, 0),  // no such profile
        ("create", 0, 20, 0),  // 1g.10gb+me at 0
        ("create", 0, 20, 1),  // only one +me instance per GPU
        ("create", 0, 14, 2),  // 2g.20gb at 2
        ("create", 0, 19, 1),  // 1g.10gb at 1: compute slices 3+1+2+1 = 7
        ("destroy", 0, 19, 4), // another profile at that start: nothing happens
        ("destroy", 0, 9, 4),
        ("destroy", 0, 9, 4), // idempotent
        ("create", 0, 0, 0),  // 7g.80gb overlaps what is left
        ("destroy", 0, 20, 0),
        ("destroy", 0, 14, 2),
        ("destroy", 0, 19, 1),
        ("create", 0, 0, 0),  // the whole GPU is free again
        ("create", 1, 15, 6), // 1g.20gb on the other GPU
    ];
    for (i, &(op, minor, profile, start)) in steps.iter().enumerate() {
        let (a, b) = match op {
            "create" => (
                sim.create_mig(minor, profile, start)
                    .map(|d| (d.profile, d.uuid, d.placement_size))
                    .map_err(|e| e.to_string()),
                real.create_mig(minor, profile, start)
                    .map(|d| (d.profile, d.uuid, d.placement_size))
                    .map_err(|e| e.to_string()),
            ),
            _ => (
                sim.destroy_mig(minor, profile, start)
                    .map(|()| Default::default())
                    .map_err(|e| e.to_string()),
                real.destroy_mig(minor, profile, start)
                    .map(|()| Default::default())
                    .map_err(|e| e.to_string()),
            ),
        };
        assert_eq!(
            b, a,
            "step {i}: {op} gpu-{minor} profile {profile} at {start}"
        );
        assert_eq!(
            comparable(real.discover().unwrap()),
            comparable(sim.discover().unwrap()),
            "after step {i}: {op} gpu-{minor} profile {profile} at {start}"
        );
    }
    // What NVML holds, as the mock records it: 7g.80gb (GPU instance 0) and 1g.20gb at 6.
    let state = node.state_lines();
    assert!(state.contains(&"gi 0 0 0 0".to_string()), "{state:?}");
    assert!(state.contains(&"gi 1 6 15 6".to_string()), "{state:?}");
    assert_eq!(state.iter().filter(|l| l.starts_with("ci ")).count(), 2);
}

#[test]
fn a_separate_process_sees_the_same_mig_state() {
    if !can_build() {
        return;
    }
    let inv = node_of("a100-80gb:1");
    let dir = tempfile::tempdir().unwrap();
    let node = MockNode::new(dir.path(), &inv);
    let a = nvml(&node);
    let made = a.create_mig(0, 14, 2).unwrap();
    // Another copy of the library in its own directory, sharing the state file, stands for
    // another process (nvidia-smi, a restarted plugin).
    let dir2 = tempfile::tempdir().unwrap();
    let other = MockNode::new(dir2.path(), &inv);
    let text = std::fs::read_to_string(&other.config).unwrap().replace(
        &other.state.display().to_string(),
        &node.state.display().to_string(),
    );
    std::fs::write(&other.config, text).unwrap();
    let b = nvml(&other);
    let seen = b.discover().unwrap();
    assert_eq!(
        seen.gpus[0].mig.as_ref().unwrap().devices,
        vec![made.clone()]
    );
    b.destroy_mig(0, 14, 2).unwrap();
    let after = a.discover().unwrap();
    assert!(after.gpus[0].mig.as_ref().unwrap().devices.is_empty());
    assert!(
        !after.gpus[0].mig_enabled(),
        "MIG mode left with the last instance"
    );
}

#[test]
fn a_state_file_left_by_a_kill_mid_save_keeps_the_new_state() {
    if !can_build() {
        return;
    }
    let inv = node_of("a100-80gb:1");
    let dir = tempfile::tempdir().unwrap();
    let node = MockNode::new(dir.path(), &inv);
    let a = nvml(&node);
    let made = a.create_mig(0, 14, 2).unwrap();
    // Killed between overwriting the state and cutting it to length: the new state, its end
    // line, then the tail of a longer old state, which must not come back as instances.
    let mut text = std::fs::read_to_string(&node.state).unwrap();
    assert!(text.ends_with("end\n"), "{text}");
    text.push_str("gi 0 9 14 0\nci 0 9 0 0 0\n");
    std::fs::write(&node.state, text).unwrap();
    assert_eq!(
        a.discover().unwrap().gpus[0].mig.as_ref().unwrap().devices,
        vec![made]
    );
}

#[test]
fn mig_mode_that_needs_a_reset_is_reported_not_assumed() {
    if !can_build() {
        return;
    }
    let inv = node_of("h100-80gb:1");
    let dir = tempfile::tempdir().unwrap();
    let node = MockNode::with_extra(dir.path(), &inv, "mig_needs_reset 1\n");
    let b = nvml(&node);
    let e = b.create_mig(0, 9, 0).unwrap_err().to_string();
    assert!(e.contains("pending until the GPU is reset"), "{e}");
    assert!(!b.discover().unwrap().gpus[0].mig_enabled());

    let strict = NvmlBackend::with_options(NvmlOptions {
        driver_root: Some(node.driver_root.clone()),
        sysfs_root: node.sysfs.clone(),
        enable_mig_mode: false,
    });
    let e = strict.create_mig(0, 9, 0).unwrap_err().to_string();
    assert!(e.contains("not in MIG mode"), "{e}");
}

#[test]
fn a_missing_or_unready_driver_is_explained_and_retried() {
    if !can_build() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let missing = NvmlBackend::with_options(NvmlOptions {
        driver_root: Some(dir.path().join("no-driver")),
        sysfs_root: dir.path().join("sys"),
        enable_mig_mode: true,
    });
    let e = missing.discover().unwrap_err().to_string();
    assert!(e.contains("no libnvidia-ml.so.1 under driver root"), "{e}");

    let inv = node_of("h100-80gb:2");
    let node = MockNode::new(dir.path(), &inv);
    std::fs::write(&node.init_gate, "").unwrap();
    let b = nvml(&node);
    let e = b.discover().unwrap_err().to_string();
    assert!(
        e.contains("cannot initialise NVML") && e.contains("libnvidia-ml.so.1"),
        "{e}"
    );
    assert!(b.create_mig(0, 9, 0).is_err());
    // The driver comes up: the same backend now works, without a restart.
    std::fs::remove_file(&node.init_gate).unwrap();
    assert_eq!(b.discover().unwrap().gpus.len(), 2);

    // A library without GPUs must not pass for an empty node.
    let empty_dir = tempfile::tempdir().unwrap();
    let empty = MockNode::new(empty_dir.path(), &inv);
    let text = std::fs::read_to_string(&empty.config).unwrap();
    let no_gpus: String = text
        .lines()
        .filter(|l| {
            !["gpu ", "profile ", "place ", "gi "]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&empty.config, no_gpus).unwrap();
    let e = nvml(&empty).discover().unwrap_err().to_string();
    assert!(e.contains("sees no GPUs"), "{e}");
}

#[test]
fn health_events_come_from_nvml() {
    if !can_build() {
        return;
    }
    let inv = node_of("h100-80gb:3");
    let dir = tempfile::tempdir().unwrap();
    let node = MockNode::new(dir.path(), &inv);
    let b = nvml(&node);
    assert!(
        b.health_events(Duration::from_millis(20))
            .unwrap()
            .is_empty()
    );
    node.inject("xid 1 79");
    node.inject("xid 0 31 3 0");
    node.inject("dbe 2");
    let mut got = Vec::new();
    for _ in 0..50 {
        got.extend(b.health_events(Duration::from_millis(100)).unwrap());
        if got.len() >= 3 {
            break;
        }
    }
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!((got[0].minor, &got[0].kind), (1, &HealthEventKind::Xid(79)));
    assert_eq!(got[0].uuid, inv.gpus[1].uuid);
    assert_eq!(got[1].kind, HealthEventKind::Xid(31));
    assert_eq!(got[1].mig, Some((3, 0)), "the MIG device NVML named");
    assert_eq!(
        (got[2].minor, &got[2].kind),
        (2, &HealthEventKind::DoubleBitEcc)
    );

    node.inject("lost 2");
    let mut lost = Vec::new();
    for _ in 0..50 {
        lost.extend(b.health_events(Duration::from_millis(100)).unwrap());
        if !lost.is_empty() {
            break;
        }
    }
    assert_eq!(lost.len(), 1, "only the GPU that is gone: {lost:?}");
    assert_eq!(
        (lost[0].minor, &lost[0].kind),
        (2, &HealthEventKind::GpuLost)
    );
    let e = b.discover().unwrap_err().to_string();
    assert!(e.contains("gpu-2") && e.contains("fell off the bus"), "{e}");
}

#[test]
fn compute_mode_goes_through_nvml() {
    if !can_build() {
        return;
    }
    let inv = node_of("h100-80gb:2");
    let dir = tempfile::tempdir().unwrap();
    let node = MockNode::new(dir.path(), &inv);
    let b = nvml(&node);
    use nvml_wrapper::enum_wrappers::device::ComputeMode as Nvml;
    b.set_compute_mode(1, ComputeMode::ExclusiveProcess)
        .unwrap();
    b.set_compute_mode(1, ComputeMode::ExclusiveProcess)
        .unwrap();
    // NVML's own view, through the same loaded library.
    let lib = node.driver_root.join("usr/lib64/libnvidia-ml.so.1");
    let direct = nvml_wrapper::Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .unwrap();
    let mode = |i| direct.device_by_index(i).unwrap().compute_mode().unwrap();
    assert_eq!(mode(1), Nvml::ExclusiveProcess);
    assert_eq!(mode(0), Nvml::Default);
    b.set_compute_mode(1, ComputeMode::Default).unwrap();
    assert_eq!(mode(1), Nvml::Default);
    let e = b
        .set_compute_mode(5, ComputeMode::ExclusiveProcess)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no GPU with minor 5"), "{e}");
}
