//! The migration pool through stock kubelets: one `nvidia.com/gpu: 1` pod spec runs on a pool
//! node through DRA (our plugin, the DeviceClass with `extendedResourceName`) and on a node
//! outside the pool through a classic device plugin, as a cluster half-way through moving off
//! the device plugin has it.
use std::process::Stdio;

use anyhow::{Context, Result, ensure};
use e2e::env::{Env, WAIT, allocation_results, wait_until};
use e2e::env_or_skip;
use e2e::real_kubelet::{KubeletSetup, RealKubelet};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use tokio::process::{Child, Command};

/// A node outside the pool: a stock kubelet with the fake device plugin advertising
/// `nvidia.com/gpu` (no DRA plugin).
struct DevicePluginNode {
    kubelet: RealKubelet,
    device_plugin: Child,
}

async fn device_plugin_node(env: &Env, name: &str, gpus: u32) -> Result<DevicePluginNode> {
    let setup = KubeletSetup::from_env(&env.repo, &env.kubeconfig).context("no stock kubelet")?;
    let node_dir = env.work.join("nodes").join(name);
    let cdi = node_dir.join("cdi");
    std::fs::create_dir_all(&cdi)?;
    let kubelet = RealKubelet::start(&env.client, &setup, name, &env.test, &node_dir, &cdi).await?;
    let sockets = kubelet.device_plugin_dir();
    let tools = std::env::var_os("E2E_KUBELET_TOOLS").context("E2E_KUBELET_TOOLS is not set")?;
    let log = std::fs::File::create(node_dir.join("device-plugin.log"))?;
    let device_plugin = Command::new(std::path::Path::new(&tools).join("fake-device-plugin"))
        .arg("--kubelet-socket")
        .arg(sockets.join("kubelet.sock"))
        .arg("--socket-dir")
        .arg(&sockets)
        .args([
            "--resource",
            "nvidia.com/gpu",
            "--devices",
            &gpus.to_string(),
        ])
        .arg("--record")
        .arg(node_dir.join("allocations.jsonl"))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("starting fake-device-plugin")?;
    let nodes: Api<Node> = Api::all(env.client.clone());
    wait_until(
        &format!("{name} advertising nvidia.com/gpu"),
        WAIT,
        || async {
            let n = nodes.get(name).await?;
            let gpus_now = n
                .status
                .and_then(|s| s.allocatable)
                .and_then(|a| a.get("nvidia.com/gpu").map(|q| q.0.clone()));
            Ok((gpus_now == Some(gpus.to_string())).then_some(()))
        },
    )
    .await?;
    Ok(DevicePluginNode {
        kubelet,
        device_plugin,
    })
}

fn extended_gpu() -> serde_json::Value {
    serde_json::json!({"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k10_migration_pool_dra_and_device_plugin_side_by_side() -> Result<()> {
    let mut env = env_or_skip!("k10_migration_pool_dra_and_device_plugin_side_by_side");
    let (pool, legacy) = ("k10-pool", "k10-legacy");
    env.add_node(pool, &["--profile", "h100-80gb:1"]).await?;
    let mut outside = device_plugin_node(&env, legacy, 2).await?;

    for (pod, node) in [("on-pool", pool), ("on-legacy", legacy)] {
        env.create_pod(&env.pod_manifest(pod, Some(node), &[], Some(extended_gpu()))?)
            .await?;
    }
    // In the pool: a claim the scheduler made through the DeviceClass, prepared by our plugin.
    let on_pool = env.wait_running("on-pool").await?;
    let ext = on_pool
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.clone())
        .context("the pool pod has no extendedResourceClaimStatus")?;
    let claim = env.claims().get(&ext.resource_claim_name).await?;
    let r = allocation_results(&claim);
    ensure!(
        r.len() == 1 && r[0].driver == e2e::DRIVER,
        "pool allocation {r:?}"
    );
    let cdi_ids: Vec<String> = env
        .node(pool)
        .kubelet
        .stock()
        .context("stock kubelet")?
        .containers()?
        .into_iter()
        .filter(|c| c.pod_uid == on_pool.uid().unwrap_or_default())
        .flat_map(|c| c.cdi_devices)
        .collect();
    ensure!(cdi_ids.len() == 1, "pool pod CDI devices {cdi_ids:?}");

    // Outside: the device plugin's device, no claim, no CDI.
    let on_legacy: Pod = env.wait_running("on-legacy").await?;
    ensure!(
        on_legacy
            .status
            .as_ref()
            .and_then(|s| s.extended_resource_claim_status.as_ref())
            .is_none(),
        "the device-plugin node's pod got a DRA claim"
    );
    let record = outside
        .kubelet
        .containers()?
        .into_iter()
        .find(|c| c.pod_uid == on_legacy.uid().unwrap_or_default())
        .context("no CreateContainer for the legacy pod")?;
    let visible = record
        .envs
        .get("NVIDIA_VISIBLE_DEVICES")
        .cloned()
        .unwrap_or_default();
    ensure!(
        visible.starts_with("GPU-fake-") && record.cdi_devices.is_empty(),
        "legacy pod: NVIDIA_VISIBLE_DEVICES={visible:?}, CDI {:?}",
        record.cdi_devices
    );
    println!(
        "k10: pool pod -> {} via DRA; legacy pod -> {visible} via the device plugin",
        r[0].device
    );

    for pod in ["on-pool", "on-legacy"] {
        env.delete_pod(pod).await?;
        env.wait_pod_gone(pod).await?;
    }
    outside.device_plugin.kill().await?;
    outside.kubelet.stop().await?;
    let nodes: Api<Node> = Api::all(env.client.clone());
    nodes.delete(legacy, &DeleteParams::default()).await?;
    env.check_violations()?;
    env.teardown().await
}
