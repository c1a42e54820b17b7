//! Sharing over the plugin's real sockets: an MPS claim (simulated backend, so the stand-in
//! daemon, a real process) gets its directories, env and mounts in the CDI spec, and everything is
//! gone after unprepare; time slices show in `sharing.json`; consumable shares report share IDs.
mod common;
use std::path::Path;
use std::time::Duration;

use clap::Parser;
use dra_plugin::cli::{Cli, Command};
use dra_plugin::grpc::client::{get_info, unix_channel};
use dra_plugin_core::sharing::SharingStateFile;
use dra_plugin_core::sharing::runner::proc_start_time;
use kubelet_proto::dra_v1::{self as v1, dra_plugin_client::DraPluginClient};
use tokio::sync::watch;

const GATES: &str = "MPSSupport=true,TimeSlicingSettings=true,ConsumableShares=true";

struct Plugin {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    client: DraPluginClient<tonic::transport::Channel>,
}

/// Starts `dra-plugin run` in-process (offline claims), arguments parsed like the binary's.
async fn start(dir: &Path) -> Plugin {
    common::offline_dir(dir);
    let d = |p: &str| dir.join(p).display().to_string();
    let cli = Cli::try_parse_from([
        "dra-plugin",
        "run",
        "--node-name",
        "node-1",
        "--backend",
        "simulated",
        "--profile",
        "h100-80gb:2",
        "--feature-gates",
        GATES,
        "--registrar-dir",
        &d("registry"),
        "--plugin-dir",
        &d("plugin"),
        "--cdi-root",
        &d("cdi"),
        "--offline-claims-dir",
        &d("claims"),
        "--boot-id-file",
        &d("boot_id"),
        "--metrics-port",
        "0",
        "--healthcheck-port",
        "0",
    ])
    .unwrap();
    let Command::Run(args) = cli.command else {
        panic!("parsed as run")
    };
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(dra_plugin::run::run_until(args, rx));
    let reg = dir.join("registry/gpu.nvidia.com-reg.sock");
    while get_info(&reg).await.is_err() {
        assert!(!task.is_finished(), "the plugin exited early");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let client = DraPluginClient::new(unix_channel(&dir.join("plugin/dra.sock")).await.unwrap());
    Plugin { stop, task, client }
}

/// Writes an allocated claim `(request, device, share id)` with one claim config for all requests.
fn claim(
    dir: &Path,
    name: &str,
    uid: &str,
    results: &[(&str, &str, Option<&str>)],
    sharing: serde_json::Value,
) -> v1::Claim {
    let results: Vec<_> = results
        .iter()
        .map(|(req, dev, share)| {
            let mut r = serde_json::json!({"request": req, "driver": "gpu.nvidia.com", "pool": "node-1", "device": dev});
            if let Some(s) = share {
                r["shareID"] = (*s).into();
            }
            r
        })
        .collect();
    let obj = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {
            "results": results,
            "config": [{"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}}}]
        }}}
    });
    common::put_claim(dir, &obj);
    v1::Claim {
        namespace: "ns".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

/// The pid in the stand-in's log line `stand-in MPS control daemon <pid> for <uuids>`.
fn daemon_pid(log_dir: &Path) -> u32 {
    let log = std::fs::read_to_string(log_dir.join("control.log")).unwrap();
    log.lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(4))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {log:?}"))
}

