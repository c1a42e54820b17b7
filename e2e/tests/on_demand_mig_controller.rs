//! On-demand MIG with the controller through the real kubelet: a node with `--on-demand-mig` and
//! no MIG device; a pod asks for a 3g.40gb; the controller (`dra-controller run`, GPUCluster with
//! `onDemandMig` on and a short hold-down) writes the MigLayout spec, the plugin carves the device,
//! the scheduler places the pod and it runs. Once the pod is gone, the GPU goes back to whole.
//!
//! The controller runs as a subprocess (`E2E_CONTROLLER_BIN`, default `target/debug/dra-controller`).

use anyhow::{Result, ensure};
use e2e::controller::{apply_crds, nvidia_api, start_controller};
use e2e::env::{Env, PodClaim, WAIT, allocation_results, wait_until};
use e2e::env_or_skip;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::process::Child;

const TEMPLATES: &str = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: whole
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: mig-1g
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel:
              expression: "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
---
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

/// The GPUCluster with on-demand MIG on; its migration pool selects no node, so the GPUCluster
/// reconciler leaves the scenario's node as it is.
async fn apply_gpucluster(env: &Env, hold_down: &str) -> Result<()> {
    let gc = json!({
        "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
        "metadata": { "name": "gpu-cluster" },
        "spec": {
            "draDriver": {
                "gpus": { "onDemandMig": { "enabled": true, "policy": "BinPack", "holdDown": hold_down } },
                "computeDomains": { "enabled": false },
            },
            "migrationPool": { "nodeSelector": { "matchLabels": { "e2e-no-such-pool": "true" } } },
        },
    });
    let ssa = PatchParams::apply("e2e").force();
    nvidia_api(env, "GPUCluster", "gpuclusters")
        .patch("gpu-cluster", &ssa, &Patch::Apply(&gc))
        .await?;
    Ok(())
}

/// Waits until the node publishes every device of `present` and none of `absent`.
async fn wait_devices(env: &Env, node: &str, present: &[&str], absent: &[&str]) -> Result<()> {
    let what = format!("{node} publishing {present:?} without {absent:?}");
    wait_until(&what, WAIT, || async {
        let d = env.devices(node).await?;
        let ok = present.iter().all(|n| d.contains_key(*n))
            && absent.iter().all(|n| !d.contains_key(*n));
        Ok(ok.then_some(()))
    })
    .await
}

