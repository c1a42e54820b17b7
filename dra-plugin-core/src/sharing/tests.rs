//! Sharing through prepare/unprepare: time-slice refcounts and conflicts, the MPS daemon's life
//! (with a fake runner), consumable shares, and recovery after a restart.
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use gpu_dra_api::config::TimeSliceInterval;
use gpu_dra_api::gates::FeatureGates;
use gpu_dra_api::simulated::GpuGroup;
use serde_json::json;

use super::SharingStateFile;
use super::mps::MpsDaemon;
use super::runner::fake::FakeRunner;
use super::runner::{DaemonHandle, ProcessRunner};
use crate::Error;
use crate::backend::ComputeMode;
use crate::backend::DeviceBackend;
use crate::backend::simulated::SimulatedBackend;
use crate::cdi::CdiStore;
use crate::checkpoint::Checkpoint;
use crate::checkpoint::{ClaimRecord, ClaimState};
use crate::state::*;
use crate::types::{AllocatedDevice, ClaimAllocation, ClaimRef, ConfigEntry, ConfigSource};

const GATES: &str = "TimeSlicingSettings=true,MPSSupport=true,ConsumableShares=true";

struct Fixture {
    dir: tempfile::TempDir,
    state: Arc<DeviceState>,
    backend: Arc<SimulatedBackend>,
    runner: Arc<FakeRunner>,
    cdi: CdiStore,
}

fn simulated(spec: &str) -> Arc<SimulatedBackend> {
    Arc::new(SimulatedBackend::new("n1", &[GpuGroup::parse(spec).unwrap()], None).unwrap())
}

/// A plugin instance on `dir` (a second call on the same dir is a restart).
fn state_on(
    dir: &Path,
    backend: Arc<SimulatedBackend>,
    runner: Arc<FakeRunner>,
    layout_gates: &str,
) -> Arc<DeviceState> {
    let (cp, _) = Checkpoint::load(&dir.join("checkpoint.json"), "boot").unwrap();
    let inv = backend.discover().unwrap();
    Arc::new(
        DeviceState::new(
            "n1",
            backend,
            inv,
            cp,
            CdiStore::new(dir.join("cdi")),
            FeatureGates::parse(layout_gates).unwrap(),
        )
        .with_mps_runner(runner),
    )
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let backend = simulated("h100-80gb:2");
    let runner = Arc::new(FakeRunner::default());
    let state = state_on(dir.path(), backend.clone(), runner.clone(), GATES);
    Fixture {
        cdi: CdiStore::new(dir.path().join("cdi")),
        dir,
        state,
        backend,
        runner,
    }
}

/// A claim with devices `(request, device, share id)` and claim configs `(requests, sharing)`.
fn claim(
    uid: &str,
    devices: &[(&str, &str, Option<&str>)],
    configs: &[(&[&str], serde_json::Value)],
) -> ClaimAllocation {
    ClaimAllocation {
        claim: ClaimRef {
            uid: uid.into(),
            namespace: "ns".into(),
            name: format!("claim-{uid}"),
        },
        pod_claim_name: None,
        devices: devices
            .iter()
            .map(|(req, dev, share)| AllocatedDevice {
                request: req.to_string(),
                pool: "n1".into(),
                device: dev.to_string(),
                admin_access: false,
                share_id: share.map(str::to_string),
            })
            .collect(),
        configs: configs
            .iter()
            .enumerate()
            .map(|(i, (requests, sharing))| ConfigEntry {
                source: ConfigSource::Claim,
                requests: requests.iter().map(|r| r.to_string()).collect(),
                parameters: json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}),
                path: format!("status.allocation.devices.config[{i}].opaque.parameters"),
            })
            .collect(),
    }
}

fn time_slicing(interval: &str) -> serde_json::Value {
    json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}})
}

fn mps(config: serde_json::Value) -> serde_json::Value {
    json!({"strategy": "MPS", "mpsConfig": config})
}

fn sharing_file(f: &Fixture) -> SharingStateFile {
    SharingStateFile::read(f.dir.path()).expect("sharing.json written")
}

