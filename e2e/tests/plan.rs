//! `dra-controller plan --kubeconfig` against the real control plane: the cluster is put in the
//! state the NVIDIA device plugin stack leaves (GPU feature discovery labels on the Nodes,
//! workloads asking for `nvidia.com/gpu` and `nvidia.com/mig-<profile>`), the planner reads it
//! live, and its manifests, applied through the API server in place of the old workloads, must
//! run through the stock kubelets on the devices the plan predicted.
//!
//! `E2E_TEST_TARGETS="--test plan" bash e2e/run.sh p1`.
use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use e2e::controller::controller_bin;
use e2e::env::{Env, WAIT, allocation_results, wait_until, yaml_docs, yaml_files};
use e2e::env_or_skip;
use e2e::manifests::{self, WorkloadControllers};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::discovery::Discovery;
use serde_json::{Value, json};

/// Three whole H100s, as `--profile h100-80gb:3` simulates them.
const WHOLE: &str = "p1-whole";
/// One H100 that mig-parted split into seven 1g.10gb, as `--mig-layout all-1g.10gb` simulates it.
const MIG: &str = "p1-mig";
/// One A100-40GB in seven 1g.5gb under the `single` strategy, where `nvidia.com/gpu` was a MIG
/// device.
const SINGLE: &str = "p1-single";
/// One L4 that the device plugin time-sliced into 4 replicas.
const TS: &str = "p1-ts";
/// The plugin settings the plan must ask for on `TS` (its POOL table's PLUGIN SETTINGS): the
/// node's plugin is started with exactly these, so that a wrong setting in the plan shows.
const TS_SETTINGS: &str =
    "--feature-gates TimeSlicingSettings=true,ConsumableShares=true --consumable-shares 4";
/// The test's name, also its nodes' `e2e-test` label.
const TEST: &str = "p1_plan_live_cluster_and_run_its_manifests";
/// Pods of the old workloads, and of the planned ones.
const PODS: usize = 9;
/// The label each workload's pods carry, so that a running pod is matched to the plan's owner
/// (`Deployment/gpu-web` is `Deployment.gpu-web`: a label value has no `/`).
const OWNER: &str = "e2e-plan-owner";

/// Labels as GPU feature discovery sets them for an H100 80GB HBM3 node (the values the real
/// GFD writes, memory in MiB), with the MIG config mig-parted applied.
fn h100_labels(gpus: u32, mig_config: &str) -> Value {
    json!({
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": gpus.to_string(),
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.config": mig_config,
        "nvidia.com/mig.config.state": "success",
    })
}

/// GFD's labels under `mig.strategy=single`: the product gets `-MIG-<profile>`, the count and
/// memory are the MIG devices'.
fn a100_single_labels() -> Value {
    json!({
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia.com/gpu.count": "7",
        "nvidia.com/gpu.memory": "4864",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/mig.config": "all-1g.5gb",
        "nvidia.com/mig.config.state": "success",
    })
}

/// GFD's labels for an L4 under the device plugin's time-slicing with 4 replicas (GFD appends
/// `-SHARED` to the product when sharing without `renameByDefault`).
fn l4_time_sliced_labels() -> Value {
    json!({
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-L4-SHARED",
        "nvidia.com/gpu.count": "1",
        "nvidia.com/gpu.memory": "23034",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
        "nvidia.com/mig.strategy": "none",
    })
}

