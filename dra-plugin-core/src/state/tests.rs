use std::sync::Arc;

use gpu_dra_api::simulated::GpuGroup;
use serde_json::json;

use super::*;
use crate::backend::simulated::SimulatedBackend;
use crate::cdi::CdiStore;
use crate::types::{AllocatedDevice, ConfigEntry, ConfigSource};

struct Fixture {
    _dir: tempfile::TempDir,
    state: Arc<DeviceState>,
    backend: Arc<SimulatedBackend>,
    cdi: CdiStore,
}

fn fixture(spec: &str, layout: Option<&str>, gates: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let backend =
        Arc::new(SimulatedBackend::new("n1", &[GpuGroup::parse(spec).unwrap()], layout).unwrap());
    let (cp, _) = Checkpoint::load(&dir.path().join("checkpoint.json"), "boot").unwrap();
    let cdi = CdiStore::new(dir.path().join("cdi"));
    let inv = backend.discover().unwrap();
    let state = DeviceState::new(
        "n1",
        backend.clone(),
        inv,
        cp,
        cdi.clone(),
        FeatureGates::parse(gates).unwrap(),
    );
    Fixture {
        _dir: dir,
        state: Arc::new(state),
        backend,
        cdi,
    }
}

fn claim(uid: &str, devices: &[(&str, &str)]) -> ClaimAllocation {
    ClaimAllocation {
        claim: ClaimRef {
            uid: uid.into(),
            namespace: "ns".into(),
            name: format!("claim-{uid}"),
        },
        pod_claim_name: None,
        devices: devices
            .iter()
            .map(|(req, dev)| AllocatedDevice {
                request: req.to_string(),
                pool: "n1".into(),
                device: dev.to_string(),
                admin_access: false,
                share_id: None,
            })
            .collect(),
        configs: vec![],
    }
}

#[tokio::test]
async fn prepare_writes_cdi_and_is_idempotent_and_unprepare_undoes_it() {
    let f = fixture("h100-80gb:8", None, "");
    let c = claim("u1", &[("gpus", "gpu-0"), ("gpus", "gpu-1")]);
    let devices = f.state.prepare(&c).await.unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[0].request_names, ["gpus"]);
    assert_eq!(
        devices[0].cdi_device_ids,
        ["k8s.gpu.nvidia.com/claim=u1-gpu-0"]
    );
    let spec = f.cdi.read("u1").unwrap().expect("spec written");
    let uuid0 = &f.state.inventory().gpus[0].uuid;
    assert!(spec.devices[0].container_edits.env[0].contains(uuid0.as_str()));
    assert_eq!(
        spec.devices[1].container_edits.device_nodes[0].path,
        "/dev/nvidia1"
    );
    assert_eq!(
        f.state.prepare(&c).await.unwrap(),
        devices,
        "same answer twice"
    );
    assert_eq!(f.state.checkpoint().prepared_device_count(), 2);

    f.state.unprepare("u1").await.unwrap();
    assert!(f.cdi.read("u1").unwrap().is_none());
    assert!(f.state.checkpoint().get("u1").is_none());
    f.state.unprepare("u1").await.unwrap();
    f.state.unprepare("never-seen").await.unwrap();
}

#[tokio::test]
async fn subrequest_results_report_the_base_request_name() {
    let f = fixture("h100-80gb:1", Some("all-3g.40gb"), "");
    let d = f
        .state
        .prepare(&claim("u1", &[("gpu/mig-slice", "gpu-0-mig-3g40gb-9-4")]))
        .await
        .unwrap();
    assert_eq!(d[0].request_names, ["gpu"]);
    let spec = f.cdi.read("u1").unwrap().unwrap();
    let nodes: Vec<_> = spec.devices[0]
        .container_edits
        .device_nodes
        .iter()
        .map(|n| n.path.as_str())
        .collect();
    assert_eq!(nodes[0], "/dev/nvidia0");
    assert!(
        nodes[1].starts_with("/dev/nvidia-caps/nvidia-cap") && nodes.len() == 3,
        "{nodes:?}"
    );
    let mig_uuid = f.state.inventory().gpus[0].mig.as_ref().unwrap().devices[1]
        .uuid
        .clone();
    assert_eq!(
        spec.devices[0].container_edits.env,
        [format!("NVIDIA_VISIBLE_DEVICES={mig_uuid}")]
    );
}

