//! Sharing scenarios against the real control plane started by `e2e/run.sh`: time-slicing through
//! one claim used by two pods, an MPS claim's daemon and CDI edits, and consumable capacity.
//! Each skips when `E2E_KUBECONFIG` is not set.
use anyhow::{Context, Result, ensure};
use e2e::env::{Env, PodClaim, WAIT, wait_until};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use e2e::env_or_skip;

const GATES: &str = "TimeSlicingSettings=true,MPSSupport=true";

fn gpu_config(sharing: serde_json::Value) -> serde_json::Value {
    serde_json::json!([{"opaque": {"driver": e2e::DRIVER, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}}}])
}

/// A pod whose container uses the existing ResourceClaim `claim` (not a template).
fn pod_with_claim(env: &Env, name: &str, node: &str, claim: &str) -> Result<Pod> {
    let pod = env.pod_manifest(
        name,
        Some(node),
        &[PodClaim {
            name: "gpu",
            template: "unused",
        }],
        None,
    )?;
    let mut v = serde_json::to_value(pod)?;
    v["spec"]["resourceClaims"] = serde_json::json!([{"name": "gpu", "resourceClaimName": claim}]);
    Ok(serde_json::from_value(v)?)
}

fn cdi_spec(env: &Env, node: &str, uid: &str) -> Result<serde_json::Value> {
    let path = env
        .node(node)
        .dirs
        .cdi
        .join(format!("k8s.gpu.nvidia.com-claim_{uid}.json"));
    let data = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_slice(&data)?)
}

/// `sharing.json` in the node's plugin directory: what the plugin applied to each GPU.
fn sharing_state(env: &Env, node: &str) -> Result<serde_json::Value> {
    let path = env.node(node).dirs.plugin.join("sharing.json");
    let data = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_slice(&data)?)
}

fn process_alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
                .unwrap_or(false)
        })
        .unwrap_or(false)
}

/// Two pods share one GPU through one claim configured for TimeSlicing Short; the GPU's time
/// slice is Short while they run and back to Default after both went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sh1_two_pods_share_one_gpu_time_sliced() -> Result<()> {
    let mut env = env_or_skip!("sh1_two_pods_share_one_gpu_time_sliced");
    env.apply_deviceclasses().await?;
    let node = "sh1-node";
    env.add_node(
        node,
        &["--profile", "h100-80gb:2", "--feature-gates", GATES],
    )
    .await?;
    let claim = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "shared-gpu", "namespace": env.ns},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
            "config": gpu_config(serde_json::json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}})),
        }}
    });
    env.create_from_yaml(&serde_yaml::to_string(&claim)?)
        .await?;
    for pod in ["ts-1", "ts-2"] {
        env.create_pod(&pod_with_claim(&env, pod, node, "shared-gpu")?)
            .await?;
    }
    for pod in ["ts-1", "ts-2"] {
        env.wait_running(pod).await?;
    }
    let c = env.claims().get("shared-gpu").await?;
    let uid = c.uid().context("claim uid")?;
    let device = c
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .and_then(|r| r.first())
        .map(|r| r.device.clone())
        .context("allocated device")?;
    let reserved = c
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .map(|r| r.len())
        .unwrap_or(0);
    ensure!(
        reserved == 2,
        "the claim is reserved for both pods ({reserved})"
    );
    let state = sharing_state(&env, node)?;
    ensure!(
        state["gpus"][&device]["timeSlice"] == "Short",
        "{device} time slice Short: {state}"
    );
    ensure!(
        state["gpus"][&device]["claims"] == serde_json::json!([uid]),
        "{state}"
    );
    cdi_spec(&env, node, &uid)?;

    for pod in ["ts-1", "ts-2"] {
        env.delete_pod(pod).await?;
    }
    for pod in ["ts-1", "ts-2"] {
        env.wait_pod_gone(pod).await?;
    }
    wait_until("the time slice back to Default", WAIT, || async {
        let s = sharing_state(&env, node)?;
        Ok(s["gpus"].get(&device).is_none().then_some(()))
    })
    .await?;
    env.check_violations()?;
    env.teardown().await
}