/// Four stock-kubelet nodes whose plugins simulate the hardware their GFD labels describe; a
/// Deployment (2 × `nvidia.com/gpu: 1`) and a Job (`nvidia.com/gpu: 1`) selecting H100s by
/// `nvidia.com/gpu.product`, a Pod (`nvidia.com/mig-1g.10gb: 1`), a Deployment (3 ×
/// `nvidia.com/gpu: 1`) selecting the time-sliced node and one (2 × `nvidia.com/gpu: 1`)
/// selecting the `single`-strategy node, made as for the device plugin, stay Pending (nothing
/// serves those resources); `plan --kubeconfig` must fit all nine pods and ask for the plugin
/// settings the nodes run with; its files, applied in their place, must run all nine through the
/// kubelets on the planned nodes and kinds of device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_plan_live_cluster_and_run_its_manifests() -> Result<()> {
    let mut env = env_or_skip!(TEST);
    let t0 = std::time::Instant::now();
    env.add_node(WHOLE, &["--profile", "h100-80gb:3"]).await?;
    env.add_node(
        MIG,
        &["--profile", "h100-80gb:1", "--mig-layout", "all-1g.10gb"],
    )
    .await?;
    env.add_node(
        SINGLE,
        &["--profile", "a100-40gb:1", "--mig-layout", "all-1g.5gb"],
    )
    .await?;
    let mut ts_args = vec!["--profile", "l4:1"];
    ts_args.extend(TS_SETTINGS.split(' '));
    env.add_node(TS, &ts_args).await?;
    label_nodes(&env).await?;
    unmap_nvidia_com_gpu(&env).await?;
    // The Deployments' and the Job's pods must exist (Pending) as on a real cluster: the planner
    // reads them and must plan them through their controllers, not as bare pods.
    let mut controllers =
        WorkloadControllers::start(&env.kubeconfig, &env.work.join("p1-controllers.log"))?;
    create_old_workloads(&env).await?;
    wait_pending_pods(&env, PODS).await?;

    let out = env.work.join("p1-plan");
    let report = run_plan(&env, &out)?;
    let settings = &report["settings"];
    for (node, want) in [
        (WHOLE, "defaults"),
        (MIG, "MIG layout all-1g.10gb kept (mig-parted)"),
        (SINGLE, "MIG layout all-1g.5gb kept (mig-parted)"),
        (TS, TS_SETTINGS),
    ] {
        ensure!(
            settings[node] == want,
            "plan's settings for {node}: {}, the node runs {want:?}",
            settings[node]
        );
    }
    // Under `single`, `nvidia.com/gpu: 1` was a 1g.5gb: the request must ask for that profile.
    let single = report["workloads"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|w| {
            w["workload"]
                .as_str()
                .is_some_and(|n| n.ends_with("/single-infer"))
        })
        .context("single-infer not planned")?;
    ensure!(
        single["requests"]
            .to_string()
            .contains("mig.nvidia.com x1 profile 1g.5gb"),
        "single-infer requests {}",
        single["requests"]
    );
    let planned = planned_devices(&report)?;
    println!(
        "p1: planned {planned:?} ({:.0}s)",
        t0.elapsed().as_secs_f64()
    );
    ensure!(
        planned.values().map(Vec::len).sum::<usize>() == PODS,
        "the plan places {planned:?}, not the {PODS} pods"
    );
    // The planner built the slices with the simulated backend's code from the labels; the
    // planned devices must be ones the plugins really publish.
    for (node, devices) in planned.values().flatten() {
        let real = env.devices(node).await?;
        for d in devices {
            ensure!(
                real.contains_key(d),
                "planned device {d} is not published on {node}"
            );
        }
    }

    delete_old_workloads(&env).await?;
    controllers.check_alive()?;
    let discovery = Discovery::new(env.client.clone()).run().await?;
    let mut docs = Vec::new();
    for f in yaml_files(&out)? {
        docs.extend(yaml_docs(&std::fs::read_to_string(&f)?)?);
    }
    let applied = manifests::apply_docs(&env.client, &discovery, &docs, &env.ns).await;
    ensure!(
        applied.errors.is_empty(),
        "applying the plan: {:?}",
        applied.errors
    );
    let result = check_running(&env, &planned).await;
    manifests::delete_applied(&env.client, &applied).await?;
    result?;
    env.wait_no_pods("the plan's pods gone").await?;
    controllers.check_alive()?;
    drop(controllers);
    println!("p1: plan, apply, run in {:.0}s", t0.elapsed().as_secs_f64());
    env.apply_deviceclasses().await?;
    env.teardown().await
}

/// Patches GFD's labels onto the nodes. The capacity `nvidia.com/gpu` is not set: the planner
/// takes the count from `nvidia.com/gpu.count`, and a capacity without a device plugin behind it
/// would let the scheduler bind the old pods to a kubelet that then fails them.
async fn label_nodes(env: &Env) -> Result<()> {
    let nodes: Api<Node> = Api::all(env.client.clone());
    for (node, labels) in [
        (WHOLE, h100_labels(3, "all-disabled")),
        (MIG, h100_labels(1, "all-1g.10gb")),
        (SINGLE, a100_single_labels()),
        (TS, l4_time_sliced_labels()),
    ] {
        let patch = Patch::Merge(json!({"metadata": {"labels": labels}}));
        nodes.patch(node, &PatchParams::default(), &patch).await?;
    }
    Ok(())
}

/// Takes `extendedResourceName` off the `gpu.nvidia.com` class, as before the migration: with
/// it, the scheduler serves the old `nvidia.com/gpu` pods through DRA (KEP-5004) and they would
/// run instead of waiting for the plan. `Env::apply_deviceclasses` puts it back.
async fn unmap_nvidia_com_gpu(env: &Env) -> Result<()> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("resource.k8s.io", "v1", "DeviceClass"),
        "deviceclasses",
    );
    let classes: Api<DynamicObject> = Api::all_with(env.client.clone(), &ar);
    let patch = Patch::Merge(json!({"spec": {"extendedResourceName": null}}));
    classes
        .patch("gpu.nvidia.com", &PatchParams::default(), &patch)
        .await
        .context("removing nvidia.com/gpu from DeviceClass gpu.nvidia.com")?;
    Ok(())
}