#[tokio::test]
async fn bad_allocations_fail_per_claim_and_record_nothing() {
    let f = fixture("h100-80gb:2", Some("all-3g.40gb"), "");
    let cases = [
        (claim("a", &[("gpu", "gpu-9")]), "no such GPU"),
        (claim("b", &[("gpu", "gpu-0")]), "MIG mode"),
        (
            claim("c", &[("gpu", "gpu-0-mig-1g10gb-19-0")]),
            "no such MIG device",
        ),
        (claim("d", &[("gpu", "tpu-0")]), "not a device name"),
        (claim("e", &[]), "no devices"),
    ];
    for (c, want) in cases {
        let e = f.state.prepare(&c).await.unwrap_err().to_string();
        assert!(e.contains(want), "{}: {e}", c.claim.uid);
    }
    let mut other_pool = claim("f", &[("gpu", "gpu-0-mig-3g40gb-9-0")]);
    other_pool.devices[0].pool = "n2".into();
    assert!(
        f.state
            .prepare(&other_pool)
            .await
            .unwrap_err()
            .to_string()
            .contains("pool n1")
    );
    let mut bad_config = claim("g", &[("gpu", "gpu-0-mig-3g40gb-9-0")]);
    bad_config.configs.push(ConfigEntry {
        source: ConfigSource::Claim,
        requests: vec![],
        parameters: json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", "shareing": {}}),
        path: "claim.config[0].opaque.parameters".into(),
    });
    let e = f.state.prepare(&bad_config).await.unwrap_err().to_string();
    assert!(
        e.contains("claim.config[0].opaque.parameters.shareing"),
        "{e}"
    );
    assert!(f.state.checkpoint().claims().is_empty());
    assert!(f.cdi.claim_uids().is_empty());
}

#[tokio::test]
async fn a_device_serves_one_claim_at_a_time() {
    let f = fixture("h100-80gb:2", None, "");
    f.state
        .prepare(&claim("u1", &[("gpu", "gpu-0")]))
        .await
        .unwrap();
    let e = f
        .state
        .prepare(&claim("u2", &[("gpu", "gpu-0")]))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("already prepared") && e.contains("ns/claim-u1"),
        "{e}"
    );
    let mut admin = claim("u3", &[("gpu", "gpu-0")]);
    admin.devices[0].admin_access = true;
    f.state.prepare(&admin).await.unwrap();
}

#[tokio::test]
async fn dynamic_mig_creates_at_prepare_and_destroys_at_unprepare() {
    let f = fixture("h100-80gb:1", None, "DynamicMIG=true");
    let c = claim("u1", &[("gpu/mig-slice", "gpu-0-mig-3g40gb-9-4")]);
    f.state.prepare(&c).await.unwrap();
    let mig = f.backend.discover().unwrap().gpus[0].mig.clone().unwrap();
    assert_eq!(mig.devices.len(), 1);
    assert_eq!(mig.devices[0].placement_start, 4);
    let spec = f.cdi.read("u1").unwrap().unwrap();
    assert!(spec.devices[0].container_edits.env[0].contains(&mig.devices[0].uuid));
    let record = f.state.checkpoint().get("u1").unwrap();
    assert_eq!(record.hardware.len(), 1);
    f.state.unprepare("u1").await.unwrap();
    assert!(
        f.backend.discover().unwrap().gpus[0]
            .mig
            .as_ref()
            .unwrap()
            .devices
            .is_empty()
    );
}

