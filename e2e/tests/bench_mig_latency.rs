//! `make bench-mig-latency`: pod creation -> Running when the pod's MIG device does not exist yet,
//! through the stock kubelet and the simulated backend, in the two modes that create devices:
//!
//! - publish every placement (`DynamicMIG=true`): the scheduler picks a placement, the plugin
//!   creates the device at prepare;
//! - on-demand (`--on-demand-mig` + `dra-controller` with `onDemandMig` on): the pod waits until the
//!   controller's MIG shaper writes the node's MigLayout, the plugin carves and republishes, and the
//!   scheduler places it.
//!
//! In each mode one node of 8 H100s with no MIG device gets `E2E_BENCH_PODS` (10) pods one after
//! another, each with a claim for a 3g.40gb; the pods stay, so every pod needs a new device. It
//! prints `odm|` rows (p50 and max) for tools/perf-table.py. A bench, not a check: it runs only with
//! `E2E_BENCH_MIG_LATENCY=1` (the make target sets it) and asserts nothing about the times.
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use e2e::controller::{apply_crds, controller_log, nvidia_api, start_controller};
use e2e::env::{Env, PodClaim, WAIT, wait_until};
use e2e::env_or_skip;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use tokio::process::Child;

const TEMPLATE: &str = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: mig-3g
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel:
              expression: "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"
"#;

const GPUS: usize = 8;

/// `dra-controller run` for the scenario's namespace; returns once it leads (its log says so), so
/// the first pod does not also time the controller's start.
async fn start_leading_controller(env: &Env) -> Result<Child> {
    let mut child = start_controller(env)?;
    let path = controller_log(env);
    let deadline = Instant::now() + WAIT;
    while !std::fs::read_to_string(&path)
        .unwrap_or_default()
        .contains("starting controllers")
    {
        if let Some(status) = child.try_wait()? {
            bail!("dra-controller exited: {status}");
        }
        if Instant::now() > deadline {
            bail!("dra-controller not leading within {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(child)
}

/// Creates `n` pods on `node` one after another, each with a 3g.40gb claim, and returns each one's
/// creation -> Running time. Polled every 20 ms: wait_until's 200 ms would blur the figures.
async fn one_after_another(env: &Env, node: &str, n: usize) -> Result<Vec<Duration>> {
    let mut out = Vec::new();
    for i in 0..n {
        let name = format!("{node}-{i}");
        let claim = [PodClaim {
            name: "mig",
            template: "mig-3g",
        }];
        let pod = env.pod_manifest(&name, Some(node), &claim, None)?;
        let t0 = Instant::now();
        env.create_pod(&pod).await?;
        loop {
            let p = env.pods().get(&name).await?;
            if p.status.and_then(|s| s.phase).as_deref() == Some("Running") {
                break;
            }
            if t0.elapsed() > WAIT {
                env.explain_pod(&name).await;
                bail!("pod {name} not Running within {WAIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        out.push(t0.elapsed());
    }
    Ok(out)
}

async fn delete_all(env: &Env, node: &str, n: usize) -> Result<()> {
    for i in 0..n {
        env.delete_pod(&format!("{node}-{i}")).await?;
    }
    for i in 0..n {
        env.wait_pod_gone(&format!("{node}-{i}")).await?;
    }
    Ok(())
}

/// (p50, max) in seconds.
fn summary(times: &[Duration]) -> (f64, f64) {
    let mut s: Vec<f64> = times.iter().map(Duration::as_secs_f64).collect();
    s.sort_by(f64::total_cmp);
    (s[s.len() / 2], s[s.len() - 1])
}

#[tokio::test]
async fn bench_mig_latency() -> Result<()> {
    if std::env::var("E2E_BENCH_MIG_LATENCY").as_deref() != Ok("1") {
        println!("SKIP bench_mig_latency: a bench; `make bench-mig-latency` runs it");
        return Ok(());
    }
    let n: usize = std::env::var("E2E_BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let mut env = env_or_skip!("bench_mig_latency");
    let profile = format!("h100-80gb:{GPUS}");
    env.create_from_yaml(TEMPLATE).await?;

    // Publish every placement: the device is created at prepare.
    let dynamic = "bml-dynamic";
    env.add_node(
        dynamic,
        &["--profile", &profile, "--feature-gates", "DynamicMIG=true"],
    )
    .await?;
    let dyn_times = one_after_another(&env, dynamic, n).await?;
    delete_all(&env, dynamic, n).await?;

    // On demand: the controller carves before the scheduler can place. A 1 h hold-down keeps each
    // carved device, so every pod needs a new one.
    let ondemand = "bml-ondemand";
    apply_crds(&env).await?;
    env.add_node(ondemand, &["--profile", &profile, "--on-demand-mig"])
        .await?;
    let layouts = nvidia_api(&env, "MigLayout", "miglayouts");
    wait_until("the plugin reports its GPUs", WAIT, || async {
        let l = layouts.get_opt(ondemand).await?;
        let gpus = l.and_then(|l| l.data["status"]["gpus"].as_array().map(Vec::len));
        Ok((gpus == Some(GPUS)).then_some(()))
    })
    .await?;
    let gc = json!({
        "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
        "metadata": { "name": "gpu-cluster" },
        "spec": {
            "draDriver": {
                "gpus": { "onDemandMig": { "enabled": true, "policy": "BinPack", "holdDown": "1h" } },
                "computeDomains": { "enabled": false },
            },
            // Selects no node: the GPUCluster reconciler leaves the bench's nodes as they are.
            "migrationPool": { "nodeSelector": { "matchLabels": { "e2e-no-such-pool": "true" } } },
        },
    });
    let clusters = nvidia_api(&env, "GPUCluster", "gpuclusters");
    let ssa = PatchParams::apply("e2e").force();
    clusters
        .patch("gpu-cluster", &ssa, &Patch::Apply(&gc))
        .await?;
    let mut controller = start_leading_controller(&env).await?;
    let odm_times = one_after_another(&env, ondemand, n).await?;
    delete_all(&env, ondemand, n).await?;

    let (dp50, dmax) = summary(&dyn_times);
    let (op50, omax) = summary(&odm_times);
    let what = format!(
        "pod creation -> Running, a 3g.40gb to create, {n} pods one by one (kubelet, simulated)"
    );
    // On a line of their own: the test harness has printed "test bench_mig_latency ... " already.
    println!("\nodm|{what}, p50|—|{dp50:.2} s|{op50:.2} s|—|—");
    println!("odm|{what}, max|—|{dmax:.2} s|{omax:.2} s|—|—");

    // The GPUCluster goes while the controller runs: its finalizer needs it.
    clusters
        .delete("gpu-cluster", &DeleteParams::default())
        .await?;
    wait_until("GPUCluster gone", WAIT, || async {
        Ok(clusters
            .get_opt("gpu-cluster")
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    controller.kill().await?;
    layouts.delete(ondemand, &DeleteParams::default()).await?;
    env.check_violations()?;
    env.teardown().await
}