#[tokio::test]
async fn time_slice_is_refcounted_per_gpu_and_reset_by_the_last_claim() {
    let f = fixture();
    let short = time_slicing("Short");
    f.state
        .prepare(&claim(
            "a",
            &[("gpu", "gpu-0", Some("s-a"))],
            &[(&[], short.clone())],
        ))
        .await
        .unwrap();
    assert_eq!(f.backend.settings(0).time_slice, TimeSliceInterval::Short);
    assert_eq!(
        f.backend.settings(1).time_slice,
        TimeSliceInterval::Default,
        "only the claimed GPU"
    );
    let devices = f
        .state
        .prepare(&claim(
            "b",
            &[("gpu", "gpu-0", Some("s-b"))],
            &[(&[], short.clone())],
        ))
        .await
        .unwrap();
    assert_eq!(devices[0].share_id.as_deref(), Some("s-b"));
    let state = sharing_file(&f);
    assert_eq!(state.gpus["gpu-0"].time_slice, TimeSliceInterval::Short);
    assert_eq!(state.gpus["gpu-0"].claims, ["a", "b"]);

    f.state.unprepare("a").await.unwrap();
    assert_eq!(
        f.backend.settings(0).time_slice,
        TimeSliceInterval::Short,
        "b still runs time-sliced"
    );
    f.state.unprepare("b").await.unwrap();
    assert_eq!(f.backend.settings(0).time_slice, TimeSliceInterval::Default);
    assert!(sharing_file(&f).gpus.is_empty());
}

#[tokio::test]
async fn conflicting_time_slices_on_one_gpu_are_refused_per_claim() {
    let f = fixture();
    f.state
        .prepare(&claim(
            "a",
            &[("gpu", "gpu-0", Some("s-a"))],
            &[(&[], time_slicing("Short"))],
        ))
        .await
        .unwrap();
    let e = f
        .state
        .prepare(&claim(
            "b",
            &[("gpu", "gpu-0", Some("s-b"))],
            &[(&[], time_slicing("Long"))],
        ))
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Busy(_)), "{e:?}");
    assert!(
        msg.contains("gpu-0")
            && msg.contains("Long")
            && msg.contains("Short")
            && msg.contains("ns/claim-a"),
        "{msg}"
    );
    assert!(f.state.checkpoint().get("b").is_none());
    assert_eq!(f.backend.settings(0).time_slice, TimeSliceInterval::Short);

    // Two requests of one claim on one GPU (two shares) with different intervals.
    let e = f
        .state
        .prepare(&claim(
            "c",
            &[("one", "gpu-1", Some("s-1")), ("two", "gpu-1", Some("s-2"))],
            &[
                (&["one"], time_slicing("Medium")),
                (&["two"], time_slicing("Long")),
            ],
        ))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("another request of this claim"), "{e}");
    assert_eq!(f.backend.settings(1).time_slice, TimeSliceInterval::Default);

    // Other GPUs are independent.
    f.state
        .prepare(&claim(
            "d",
            &[("gpu", "gpu-1", None)],
            &[(&[], time_slicing("Long"))],
        ))
        .await
        .unwrap();
    assert_eq!(f.backend.settings(1).time_slice, TimeSliceInterval::Long);
}

#[tokio::test]
async fn time_slicing_on_a_mig_device_is_accepted_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(
        SimulatedBackend::new(
            "n1",
            &[GpuGroup::parse("h100-80gb:1").unwrap()],
            Some("all-3g.40gb"),
        )
        .unwrap(),
    );
    let runner = Arc::new(FakeRunner::default());
    let state = state_on(dir.path(), backend.clone(), runner, GATES);
    let mut c = claim("m", &[("gpu", "gpu-0-mig-3g40gb-9-4", None)], &[]);
    c.configs.push(ConfigEntry {
        source: ConfigSource::Claim,
        requests: vec![],
        parameters: json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}}),
        path: "claim[0]".into(),
    });
    state.prepare(&c).await.unwrap();
    assert_eq!(backend.settings(0).time_slice, TimeSliceInterval::Default);
    assert!(state.checkpoint().get("m").unwrap().hardware.is_empty());
}

