//! Device health on the real control plane: an injected XID taints the GPU in the published
//! slices, the scheduler stops placing claims on it, recovery lifts the taint, and the kubelet
//! health stream reports the change for prepared devices.
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::env::{Env, PodClaim, WAIT, wait_until};
use kube::ResourceExt;
use kubelet_proto::health_v1::{self as h1, dra_resource_health_client::DraResourceHealthClient};

use e2e::env_or_skip;

fn inject(env: &Env, node: &str, line: &str) -> Result<()> {
    use std::io::Write;
    let path = env.node(node).dirs.plugin.join("simulated-health-events");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| path.display().to_string())?;
    writeln!(f, "{line}")?;
    Ok(())
}

async fn taints_of(env: &Env, node: &str, device: &str) -> Result<Vec<String>> {
    let slices = env.wait_slices(node).await?;
    Ok(slices
        .iter()
        .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
        .filter(|d| d.name == device)
        .flat_map(|d| d.taints.unwrap_or_default())
        .map(|t| format!("{}={}:{}", t.key, t.value.unwrap_or_default(), t.effect))
        .collect())
}

#[tokio::test]
async fn h1_xid_taints_then_recovers_and_the_health_stream_follows() -> Result<()> {
    let mut env = env_or_skip!("h1_xid_taints_then_recovers_and_the_health_stream_follows");
    let node = "h1-h100";
    env.add_node(
        node,
        &[
            "--profile",
            "h100-80gb:2",
            "--feature-gates",
            "NVMLDeviceHealthCheck=true",
            "--health-hold-down-seconds",
            "3",
        ],
    )
    .await?;
    env.create_from_file("examples/claims/single-gpu.yaml")
        .await?;
    let claim = [PodClaim {
        name: "gpu",
        template: "single-gpu",
    }];

    inject(&env, node, "gpu-0 xid 79")?;
    wait_until("gpu-0 tainted in the published slice", WAIT, || async {
        let t = taints_of(&env, node, "gpu-0").await?;
        Ok(t.contains(&"gpu.nvidia.com/xid=79:NoSchedule".to_string())
            .then_some(()))
    })
    .await?;

    // The scheduler places the first pod on the healthy GPU and cannot place a second one.
    env.create_pod(&env.pod_manifest("first", Some(node), &claim, None)?)
        .await?;
    env.wait_running("first").await?;
    let got = env.pod_claim("first", "gpu").await?;
    let device = got
        .status
        .and_then(|s| s.allocation)
        .and_then(|a| a.devices)
        .and_then(|d| d.results)
        .unwrap_or_default();
    ensure!(
        device.len() == 1 && device[0].device == "gpu-1",
        "first pod got {:?}, want gpu-1",
        device.iter().map(|r| &r.device).collect::<Vec<_>>()
    );
    env.create_pod(&env.pod_manifest("second", Some(node), &claim, None)?)
        .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let phase = env
        .pods()
        .get("second")
        .await?
        .status
        .and_then(|s| s.phase)
        .unwrap_or_default();
    ensure!(
        phase == "Pending",
        "second pod is {phase} although the only free GPU is tainted"
    );

    // The kubelet health stream sees the prepared gpu-1 go unhealthy on an XID.
    let sock = env.node(node).dirs.plugin.join("dra.sock");
    let mut stream = DraResourceHealthClient::new(e2e::grpc::uds_channel(&sock))
        .node_watch_resources(h1::NodeWatchResourcesRequest {})
        .await?
        .into_inner();
    let first = stream.message().await?.context("stream ended")?;
    let line = first
        .devices
        .iter()
        .find(|d| d.device.as_ref().is_some_and(|i| i.device_name == "gpu-1"))
        .context("gpu-1 not reported")?;
    ensure!(
        line.health == h1::HealthStatus::Healthy as i32,
        "gpu-1 starts {:?}",
        line.health
    );
    inject(&env, node, "gpu-1 xid 48")?;
    let mut unhealthy = false;
    for _ in 0..5 {
        let m = tokio::time::timeout(Duration::from_secs(15), stream.message())
            .await??
            .context("stream ended")?;
        if m.devices.iter().any(|d| {
            d.device.as_ref().is_some_and(|i| i.device_name == "gpu-1")
                && d.health == h1::HealthStatus::Unhealthy as i32
        }) {
            unhealthy = true;
            break;
        }
    }
    ensure!(
        unhealthy,
        "the health stream never reported gpu-1 unhealthy"
    );

    // Recovery: gpu-0 reports healthy, the hold-down passes, the taint goes and the pod schedules.
    inject(&env, node, "gpu-0 healthy")?;
    wait_until("gpu-0 untainted", WAIT, || async {
        Ok(taints_of(&env, node, "gpu-0")
            .await?
            .is_empty()
            .then_some(()))
    })
    .await?;
    env.wait_running("second").await?;
    println!(
        "second pod {} runs on the recovered GPU",
        env.pods().get("second").await?.name_any()
    );
    env.check_violations()?;
    env.teardown().await
}