/// An MPS claim: the CDI spec mounts the claim's pipe/log/shm directories and sets the MPS env;
/// the daemon (the simulated backend's stand-in process) runs while the pod does and is gone,
/// with its directories, after unprepare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sh2_mps_claim_gets_a_daemon_and_cdi_edits() -> Result<()> {
    let mut env = env_or_skip!("sh2_mps_claim_gets_a_daemon_and_cdi_edits");
    env.apply_deviceclasses().await?;
    let node = "sh2-node";
    env.add_node(
        node,
        &["--profile", "h100-80gb:1", "--feature-gates", GATES],
    )
    .await?;
    let template = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "mps-gpu", "namespace": env.ns},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
            "config": gpu_config(serde_json::json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"}})),
        }}}
    });
    env.create_from_yaml(&serde_yaml::to_string(&template)?)
        .await?;
    let claims = [PodClaim {
        name: "gpu",
        template: "mps-gpu",
    }];
    env.create_pod(&env.pod_manifest("mps-1", Some(node), &claims, None)?)
        .await?;
    env.wait_running("mps-1").await?;
    let claim = env.pod_claim("mps-1", "gpu").await?;
    let uid = claim.uid().context("claim uid")?;
    let root = env.node(node).dirs.plugin.join("mps").join(&uid);
    let spec = cdi_spec(&env, node, &uid)?;
    let edits = &spec["devices"][0]["containerEdits"];
    let env_vars: Vec<String> = edits["env"]
        .as_array()
        .context("env")?
        .iter()
        .filter_map(|e| e.as_str().map(str::to_string))
        .collect();
    for want in [
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
        "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
    ] {
        ensure!(env_vars.iter().any(|e| e == want), "{want} in {env_vars:?}");
    }
    ensure!(
        env_vars
            .iter()
            .any(|e| e.starts_with("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=GPU-")
                && e.ends_with("=10240M")),
        "pinned limit in {env_vars:?}"
    );
    let mounts = edits["mounts"].as_array().context("mounts")?;
    for (host, container) in [
        (root.join("pipe"), "/tmp/nvidia-mps"),
        (root.join("log"), "/var/log/nvidia-mps"),
        (root.join("shm"), "/dev/shm"),
    ] {
        ensure!(
            mounts
                .iter()
                .any(|m| m["hostPath"] == host.display().to_string()
                    && m["containerPath"] == container),
            "{} -> {container} in {mounts:?}",
            host.display()
        );
        ensure!(host.is_dir(), "{} exists", host.display());
    }
    ensure!(
        root.join("pipe/control").exists(),
        "the daemon's control pipe"
    );
    let log = std::fs::read_to_string(root.join("log/control.log"))?;
    let pid: u64 = log
        .split_whitespace()
        .nth(4)
        .and_then(|p| p.parse().ok())
        .with_context(|| format!("daemon pid in {log:?}"))?;
    ensure!(process_alive(pid), "MPS daemon {pid} runs");
    let state = sharing_state(&env, node)?;
    ensure!(
        state["gpus"]["gpu-0"]["computeMode"] == "ExclusiveProcess",
        "{state}"
    );

    env.delete_pod("mps-1").await?;
    env.wait_pod_gone("mps-1").await?;
    wait_until("the MPS daemon to go", WAIT, || async {
        Ok((!process_alive(pid) && !root.exists()).then_some(()))
    })
    .await?;
    ensure!(
        sharing_state(&env, node)?["gpus"].get("gpu-0").is_none(),
        "compute mode back to Default"
    );
    env.check_violations()?;
    env.teardown().await
}

/// Consumable capacity: with `ConsumableShares` and `--consumable-shares memory` the plugin
/// publishes shareable GPUs; two pods take 40Gi each of one 80Gi A100 and a third does not fit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sh3_consumable_capacity_shares_one_gpu_by_memory() -> Result<()> {
    let mut env = env_or_skip!("sh3_consumable_capacity_shares_one_gpu_by_memory");
    env.apply_deviceclasses().await?;
    let node = "sh3-node";
    env.add_node(
        node,
        &[
            "--profile",
            "a100-80gb:1",
            "--feature-gates",
            "ConsumableShares=true",
            // As NVIDIA v0.5: the gate alone shares nothing; the mode comes with it.
            "--consumable-shares",
            "memory",
        ],
    )
    .await?;
    let slices = env.slices(node).await?;
    let shareable = slices.iter().any(|s| {
        s.spec
            .devices
            .iter()
            .flatten()
            .any(|d| d.allow_multiple_allocations == Some(true))
    });
    ensure!(
        shareable,
        "the plugin publishes allowMultipleAllocations with ConsumableShares on \
         (run.rs must call gpu_dra_api::slices::enable_consumable_shares)"
    );
    let template = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpu-40gi", "namespace": env.ns},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                "capacity": {"requests": {"memory": "40Gi"}}}}],
        }}}
    });
    env.create_from_yaml(&serde_yaml::to_string(&template)?)
        .await?;
    let claims = [PodClaim {
        name: "gpu",
        template: "gpu-40gi",
    }];
    for pod in ["cc-1", "cc-2"] {
        env.create_pod(&env.pod_manifest(pod, Some(node), &claims, None)?)
            .await?;
    }
    let mut shares = Vec::new();
    for pod in ["cc-1", "cc-2"] {
        env.wait_running(pod).await?;
        let c = env.pod_claim(pod, "gpu").await?;
        let r = c
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .and_then(|r| r.into_iter().next())
            .context("allocation result")?;
        ensure!(r.device == "gpu-0", "{pod} on gpu-0, not {}", r.device);
        shares.push(r.share_id.context("a share ID")?);
    }
    ensure!(shares[0] != shares[1], "distinct shares {shares:?}");
    // Created only once the others are bound: scheduling order is not creation order.
    env.create_pod(&env.pod_manifest("cc-3", Some(node), &claims, None)?)
        .await?;
    wait_until("cc-3 Unschedulable", WAIT, || async {
        let p = env.pods().get("cc-3").await?;
        let unschedulable = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter().any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                })
            });
        Ok(unschedulable.then_some(()))
    })
    .await?;
    for pod in ["cc-1", "cc-2", "cc-3"] {
        env.delete_pod(pod).await?;
    }
    for pod in ["cc-1", "cc-2", "cc-3"] {
        env.wait_pod_gone(pod).await?;
    }
    env.check_violations()?;
    env.teardown().await
}