/// The MIG devices the node's spec asks for, over all GPUs, as `profile@start`.
async fn spec_devices(env: &Env, node: &str) -> Result<Vec<String>> {
    let l = nvidia_api(env, "MigLayout", "miglayouts").get(node).await?;
    let gpus = l.data["spec"]["gpus"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    Ok(gpus
        .iter()
        .flat_map(|g| g["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| format!("{}@{}", d["profile"].as_str().unwrap_or("?"), d["start"]))
        .collect())
}

/// How many GPUs the node's plugin reports in its MigLayout status.
async fn reported_gpus(env: &Env, node: &str) -> Result<usize> {
    let l = nvidia_api(env, "MigLayout", "miglayouts")
        .get_opt(node)
        .await?;
    Ok(
        l.and_then(|l| l.data["status"]["gpus"].as_array().map(Vec::len))
            .unwrap_or(0),
    )
}

/// A node with `gpus` H100s on `--on-demand-mig`, reported in its MigLayout; the GPUCluster with
/// a 5 s hold-down; the controller started; the claim templates created.
async fn setup(env: &mut Env, node: &str, gpus: usize) -> Result<Child> {
    apply_crds(env).await?;
    let profile = format!("h100-80gb:{gpus}");
    env.add_node(node, &["--profile", &profile, "--on-demand-mig"])
        .await?;
    wait_until("the plugin reports its GPUs", WAIT, || async {
        Ok((reported_gpus(env, node).await? == gpus).then_some(()))
    })
    .await?;
    apply_gpucluster(env, "5s").await?;
    env.create_from_yaml(TEMPLATES).await?;
    start_controller(env)
}

/// Deletes the GPUCluster while the controller still runs (its finalizer needs it), stops the
/// controller, and tears the scenario down.
async fn finish(env: Env, mut controller: Child, node: &str) -> Result<()> {
    ensure!(controller.try_wait()?.is_none(), "dra-controller exited");
    nvidia_api(&env, "GPUCluster", "gpuclusters")
        .delete("gpu-cluster", &DeleteParams::default())
        .await?;
    wait_until("GPUCluster gone", WAIT, || async {
        Ok(nvidia_api(&env, "GPUCluster", "gpuclusters")
            .get_opt("gpu-cluster")
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    controller.kill().await?;
    nvidia_api(&env, "MigLayout", "miglayouts")
        .delete(node, &Default::default())
        .await?;
    env.check_violations()?;
    env.teardown().await
}

/// The devices a running pod's claim `name` holds.
async fn devices_of(env: &Env, pod: &str, claim: &str) -> Result<Vec<String>> {
    let c = env.pod_claim(pod, claim).await?;
    Ok(allocation_results(&c)
        .into_iter()
        .map(|r| r.device)
        .collect())
}

#[tokio::test]
async fn odc1_carve_for_pending_pod_then_merge() -> Result<()> {
    let mut env = env_or_skip!("odc1_carve_for_pending_pod_then_merge");
    let node = "odc1-h100";
    let controller = setup(&mut env, node, 2).await?;

    // Nothing publishes a 3g.40gb: the pod waits until the controller has one carved.
    let claim = [PodClaim {
        name: "mig",
        template: "mig-3g",
    }];
    env.create_pod(&env.pod_manifest("odc1-pod", Some(node), &claim, None)?)
        .await?;
    env.wait_running("odc1-pod").await?;
    let got = devices_of(&env, "odc1-pod", "mig").await?;
    ensure!(
        got.len() == 1 && got[0].starts_with("gpu-1-mig-3g40gb-9-"),
        "odc1-pod got {got:?}, want a 3g.40gb on gpu-1 (carves start from the highest minor)"
    );
    let wanted = spec_devices(&env, node).await?;
    ensure!(
        wanted.len() == 1 && wanted[0].starts_with("3g.40gb@"),
        "spec: {wanted:?}"
    );
    wait_until("a MigDeviceWanted Event on the MigLayout", WAIT, || async {
        let events: Api<Event> = Api::all(env.client.clone());
        let lp = ListParams::default().fields(&format!(
            "involvedObject.kind=MigLayout,involvedObject.name={node},reason=MigDeviceWanted"
        ));
        Ok(events.list(&lp).await?.items.first().cloned())
    })
    .await?;

    // With the pod gone, the device idles through the hold-down and gpu-1 is whole again.
    env.delete_pod("odc1-pod").await?;
    env.wait_pod_gone("odc1-pod").await?;
    wait_devices(&env, node, &["gpu-0", "gpu-1"], &[&got[0]]).await?;
    ensure!(
        spec_devices(&env, node).await?.is_empty(),
        "spec still carved"
    );
    finish(env, controller, node).await
}

/// A burst of whole-GPU, 3g.40gb and 1g.10gb pods, with the controller killed and restarted as
/// soon as its first spec is written: every pod runs, no two hold one device, the first pods
/// keep their devices while the rest arrive, and all GPUs end whole once the pods are gone.
#[tokio::test]
async fn odc2_mixed_burst_survives_controller_restart() -> Result<()> {
    let mut env = env_or_skip!("odc2_mixed_burst_survives_controller_restart");
    let node = "odc2-h100";
    let mut controller = setup(&mut env, node, 3).await?;
    let pods = [
        ("odc2-whole", "gpu", "whole"),
        ("odc2-3g-a", "mig", "mig-3g"),
        ("odc2-3g-b", "mig", "mig-3g"),
        ("odc2-1g-a", "mig", "mig-1g"),
        ("odc2-1g-b", "mig", "mig-1g"),
    ];
    for (pod, name, template) in pods {
        let claim = [PodClaim { name, template }];
        env.create_pod(&env.pod_manifest(pod, Some(node), &claim, None)?)
            .await?;
    }
    wait_until("a first MigLayout spec", WAIT, || async {
        Ok((!spec_devices(&env, node).await?.is_empty()).then_some(()))
    })
    .await?;
    controller.kill().await?;
    controller = start_controller(&env)?;

    let mut held = Vec::new();
    for (pod, name, _) in pods {
        env.wait_running(pod).await?;
        held.push((pod, devices_of(&env, pod, name).await?));
    }
    let mut all: Vec<&String> = held.iter().flat_map(|(_, d)| d).collect();
    all.sort();
    let n = all.len();
    all.dedup();
    ensure!(n == pods.len() && all.len() == n, "devices: {held:?}");
    ensure!(
        held[0].1.len() == 1 && !held[0].1[0].contains("-mig-"),
        "the whole-GPU pod got {:?}",
        held[0].1
    );
    for (pod, devices) in &held {
        ensure!(
            devices_of(&env, pod, pods.iter().find(|p| p.0 == *pod).unwrap().1).await? == *devices,
            "{pod} changed devices"
        );
    }
    for (pod, _, _) in pods {
        env.delete_pod(pod).await?;
    }
    for (pod, _, _) in pods {
        env.wait_pod_gone(pod).await?;
    }
    wait_until("every GPU whole again", WAIT, || async {
        let d = env.devices(node).await?;
        let whole = ["gpu-0", "gpu-1", "gpu-2"]
            .iter()
            .all(|g| d.contains_key(*g));
        let none = !d.keys().any(|k| k.contains("-mig-"));
        Ok((whole && none && spec_devices(&env, node).await?.is_empty()).then_some(()))
    })
    .await?;
    finish(env, controller, node).await
}