/// A pod template of the device plugin's era: `limits` of `resource`, on this test's nodes
/// (other scenarios' nodes may run our plugin too) with `selector`'s labels, labelled with its
/// owner.
fn template(owner: &str, resource: &str, selector: Value, restart: &str) -> Value {
    let mut node_selector = json!({"e2e-test": TEST});
    for (k, v) in selector.as_object().into_iter().flatten() {
        node_selector[k] = v.clone();
    }
    json!({
        "metadata": {"labels": {OWNER: owner}},
        "spec": {
            "nodeSelector": node_selector,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "cuda",
                "image": "registry.invalid/cuda-app:1",
                "resources": {"limits": {resource: "1"}},
            }],
        },
    })
}

fn deployment(name: &str, replicas: u32, selector: Value) -> Result<Deployment> {
    let owner = format!("Deployment.{name}");
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {OWNER: owner}},
            "template": template(&owner, "nvidia.com/gpu", selector, "Always"),
        },
    }))?)
}

/// The workloads as made for the device plugin. The whole-GPU ones select H100s by GFD's product
/// label (as users do), so that they cannot land on the time-sliced L4: where several nodes fit,
/// the scheduler's scoring and the planner's first fit by name could choose differently.
async fn create_old_workloads(env: &Env) -> Result<()> {
    let pp = PostParams::default();
    let h100 = json!({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"});
    let shared = json!({"nvidia.com/gpu.sharing-strategy": "time-slicing"});
    let single = json!({"nvidia.com/mig.strategy": "single"});
    let deployments = Api::<Deployment>::namespaced(env.client.clone(), &env.ns);
    deployments
        .create(&pp, &deployment("gpu-web", 2, h100.clone())?)
        .await?;
    deployments
        .create(&pp, &deployment("ts-infer", 3, shared)?)
        .await?;
    deployments
        .create(&pp, &deployment("single-infer", 2, single)?)
        .await?;
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "gpu-train"},
        "spec": {
            "backoffLimit": 0,
            "template": template("Job.gpu-train", "nvidia.com/gpu", h100, "Never"),
        },
    }))?;
    Api::<Job>::namespaced(env.client.clone(), &env.ns)
        .create(&pp, &job)
        .await?;
    let mut pod = template(
        "Pod.mig-probe",
        "nvidia.com/mig-1g.10gb",
        json!({}),
        "Never",
    );
    pod["metadata"]["name"] = json!("mig-probe");
    env.create_pod(&serde_json::from_value(pod)?).await?;
    Ok(())
}

/// Waits until `n` pods exist, all Pending and found unschedulable by the scheduler: the state
/// the planner meets on a cluster whose device plugin is gone.
async fn wait_pending_pods(env: &Env, n: usize) -> Result<()> {
    wait_until(&format!("{n} unschedulable pods"), WAIT, || async {
        let pods = env.pods().list(&ListParams::default()).await?.items;
        let mut unschedulable = 0;
        for p in &pods {
            let status = p.status.as_ref();
            let phase = status.and_then(|s| s.phase.as_deref());
            ensure!(
                phase.is_none_or(|ph| ph == "Pending")
                    && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none(),
                "pod {} is {phase:?} on a node before the migration",
                p.name_any()
            );
            let refused = status
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"));
            unschedulable += usize::from(refused);
        }
        Ok((pods.len() == n && unschedulable == n).then_some(()))
    })
    .await
}

/// Runs `dra-controller plan --kubeconfig` on the four nodes, writing to `out`; returns the JSON
/// report. Its exit status is 0 only when every pod fits.
fn run_plan(env: &Env, out: &Path) -> Result<Value> {
    let bin = controller_bin(&env.repo)?;
    let _ = std::fs::remove_dir_all(out);
    let output = std::process::Command::new(&bin)
        .arg("plan")
        .arg(format!("--kubeconfig={}", env.kubeconfig.display()))
        .args([
            "--pool-nodes",
            &format!("{WHOLE},{MIG},{SINGLE},{TS}"),
            "-o",
            "json",
        ])
        .arg("--out")
        .arg(out)
        .output()
        .with_context(|| format!("running {} plan", bin.display()))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.success(),
        "plan failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    println!("p1: plan said on stderr: {}", stderr.trim());
    let report: Value = serde_json::from_str(&stdout).context("plan's JSON report")?;
    for w in report["workloads"].as_array().context("workloads")? {
        ensure!(
            w["pods"].as_u64().is_some() && w["pods"] == w["placed"],
            "not every pod of {} placed: {w}",
            w["workload"]
        );
    }
    Ok(report)
}