#[tokio::test]
async fn a_failed_apply_rolls_back_everything_it_created() {
    let f = fixture("h100-80gb:1", None, "DynamicMIG=true");
    // Someone else's instance occupies slices 0-3: the second device of the claim cannot be made.
    f.backend.create_mig(0, 9, 0).unwrap();
    let c = claim(
        "u1",
        &[
            ("a", "gpu-0-mig-3g40gb-9-4"),
            ("b", "gpu-0-mig-1g10gb-19-0"),
        ],
    );
    let e = f.state.prepare(&c).await.unwrap_err().to_string();
    assert!(e.contains("overlaps"), "{e}");
    let left: Vec<_> = f.backend.discover().unwrap().gpus[0]
        .mig
        .clone()
        .unwrap()
        .devices
        .iter()
        .map(|d| d.placement_start)
        .collect();
    assert_eq!(
        left,
        [0],
        "the instance this claim created was destroyed again"
    );
    assert!(f.state.checkpoint().get("u1").is_none());
    assert!(f.cdi.read("u1").unwrap().is_none());
}

#[tokio::test]
async fn a_crash_between_the_phases_is_rolled_back_before_preparing_again() {
    let f = fixture("h100-80gb:1", None, "DynamicMIG=true");
    // What a crash after "PrepareStarted" and the MIG create, before "PrepareCompleted", leaves.
    f.backend.create_mig(0, 9, 4).unwrap();
    let change = serde_json::to_value(HardwareChange::DynamicMig {
        parent_minor: 0,
        gi_profile_id: 9,
        placement_start: 4,
    })
    .unwrap();
    let started = ClaimRecord {
        state: ClaimState::PrepareStarted,
        namespace: "ns".into(),
        name: "claim-u1".into(),
        devices: vec![],
        hardware: vec![change],
        unknown: Default::default(),
    };
    f.state
        .checkpoint()
        .update(|c| c.insert("u1".into(), started))
        .await
        .unwrap();
    let c = claim("u1", &[("gpu", "gpu-0-mig-3g40gb-9-0")]);
    f.state.prepare(&c).await.unwrap();
    let starts: Vec<_> = f.backend.discover().unwrap().gpus[0]
        .mig
        .clone()
        .unwrap()
        .devices
        .iter()
        .map(|d| d.placement_start)
        .collect();
    assert_eq!(
        starts,
        [0],
        "the half-made instance at 4 is gone; exactly one instance exists"
    );
    assert_eq!(
        f.state.checkpoint().get("u1").unwrap().state,
        ClaimState::PrepareCompleted
    );
}