#[tokio::test]
async fn mps_daemon_lives_from_prepare_to_unprepare() {
    let f = fixture();
    let c = claim(
        "m1",
        &[("gpu", "gpu-1", None)],
        &[(
            &[],
            mps(
                json!({"defaultActiveThreadPercentage": 40, "defaultPinnedDeviceMemoryLimit": "2Gi", "defaultPerDevicePinnedMemoryLimit": {"0": "1Gi"}}),
            ),
        )],
    );
    f.state.prepare(&c).await.unwrap();
    let root = f.state.mps_root().join("m1");
    assert!(root.join("pipe").is_dir() && root.join("shm").is_dir() && root.join("log").is_dir());
    assert_eq!(f.runner.running_claims(), [root.join("pipe")]);
    assert_eq!(
        f.backend.settings(1).compute_mode,
        ComputeMode::ExclusiveProcess
    );
    assert_eq!(f.backend.settings(0).compute_mode, ComputeMode::Default);
    let uuid = f.state.inventory().gpus[1].uuid.clone();
    let started = f.runner.started.lock().unwrap()[0].clone();
    assert_eq!(started.device_uuids, std::slice::from_ref(&uuid));
    assert_eq!(started.gpu_minors, [1]);

    let spec = f.cdi.read("m1").unwrap().unwrap();
    let edits = &spec.devices[0].container_edits;
    for want in [
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps".to_string(),
        "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps".to_string(),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40".to_string(),
        format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={uuid}=1024M"),
    ] {
        assert!(edits.env.contains(&want), "{want} in {:?}", edits.env);
    }
    let mounts: Vec<_> = edits
        .mounts
        .iter()
        .map(|m| (m.host_path.clone(), m.container_path.as_str()))
        .collect();
    assert!(mounts.contains(&(root.join("pipe").display().to_string(), "/tmp/nvidia-mps")));
    assert!(mounts.contains(&(root.join("shm").display().to_string(), "/dev/shm")));
    assert_eq!(
        sharing_file(&f).gpus["gpu-1"].compute_mode,
        "ExclusiveProcess"
    );

    f.state.unprepare("m1").await.unwrap();
    assert!(f.runner.running_claims().is_empty(), "daemon stopped");
    assert!(!root.exists(), "directories removed");
    assert_eq!(f.backend.settings(1).compute_mode, ComputeMode::Default);
    assert!(sharing_file(&f).gpus.is_empty());
}

#[tokio::test]
async fn multi_user_reaches_the_daemon() {
    let f = fixture();
    for (uid, multi, want) in [("u1", json!(true), true), ("u2", json!(false), false)] {
        let c = claim(
            uid,
            &[("gpu", "gpu-0", None)],
            &[(&[], mps(json!({"multiUser": multi})))],
        );
        f.state.prepare(&c).await.unwrap();
        let started = f.runner.started.lock().unwrap().last().unwrap().clone();
        assert_eq!(started.multi_user, want, "{uid}");
        f.state.unprepare(uid).await.unwrap();
    }
}

#[tokio::test]
async fn a_daemon_that_fails_to_start_rolls_everything_back() {
    let f = fixture();
    f.runner.fail_start.store(true, Ordering::SeqCst);
    let c = claim(
        "m1",
        &[("gpu", "gpu-0", None)],
        &[(&[], time_slicing("Short")), (&[], mps(json!({})))],
    );
    // The last matching config wins: MPS.
    let e = f.state.prepare(&c).await.unwrap_err();
    assert!(e.to_string().contains("refuses to start"), "{e}");
    assert!(f.state.checkpoint().get("m1").is_none());
    assert!(f.cdi.read("m1").unwrap().is_none());
    assert!(!f.state.mps_root().join("m1").exists());
    assert_eq!(f.backend.settings(0).compute_mode, ComputeMode::Default);
    assert_eq!(f.backend.settings(0).time_slice, TimeSliceInterval::Default);

    f.runner.fail_start.store(false, Ordering::SeqCst);
    f.state.prepare(&c).await.unwrap();
    assert_eq!(f.runner.running_claims().len(), 1);
}

