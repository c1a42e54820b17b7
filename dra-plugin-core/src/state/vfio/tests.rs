//! Passthrough claims through the state machine, on a fake sysfs tree with a fake kernel.
use std::sync::Arc;

use gpu_dra_api::gates::FeatureGates;
use gpu_dra_api::simulated::GpuGroup;
use serde_json::json;

use crate::backend::DeviceBackend;
use crate::backend::simulated::SimulatedBackend;
use crate::cdi::CdiStore;
use crate::checkpoint::{Checkpoint, ClaimRecord, ClaimState};
use crate::state::DeviceState;
use crate::types::{AllocatedDevice, ClaimAllocation, ClaimRef, ConfigEntry, ConfigSource};
use crate::vfio::tests::{FakeKernel, fake_tree};
use crate::vfio::{PciBus, VFIO_PCI_DRIVER};

struct Fixture {
    dir: tempfile::TempDir,
    state: DeviceState,
    bus: PciBus,
    cdi: CdiStore,
}

fn state(dir: &std::path::Path, bus: &PciBus) -> (DeviceState, CdiStore) {
    let backend = Arc::new(
        SimulatedBackend::new("n1", &[GpuGroup::parse("h100-80gb:2").unwrap()], None).unwrap(),
    );
    let (cp, _) = Checkpoint::load(&dir.join("checkpoint.json"), "boot").unwrap();
    let cdi = CdiStore::new(dir.join("cdi"));
    let inv = backend.discover().unwrap();
    let gates = FeatureGates::parse("PassthroughSupport=true").unwrap();
    let s = DeviceState::new("n1", backend, inv, cp, cdi.clone(), gates).with_pci_bus(bus.clone());
    (s, cdi)
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    // The simulated h100 pair: 0000:18:00.0 (group 20) and 0000:2a:00.0 (group 21).
    let bus = fake_tree(dir.path(), &[("0000:18:00.0", 20), ("0000:2a:00.0", 21)]);
    let (state, cdi) = state(dir.path(), &bus);
    Fixture {
        dir,
        state,
        bus,
        cdi,
    }
}

fn claim(uid: &str, devices: &[&str], configs: Vec<ConfigEntry>) -> ClaimAllocation {
    ClaimAllocation {
        claim: ClaimRef {
            uid: uid.into(),
            namespace: "ns".into(),
            name: format!("claim-{uid}"),
        },
        pod_claim_name: None,
        devices: devices
            .iter()
            .enumerate()
            .map(|(i, d)| AllocatedDevice {
                request: format!("r{i}"),
                pool: "n1".into(),
                device: d.to_string(),
                admin_access: false,
                share_id: None,
            })
            .collect(),
        configs,
    }
}

fn vfio_config(requests: &[&str], api: bool, at: &str) -> ConfigEntry {
    ConfigEntry {
        source: ConfigSource::Claim,
        requests: requests.iter().map(|r| r.to_string()).collect(),
        parameters: json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig",
            "iommu": {"backendPolicy": "LegacyOnly", "enableAPIDevice": api}}),
        path: at.into(),
    }
}