#[tokio::test]
async fn many_claims_prepare_concurrently() {
    let f = fixture("h100-80gb:8", Some("all-1g.10gb"), "");
    let names: Vec<String> = f
        .state
        .inventory()
        .gpus
        .iter()
        .flat_map(|g| {
            g.mig.as_ref().unwrap().devices.iter().map(move |m| {
                gpu_dra_api::inventory::mig_device_name(
                    g.minor,
                    &m.profile,
                    m.gi_profile_id,
                    m.placement_start,
                )
            })
        })
        .collect();
    assert_eq!(names.len(), 56);
    let tasks: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, dev)| {
            let state = f.state.clone();
            let c = claim(&format!("u{i}"), &[("mig", dev)]);
            tokio::spawn(async move { state.prepare(&c).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(f.state.checkpoint().prepared_device_count(), 56);
    assert_eq!(f.cdi.claim_uids().len(), 56);
}

#[tokio::test]
async fn claims_survive_a_lost_checkpoint_through_their_cdi_specs() {
    let f = fixture("h100-80gb:2", None, "");
    let prepared = f
        .state
        .prepare(&claim("u1", &[("gpu", "gpu-1")]))
        .await
        .unwrap();
    f.state.checkpoint().update(|c| c.clear()).await.unwrap();
    let adopted = f.state.adopt_from_cdi().await.unwrap();
    assert_eq!(adopted.len(), 1);
    assert_eq!(adopted[0].key(), "ns/claim-u1");
    assert_eq!(f.state.checkpoint().get("u1").unwrap().devices, prepared);
    assert_eq!(
        f.state
            .prepare(&claim("u1", &[("gpu", "gpu-1")]))
            .await
            .unwrap(),
        prepared
    );
}

#[tokio::test]
async fn an_adopted_claims_mps_directory_goes_with_its_unprepare_after_the_startup_sweep() {
    let f = fixture("h100-80gb:2", None, "");
    for (uid, dev) in [("u1", "gpu-1"), ("u2", "gpu-0")] {
        f.state.prepare(&claim(uid, &[("gpu", dev)])).await.unwrap();
    }
    // The checkpoint is lost while u1 has MPS directories (and so, maybe, a daemon).
    f.state.checkpoint().update(|c| c.clear()).await.unwrap();
    assert_eq!(f.state.adopt_from_cdi().await.unwrap().len(), 2);
    let mps = f.state.mps_root().to_path_buf();
    for uid in ["u1", "nobody"] {
        std::fs::create_dir_all(mps.join(uid).join("pipe")).unwrap();
    }
    f.state.repair_cdi().await.unwrap();
    assert!(!mps.join("nobody").exists(), "no claim: removed at startup");
    assert!(mps.join("u1").exists(), "a prepared claim's: kept");
    f.state.unprepare("u2").await.unwrap();
    assert!(mps.join("u1").exists());
    f.state.unprepare("u1").await.unwrap();
    assert!(!mps.join("u1").exists(), "removed with its claim");
}

#[tokio::test]
async fn without_the_startup_sweep_every_unprepare_looks_for_mps_directories() {
    let f = fixture("h100-80gb:1", None, "");
    f.state
        .prepare(&claim("u1", &[("gpu", "gpu-0")]))
        .await
        .unwrap();
    let dir = f.state.mps_root().join("u1");
    std::fs::create_dir_all(dir.join("pipe")).unwrap();
    f.state.unprepare("u1").await.unwrap();
    assert!(!dir.exists());
}

#[tokio::test]
async fn startup_repairs_missing_specs_and_sweeps_orphans() {
    let f = fixture("h100-80gb:2", None, "DynamicMIG=true");
    let whole = f
        .state
        .prepare(&claim("u1", &[("gpu", "gpu-1")]))
        .await
        .unwrap();
    f.state
        .prepare(&claim("u2", &[("gpu", "gpu-0-mig-3g40gb-9-0")]))
        .await
        .unwrap();
    let before_u2 = f.cdi.read("u2").unwrap().unwrap();
    // A crash between the spec write and the record (or a wiped /var/run/cdi) loses specs...
    f.cdi.remove("u1").unwrap();
    f.cdi.remove("u2").unwrap();
    // ...and one of an unfinished prepare without hardware changes is left without a record.
    f.cdi
        .write("orphan", &CdiStore::build_spec("orphan", "ns/o", &[], &[]))
        .unwrap();
    assert_eq!(f.state.repair_cdi().await.unwrap(), (2, 1));
    let u1 = f.cdi.read("u1").unwrap().unwrap();
    assert_eq!(u1.devices[0].name, "u1-gpu-1");
    assert_eq!(
        serde_json::from_str::<Vec<PreparedDevice>>(
            &u1.annotations[gpu_dra_api::names::CDI_DEVICES_ANNOTATION]
        )
        .unwrap(),
        whole
    );
    assert_eq!(
        f.cdi.read("u2").unwrap().unwrap(),
        before_u2,
        "the MIG device's spec comes back identical"
    );
    assert_eq!(f.cdi.claim_uids(), ["u1", "u2"]);
}

#[tokio::test]
async fn only_claims_that_change_hardware_record_changes_to_undo() {
    let f = fixture("h100-80gb:1", None, "DynamicMIG=true");
    f.state
        .prepare(&claim("u1", &[("gpu", "gpu-0-mig-1g10gb-19-0")]))
        .await
        .unwrap();
    assert_eq!(f.state.checkpoint().get("u1").unwrap().hardware.len(), 1);
    let g = fixture("h100-80gb:1", None, "");
    g.state
        .prepare(&claim("u1", &[("gpu", "gpu-0")]))
        .await
        .unwrap();
    assert!(g.state.checkpoint().get("u1").unwrap().hardware.is_empty());
}

#[tokio::test]
async fn startup_destroys_mig_devices_no_completed_claim_owns() {
    let f = fixture("h100-80gb:2", None, "DynamicMIG=true");
    f.state
        .prepare(&claim("u1", &[("gpu", "gpu-0-mig-3g40gb-9-0")]))
        .await
        .unwrap();
    // Leftovers: a crash after create (recorded only as started) and an out-of-band instance.
    f.backend.create_mig(0, 9, 4).unwrap();
    f.backend.create_mig(1, 19, 3).unwrap();
    let change = serde_json::to_value(HardwareChange::DynamicMig {
        parent_minor: 0,
        gi_profile_id: 9,
        placement_start: 4,
    })
    .unwrap();
    let started = ClaimRecord {
        state: ClaimState::PrepareStarted,
        namespace: "ns".into(),
        name: "claim-u2".into(),
        devices: vec![],
        hardware: vec![change],
        unknown: Default::default(),
    };
    f.state
        .checkpoint()
        .update(|c| c.insert("u2".into(), started))
        .await
        .unwrap();
    assert_eq!(f.state.destroy_unowned_mig().await.unwrap(), 2);
    let live = f.backend.discover().unwrap();
    let left: Vec<_> = live
        .gpus
        .iter()
        .flat_map(|g| {
            g.mig
                .as_ref()
                .unwrap()
                .devices
                .iter()
                .map(move |d| (g.minor, d.placement_start))
        })
        .collect();
    assert_eq!(left, [(0, 0)], "only the completed claim's instance stays");
    // The started claim prepares cleanly afterwards: nothing is created twice.
    f.state
        .prepare(&claim("u2", &[("gpu", "gpu-0-mig-3g40gb-9-4")]))
        .await
        .unwrap();
    assert_eq!(
        f.backend.discover().unwrap().gpus[0]
            .mig
            .as_ref()
            .unwrap()
            .devices
            .len(),
        2
    );
}

#[tokio::test]
async fn refreshed_mig_devices_can_be_prepared_and_a_carved_gpu_cannot() {
    // On-demand MIG: devices made after start are preparable once the state is refreshed.
    let f = fixture("h100-80gb:1", None, "");
    let made = f.backend.create_mig(0, 9, 4).unwrap();
    let name = "gpu-0-mig-3g40gb-9-4";
    let e = f.state.prepare(&claim("u1", &[("mig", name)])).await;
    assert!(e.is_err(), "unknown before the refresh");
    assert!(f.state.refresh_mig(&f.backend.discover().unwrap()));
    assert!(
        !f.state.refresh_mig(&f.backend.discover().unwrap()),
        "nothing new"
    );
    let devices = f
        .state
        .prepare(&claim("u1", &[("mig", name)]))
        .await
        .unwrap();
    assert_eq!(devices[0].device_name, name);
    let spec = serde_json::to_string(&f.cdi.read("u1").unwrap().unwrap()).unwrap();
    assert!(spec.contains(&made.uuid), "{spec}");
    let e = f.state.prepare(&claim("u2", &[("gpu", "gpu-0")])).await;
    let e = e.unwrap_err().to_string();
    assert!(e.contains("MIG mode"), "{e}");
}