#[tokio::test]
async fn an_mps_claim_gets_its_daemon_dirs_env_and_mounts_and_loses_them_at_unprepare() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = start(dir.path()).await;
    let c = claim(
        dir.path(),
        "mps",
        "uid-mps",
        &[("gpu", "gpu-1", None)],
        serde_json::json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25, "defaultPinnedDeviceMemoryLimit": "4Gi"}}),
    );
    let r = common::prepare(&mut p.client, &c).await;
    assert_eq!(r.error, "");
    assert_eq!(
        r.devices[0].cdi_device_ids,
        ["k8s.gpu.nvidia.com/claim=uid-mps-gpu-1"]
    );

    let root = dir.path().join("plugin/mps/uid-mps");
    let pipe = root.join("pipe");
    assert!(
        pipe.join("control").exists(),
        "the daemon made its control pipe"
    );
    assert!(root.join("shm").is_dir() && root.join("log").is_dir());
    let pid = daemon_pid(&root.join("log"));
    assert!(proc_start_time(pid).is_some(), "daemon {pid} runs");

    let spec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("cdi/k8s.gpu.nvidia.com-claim_uid-mps.json")).unwrap(),
    )
    .unwrap();
    let edits = &spec["devices"][0]["containerEdits"];
    let env: Vec<&str> = edits["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    let uuid = env[0].strip_prefix("NVIDIA_VISIBLE_DEVICES=").unwrap();
    assert!(uuid.starts_with("GPU-"), "{env:?}");
    for want in [
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps".to_string(),
        "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps".to_string(),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25".to_string(),
        format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={uuid}=4096M"),
    ] {
        assert!(env.contains(&want.as_str()), "{want} in {env:?}");
    }
    let mounts: Vec<(String, String)> = edits["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["hostPath"].as_str().unwrap().to_string(),
                m["containerPath"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for (host, container) in [
        (pipe.clone(), "/tmp/nvidia-mps"),
        (root.join("log"), "/var/log/nvidia-mps"),
        (root.join("shm"), "/dev/shm"),
    ] {
        assert!(
            mounts.contains(&(host.display().to_string(), container.to_string())),
            "{host:?} -> {container} in {mounts:?}"
        );
    }
    let state = SharingStateFile::read(&dir.path().join("plugin")).unwrap();
    assert_eq!(state.gpus["gpu-1"].compute_mode, "ExclusiveProcess");

    assert_eq!(common::unprepare(&mut p.client, &c).await, "");
    assert_eq!(proc_start_time(pid), None, "daemon {pid} is gone");
    assert!(!root.exists(), "MPS directories removed");
    assert!(
        SharingStateFile::read(&dir.path().join("plugin"))
            .unwrap()
            .gpus
            .is_empty()
    );
    p.stop.send(true).unwrap();
    p.task.await.unwrap().unwrap();
}

#[tokio::test]
async fn time_slices_and_consumable_shares_over_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = start(dir.path()).await;
    let short =
        serde_json::json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}});
    let a = claim(
        dir.path(),
        "a",
        "uid-a",
        &[("gpu", "gpu-0", Some("share-a"))],
        short.clone(),
    );
    let b = claim(
        dir.path(),
        "b",
        "uid-b",
        &[("gpu", "gpu-0", Some("share-b"))],
        short,
    );
    let ra = common::prepare(&mut p.client, &a).await;
    let rb = common::prepare(&mut p.client, &b).await;
    assert_eq!((ra.error.as_str(), rb.error.as_str()), ("", ""));
    assert_eq!(ra.devices[0].share_id.as_deref(), Some("share-a"));
    assert_eq!(rb.devices[0].share_id.as_deref(), Some("share-b"));
    let state = SharingStateFile::read(&dir.path().join("plugin")).unwrap();
    assert_eq!(format!("{:?}", state.gpus["gpu-0"].time_slice), "Short");

    let long = claim(
        dir.path(),
        "c",
        "uid-c",
        &[("gpu", "gpu-0", Some("share-c"))],
        serde_json::json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
    );
    let rc = common::prepare(&mut p.client, &long).await;
    assert!(
        rc.error.contains("time slice Long") && rc.error.contains("ns/a"),
        "{}",
        rc.error
    );
    assert_eq!(common::unprepare(&mut p.client, &a).await, "");
    assert_eq!(common::unprepare(&mut p.client, &b).await, "");
    let state = SharingStateFile::read(&dir.path().join("plugin")).unwrap();
    assert!(state.gpus.is_empty(), "{state:?}");
    p.stop.send(true).unwrap();
    p.task.await.unwrap().unwrap();
}