#[tokio::test]
async fn prepare_binds_writes_the_vfio_spec_and_unprepare_rebinds_nvidia() {
    let f = fixture();
    let _kernel = FakeKernel::start(f.bus.sysfs.clone());
    let mut changes = f.state.held_changes();
    let c = claim("u1", &["gpu-vfio-1"], vec![vfio_config(&[], true, "c[0]")]);
    let prepared = f.state.prepare(&c).await.unwrap();
    assert_eq!(
        prepared[0].cdi_device_ids,
        ["k8s.gpu.nvidia.com/claim=u1-gpu-vfio-1"]
    );
    assert_eq!(
        f.bus.driver_of("0000:2a:00.0").unwrap().as_deref(),
        Some(VFIO_PCI_DRIVER)
    );
    assert_eq!(
        f.bus.driver_of("0000:18:00.0").unwrap().as_deref(),
        Some("nvidia")
    );
    let spec = f.cdi.read("u1").unwrap().unwrap();
    assert_eq!(spec.container_edits.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
    assert_eq!(spec.container_edits.device_nodes[0].path, "/dev/vfio/vfio");
    assert_eq!(
        spec.devices[0].container_edits.device_nodes[0].path,
        "/dev/vfio/21"
    );
    assert!(changes.has_changed().unwrap());
    changes.mark_unchanged();
    assert!(f.state.held_devices().contains("gpu-vfio-1"));

    f.state.unprepare("u1").await.unwrap();
    assert_eq!(
        f.bus.driver_of("0000:2a:00.0").unwrap().as_deref(),
        Some("nvidia")
    );
    assert!(f.cdi.read("u1").unwrap().is_none());
    assert!(changes.has_changed().unwrap());
}

#[tokio::test]
async fn a_gpu_is_never_held_as_gpu_and_vfio_at_once() {
    let f = fixture();
    let _kernel = FakeKernel::start(f.bus.sysfs.clone());
    f.state
        .prepare(&claim("u1", &["gpu-0"], vec![]))
        .await
        .unwrap();
    let err = f
        .state
        .prepare(&claim("u2", &["gpu-vfio-0"], vec![]))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("already prepared as gpu-0"),
        "{err}"
    );
    f.state
        .prepare(&claim("u3", &["gpu-vfio-1"], vec![]))
        .await
        .unwrap();
    let err = f
        .state
        .prepare(&claim("u4", &["gpu-1"], vec![]))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("already prepared as gpu-vfio-1"),
        "{err}"
    );
    assert_eq!(
        f.bus.driver_of("0000:18:00.0").unwrap().as_deref(),
        Some("nvidia")
    );
}

#[tokio::test]
async fn one_vfio_config_group_per_claim() {
    let f = fixture();
    let c = claim(
        "u1",
        &["gpu-vfio-0", "gpu-vfio-1"],
        vec![
            vfio_config(&["r0"], false, "c[0]"),
            vfio_config(&["r1"], true, "c[1]"),
        ],
    );
    let err = f.state.prepare(&c).await.unwrap_err().to_string();
    assert!(err.contains("2 VFIO device groups"), "{err}");
    assert_eq!(
        f.bus.driver_of("0000:18:00.0").unwrap().as_deref(),
        Some("nvidia")
    );
}

#[tokio::test]
async fn a_restart_mid_bind_is_rolled_back_to_nvidia() {
    let f = fixture();
    // A crash after the record and the unbind, before the bind: the GPU is on no driver.
    std::fs::remove_file(f.bus.device_dir("0000:18:00.0").join("driver")).unwrap();
    let started = ClaimRecord {
        state: ClaimState::PrepareStarted,
        namespace: "ns".into(),
        name: "claim-u1".into(),
        devices: Vec::new(),
        hardware: vec![json!({"vfio": {"device": "gpu-vfio-0", "pciBusId": "0000:18:00.0"}})],
        unknown: Default::default(),
    };
    f.state
        .checkpoint()
        .update(|c| c.insert("u1".into(), started))
        .await
        .unwrap();
    drop(f.state);
    let (state, _) = state(f.dir.path(), &f.bus);
    let _kernel = FakeKernel::start(f.bus.sysfs.clone());
    state.unprepare("u1").await.unwrap();
    assert_eq!(
        f.bus.driver_of("0000:18:00.0").unwrap().as_deref(),
        Some("nvidia")
    );
    assert!(state.checkpoint().get("u1").is_none());
}

#[tokio::test]
async fn vfio_devices_need_the_gate() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(
        SimulatedBackend::new("n1", &[GpuGroup::parse("h100-80gb:2").unwrap()], None).unwrap(),
    );
    let (cp, _) = Checkpoint::load(&dir.path().join("checkpoint.json"), "boot").unwrap();
    let inv = backend.discover().unwrap();
    let plain = DeviceState::new(
        "n1",
        backend,
        inv,
        cp,
        f.cdi.clone(),
        FeatureGates::parse("").unwrap(),
    );
    let err = plain
        .prepare(&claim("u1", &["gpu-vfio-0"], vec![]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("PassthroughSupport"), "{err}");
}