#[tokio::test]
async fn mps_refuses_consumable_shares_and_differing_configs_within_a_claim() {
    let f = fixture();
    let e = f
        .state
        .prepare(&claim(
            "m1",
            &[("gpu", "gpu-0", Some("s"))],
            &[(&[], mps(json!({})))],
        ))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("consumable shares"), "{e}");
    let e = f
        .state
        .prepare(&claim(
            "m2",
            &[("a", "gpu-0", None), ("b", "gpu-1", None)],
            &[
                (&["a"], mps(json!({"defaultActiveThreadPercentage": 10}))),
                (&["b"], mps(json!({"defaultActiveThreadPercentage": 20}))),
            ],
        ))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("same mpsConfig") && e.contains("config[1]"),
        "{e}"
    );
    let e = f
        .state
        .prepare(&claim(
            "m3",
            &[("a", "gpu-0", None)],
            &[(
                &[],
                mps(json!({"defaultPerDevicePinnedMemoryLimit": {"GPU-nope": "1Gi"}})),
            )],
        ))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("config[0].opaque.parameters.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[GPU-nope]"),
        "{e}"
    );
    assert!(f.runner.running_claims().is_empty());
    assert_eq!(f.backend.settings(0).compute_mode, ComputeMode::Default);
}

#[tokio::test]
async fn consumable_shares_need_equal_configs() {
    let f = fixture();
    let plain = |uid: &str, share: &str| claim(uid, &[("gpu", "gpu-0", Some(share))], &[]);
    let a = f.state.prepare(&plain("a", "s-a")).await.unwrap();
    let b = f.state.prepare(&plain("b", "s-b")).await.unwrap();
    assert_eq!(a[0].share_id.as_deref(), Some("s-a"));
    assert_eq!(b[0].share_id.as_deref(), Some("s-b"));
    let e = f
        .state
        .prepare(&claim(
            "c",
            &[("gpu", "gpu-0", Some("s-c"))],
            &[(&[], time_slicing("Default"))],
        ))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Busy(_)), "{e:?}");
    assert!(
        e.to_string().contains("different config") && e.to_string().contains("ns/claim-a"),
        "{e}"
    );
    let e = f
        .state
        .prepare(&claim("d", &[("gpu", "gpu-0", None)], &[]))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Busy(_)), "an unshared claim: {e:?}");

    // An exclusively held device cannot be shared either.
    f.state
        .prepare(&claim("x", &[("gpu", "gpu-1", None)], &[]))
        .await
        .unwrap();
    let e = f.state.prepare(&plain("y", "s-y")).await;
    assert!(e.is_ok(), "gpu-0 is shared: {e:?}");
    let e = f
        .state
        .prepare(&claim("z", &[("gpu", "gpu-1", Some("s-z"))], &[]))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Busy(_)), "{e:?}");

    // Once the others go, a different config is fine.
    for uid in ["a", "b", "y"] {
        f.state.unprepare(uid).await.unwrap();
    }
    f.state
        .prepare(&claim(
            "c",
            &[("gpu", "gpu-0", Some("s-c"))],
            &[(&[], time_slicing("Default"))],
        ))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_restart_readopts_live_daemons_restarts_dead_ones_and_restores_time_slices() {
    let f = fixture();
    f.state
        .prepare(&claim(
            "m1",
            &[("gpu", "gpu-0", None)],
            &[(&[], mps(json!({})))],
        ))
        .await
        .unwrap();
    f.state
        .prepare(&claim(
            "t1",
            &[("gpu", "gpu-1", None)],
            &[(&[], time_slicing("Medium"))],
        ))
        .await
        .unwrap();
    // A stray directory of a claim no record knows, with a daemon in it.
    let stray = claim("gone", &[("gpu", "gpu-0", None)], &[]);
    let stray_root = f.state.mps_root().join(&stray.claim.uid);
    std::fs::create_dir_all(stray_root.join("pipe")).unwrap();
    f.runner.running.lock().unwrap().insert(
        stray_root.join("pipe"),
        DaemonHandle {
            pid: 1,
            start_time: 1,
        },
    );

    // Restart with the daemon still running: it is re-adopted, not started again.
    let fresh = simulated("h100-80gb:2");
    let s2 = state_on(f.dir.path(), fresh.clone(), f.runner.clone(), GATES);
    assert_eq!(s2.recover_sharing().await.unwrap(), (1, 0));
    assert_eq!(f.runner.started.lock().unwrap().len(), 1);
    assert_eq!(
        fresh.settings(1).time_slice,
        TimeSliceInterval::Medium,
        "time slice applied again"
    );
    assert!(!stray_root.exists(), "stray MPS directory removed");
    assert_eq!(f.runner.running_claims().len(), 1, "stray daemon stopped");

    // Restart after the daemon died: it is started again and the record gets the new handle.
    f.runner.kill_all();
    let fresh = simulated("h100-80gb:2");
    let s3 = state_on(f.dir.path(), fresh.clone(), f.runner.clone(), GATES);
    let (rewritten, _) = s3.repair_cdi().await.unwrap();
    assert_eq!(rewritten, 0);
    assert_eq!(f.runner.started.lock().unwrap().len(), 2);
    assert_eq!(
        fresh.settings(0).compute_mode,
        ComputeMode::ExclusiveProcess
    );
    let handle = s3
        .checkpoint()
        .get("m1")
        .unwrap()
        .hardware
        .iter()
        .find_map(|h| match serde_json::from_value(h.clone()) {
            Ok(HardwareChange::Mps { handle, .. }) => handle,
            _ => None,
        })
        .unwrap();
    assert!(f.runner.is_running(&handle));
    // A lost CDI spec is rebuilt with the MPS edits.
    std::fs::remove_file(s3.cdi().spec_path("m1")).unwrap();
    assert_eq!(s3.repair_cdi().await.unwrap().0, 1);
    let spec = s3.cdi().read("m1").unwrap().unwrap();
    assert!(
        spec.devices[0]
            .container_edits
            .env
            .contains(&"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps".to_string())
    );
    s3.unprepare("m1").await.unwrap();
    assert!(f.runner.running_claims().is_empty());
    assert_eq!(fresh.settings(0).compute_mode, ComputeMode::Default);
}