/// The plan's placements: owner label value (`Deployment.gpu-web`) → per pod `(node, devices)`.
type Placements = BTreeMap<String, Vec<(String, Vec<String>)>>;

fn planned_devices(report: &Value) -> Result<Placements> {
    let mut out = Placements::new();
    for p in report["pods"].as_array().context("pods")? {
        let node = p["node"]
            .as_str()
            .with_context(|| format!("pod {} not placed: {p}", p["pod"]))?;
        let devices = p["claims"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["allocation"]["devices"]["results"].as_array().cloned())
            .flatten()
            .filter_map(|r| r["device"].as_str().map(String::from))
            .collect();
        let owner = p["owner"].as_str().context("owner")?.replace('/', ".");
        out.entry(owner)
            .or_default()
            .push((node.to_string(), devices));
    }
    Ok(out)
}

/// A device's kind on its node: `gpu`, or `mig 1g.10gb` (the `type` and `profile` attributes
/// the plugin publishes).
async fn kinds(env: &Env, node: &str, devices: &[String]) -> Result<Vec<String>> {
    let real = env.devices(node).await?;
    let mut out = Vec::new();
    for d in devices {
        let info = real
            .get(d)
            .with_context(|| format!("{d} is not a device of {node}"))?;
        let kind = info.string("type").unwrap_or("?");
        out.push(match info.string("profile") {
            Some(p) if kind != "gpu" => format!("{kind} {p}"),
            _ => kind.to_string(),
        });
    }
    out.sort();
    Ok(out)
}

/// Waits until the plan's pods run, then checks per owner that they run on the planned nodes
/// with devices of the planned kinds, as the ResourceClaims' allocations say (the real scheduler
/// may pick another GPU index than the planner's first fit, not another node or kind: each
/// workload fits one node only). The time-sliced workload's claims must carry the plan's
/// TimeSlicing config, which the plugin applies on prepare.
async fn check_running(env: &Env, planned: &Placements) -> Result<()> {
    let pods = wait_until(&format!("the plan's {PODS} pods Running"), WAIT, || async {
        let pods = env.pods().list(&ListParams::default()).await?.items;
        let running = pods
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        Ok((pods.len() == PODS && running == PODS).then_some(pods))
    })
    .await;
    let pods = match pods {
        Ok(p) => p,
        Err(e) => {
            for p in env.pods().list(&ListParams::default()).await?.items {
                env.explain_pod(&p.name_any()).await;
            }
            return Err(e);
        }
    };
    let mut got = Placements::new();
    for p in &pods {
        let owner = p.labels().get(OWNER).cloned().unwrap_or_default();
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .context("running without a node")?;
        let claim = env.pod_claim(&p.name_any(), "gpu").await?;
        let results = allocation_results(&claim);
        ensure!(
            results.iter().all(|r| r.pool == node),
            "{}: claim allocated from {results:?}, pod on {node}",
            p.name_any()
        );
        if owner == "Deployment.ts-infer" {
            let alloc = serde_json::to_string(&claim.status.as_ref().map(|s| &s.allocation))?;
            ensure!(
                alloc.contains("TimeSlicing"),
                "{}: no TimeSlicing config in the allocation {alloc}",
                p.name_any()
            );
        }
        let devices = results.into_iter().map(|r| r.device).collect();
        got.entry(owner).or_default().push((node, devices));
    }
    let shape = |pl: Placements| async move {
        let mut out = BTreeMap::new();
        for (owner, pods) in pl {
            let mut v = Vec::new();
            for (node, devices) in pods {
                v.push((node.clone(), kinds(env, &node, &devices).await?));
            }
            v.sort();
            out.insert(owner, v);
        }
        anyhow::Ok(out)
    };
    let (want, have) = (shape(planned.clone()).await?, shape(got).await?);
    println!("p1: running as planned: {have:?}");
    if want != have {
        bail!("planned {want:?}, running {have:?}");
    }
    env.check_violations()
}

/// Deletes the device plugin's workloads (their pods with them, through the garbage collector),
/// as the plan's notes say for Pods and Jobs, and waits until their pods are gone.
async fn delete_old_workloads(env: &Env) -> Result<()> {
    let dp = DeleteParams::background();
    let deployments = Api::<Deployment>::namespaced(env.client.clone(), &env.ns);
    for d in ["gpu-web", "ts-infer", "single-infer"] {
        deployments.delete(d, &dp).await?;
    }
    Api::<Job>::namespaced(env.client.clone(), &env.ns)
        .delete("gpu-train", &dp)
        .await?;
    env.delete_pod("mig-probe").await?;
    env.wait_no_pods("the old workloads' pods gone").await
}