#[tokio::test]
async fn a_crash_mid_prepare_is_undone_including_its_daemon() {
    let f = fixture();
    let c = claim("m1", &[("gpu", "gpu-0", None)], &[(&[], mps(json!({})))]);
    // What a crash right after the daemon started leaves: a PrepareStarted record without a
    // handle, the directories, a running daemon and the compute mode.
    let daemon = MpsDaemon {
        claim_uid: "m1".into(),
        root: f.state.mps_root().join("m1"),
        gpu_minors: vec![0],
        device_uuids: vec![],
        active_thread_percentage: None,
        pinned_limits_mib: vec![],
        multi_user: false,
    };
    daemon.create_dirs().unwrap();
    f.runner.start(&daemon).unwrap();
    f.backend
        .set_compute_mode(0, ComputeMode::ExclusiveProcess)
        .unwrap();
    f.backend
        .set_time_slice(0, TimeSliceInterval::Long)
        .unwrap();
    let record = ClaimRecord {
        state: ClaimState::PrepareStarted,
        namespace: "ns".into(),
        name: "claim-m1".into(),
        devices: vec![],
        hardware: vec![
            serde_json::to_value(HardwareChange::TimeSlice {
                gpu_minor: 0,
                interval: TimeSliceInterval::Long,
            })
            .unwrap(),
            serde_json::to_value(HardwareChange::Mps {
                daemon,
                handle: None,
            })
            .unwrap(),
            json!({"futureChange": {"x": 1}}),
        ],
        unknown: Default::default(),
    };
    f.state
        .checkpoint()
        .update(|cp| cp.insert("m1".into(), record))
        .await
        .unwrap();
    // Unknown entries are tolerated; the crashed attempt is undone, then the claim prepared.
    f.state.prepare(&c).await.unwrap();
    assert_eq!(f.backend.settings(0).time_slice, TimeSliceInterval::Default);
    assert_eq!(f.runner.started.lock().unwrap().len(), 2);
    assert_eq!(f.runner.running_claims().len(), 1);
    assert_eq!(
        f.backend.settings(0).compute_mode,
        ComputeMode::ExclusiveProcess
    );
}
