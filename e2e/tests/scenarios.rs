//! End-to-end scenarios against the real control plane started by `e2e/run.sh`.
//!
//! Each scenario skips (and says so) when `E2E_KUBECONFIG` is not set. Run one with
//! `bash e2e/run.sh s3` (a substring of the test name).
//!
//! One file over 600 lines on purpose: each file under e2e/tests is its own test binary linked
//! with kube and k8s-openapi, so scenarios of one kind share a file rather than a binary each.
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use e2e::env::{
    DeviceInfo, Env, PodClaim, WAIT, dry_run_create, wait_until, yaml_docs, yaml_files,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use kube::discovery::Discovery;
use kubelet_proto::dra_v1;

mod double;

use e2e::env_or_skip;

const CDI_KIND: &str = "k8s.gpu.nvidia.com/claim";

fn cdi_file(env: &Env, node: &str, claim_uid: &str) -> PathBuf {
    env.node(node)
        .dirs
        .cdi
        .join(format!("k8s.gpu.nvidia.com-claim_{claim_uid}.json"))
}

use e2e::env::allocation_results as results;

/// `dra-plugin slices ... -o json` as a list of objects.
fn offline_slices(env: &Env, args: &[&str]) -> Result<Vec<serde_json::Value>> {
    let out = std::process::Command::new(&env.plugin_bin)
        .arg("slices")
        .args(args)
        .args(["-o", "json"])
        .output()
        .with_context(|| format!("running {} slices", env.plugin_bin.display()))?;
    if !out.status.success() {
        bail!(
            "dra-plugin slices {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("parsing slices JSON")?;
    Ok(match v {
        serde_json::Value::Array(a) => a,
        serde_json::Value::Object(ref o) if o.contains_key("items") => {
            o["items"].as_array().cloned().unwrap_or_default()
        }
        other => vec![other],
    })
}

/// Waits until the pod is reported unschedulable by the scheduler and returns its message.
async fn wait_unschedulable(env: &Env, pod: &str) -> Result<String> {
    wait_until(&format!("pod {pod} Unschedulable"), WAIT, || async {
        let p = env.pods().get(pod).await?;
        let cond = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled").cloned());
        Ok(cond
            .filter(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
            .map(|c| c.message.unwrap_or_default()))
    })
    .await
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank - 1]
}

/// The control plane alone, no plugin: a hand-made ResourceSlice, the project's DeviceClasses and a
/// claim template; the scheduler allocates, reserves and binds, the controller cleans up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0_control_plane_allocates_from_handmade_slice() -> Result<()> {
    let env = env_or_skip!("s0_control_plane_allocates_from_handmade_slice");
    let node = "s0-handmade";
    e2e::env::create_node(&env.client, node, &env.test).await?;
    let slice: ResourceSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "s0-handmade-gpu"},
        "spec": {
            "driver": e2e::DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": (0..2).map(|i| serde_json::json!({
                "name": format!("gpu-{i}"),
                "attributes": {"type": {"string": "gpu"}, "productName": {"string": "Hand Made"}},
                "capacity": {"memory": {"value": "80Gi"}},
            })).collect::<Vec<_>>(),
        }
    }))?;
    let slices: Api<ResourceSlice> = Api::all(env.client.clone());
    slices.create(&Default::default(), &slice).await?;
    env.create_from_file("examples/claims/single-gpu.yaml")
        .await?;
    let claim = [PodClaim {
        name: "gpu",
        template: "single-gpu",
    }];
    for pod in ["hm-1", "hm-2"] {
        env.create_pod(&env.pod_manifest(pod, Some(node), &claim, None)?)
            .await?;
    }
    let mut devices = BTreeSet::new();
    for pod in ["hm-1", "hm-2"] {
        let c = wait_until(
            &format!("{pod} bound with a reserved claim"),
            WAIT,
            || async {
                let p = env.pods().get(pod).await?;
                if p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node) {
                    return Ok(None);
                }
                let c = env.pod_claim(pod, "gpu").await?;
                let reserved = c
                    .status
                    .as_ref()
                    .and_then(|s| s.reserved_for.as_ref())
                    .is_some_and(|r| r.iter().any(|r| Some(&r.uid) == p.metadata.uid.as_ref()));
                Ok(reserved.then_some(c))
            },
        )
        .await?;
        devices.insert(results(&c)[0].device.clone());
    }
    ensure!(devices.len() == 2, "two pods share a device: {devices:?}");
    // Created only now: the scheduler does not take pods in creation order.
    env.create_pod(&env.pod_manifest("hm-3", Some(node), &claim, None)?)
        .await?;
    let msg = wait_unschedulable(&env, "hm-3").await?;
    println!("s0: third pod unschedulable: {msg}");
    // No kubelet here: a force delete lets the controller release the claim.
    let c1 = env.pod_claim("hm-1", "gpu").await?;
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    env.pods().delete("hm-1", &force).await?;
    wait_until("hm-1's claim deleted", WAIT, || async {
        Ok(env
            .claims()
            .get_opt(&c1.name_any())
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    wait_until("hm-3 bound", WAIT, || async {
        let p = env.pods().get("hm-3").await?;
        Ok(p.spec
            .and_then(|s| s.node_name)
            .filter(|n| n == node)
            .map(|_| ()))
    })
    .await?;
    for pod in ["hm-2", "hm-3"] {
        env.pods().delete(pod, &force).await?;
    }
    wait_until("all claims deleted", WAIT, || async {
        Ok(env
            .claims()
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    slices
        .delete("s0-handmade-gpu", &Default::default())
        .await?;
    env.teardown().await
}

/// The kubelet role itself, against a minimal in-process driver (tests/double): registration,
/// prepare after reservation, CDI checks, Running, unprepare on delete, then the pod and claim go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0_harness_selftest_with_test_double() -> Result<()> {
    let env = env_or_skip!("s0_harness_selftest_with_test_double");
    let node = "s0-double";
    e2e::env::create_node(&env.client, node, &env.test).await?;
    let slice: ResourceSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "s0-double-gpu"},
        "spec": {
            "driver": e2e::DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": (0..2).map(|i| serde_json::json!({
                "name": format!("gpu-{i}"),
                "attributes": {"type": {"string": "gpu"}},
            })).collect::<Vec<_>>(),
        }
    }))?;
    let slices: Api<ResourceSlice> = Api::all(env.client.clone());
    slices.create(&Default::default(), &slice).await?;
    let dirs = e2e::plugin::NodeDirs::create(&env.work, node)?;
    let dbl = double::start(env.client.clone(), &dirs.registrar, &dirs.plugin, &dirs.cdi)?;
    let kubelet =
        e2e::kubelet::Kubelet::start(env.client.clone(), node, &dirs.registrar, &dirs.cdi, WAIT)
            .await?;
    env.create_from_file("examples/claims/single-gpu.yaml")
        .await?;
    let claim = [PodClaim {
        name: "gpu",
        template: "single-gpu",
    }];
    for pod in ["d-1", "d-2"] {
        env.create_pod(&env.pod_manifest(pod, Some(node), &claim, None)?)
            .await?;
    }
    env.wait_running("d-1").await?;
    env.wait_running("d-2").await?;
    // Created only now: the scheduler does not take pods in creation order.
    env.create_pod(&env.pod_manifest("d-3", Some(node), &claim, None)?)
        .await?;
    wait_unschedulable(&env, "d-3").await?;
    let c1 = env.pod_claim("d-1", "gpu").await?;
    let uid1 = c1.uid().unwrap_or_default();
    ensure!(
        kubelet.prepared().contains_key(&uid1),
        "d-1's claim not prepared"
    );
    let spec1 = dirs
        .cdi
        .join(format!("k8s.gpu.nvidia.com-claim_{uid1}.json"));
    ensure!(spec1.exists(), "no CDI spec for d-1");
    env.delete_pod("d-1").await?;
    env.wait_pod_gone("d-1").await?;
    ensure!(!spec1.exists(), "CDI spec of d-1 still there");
    env.wait_running("d-3").await?;
    for pod in ["d-2", "d-3"] {
        env.delete_pod(pod).await?;
        env.wait_pod_gone(pod).await?;
    }
    wait_until("all claims deleted", WAIT, || async {
        Ok(env
            .claims()
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    ensure!(kubelet.prepared().is_empty(), "claims still prepared");
    ensure!(
        e2e::cdi::spec_files(&dirs.cdi)?.is_empty(),
        "CDI specs left"
    );
    let prepares = dbl.prepares.lock().unwrap().clone();
    ensure!(
        prepares.len() == 3,
        "driver saw {} prepares: {prepares:?}",
        prepares.len()
    );
    let v = kubelet.violations();
    ensure!(v.is_empty(), "violations: {v:?}");
    drop(kubelet);
    drop(dbl);
    slices.delete("s0-double-gpu", &Default::default()).await?;
    env.teardown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_api_accepts_slices_and_objects() -> Result<()> {
    let mut env = env_or_skip!("s1_api_accepts_slices_and_objects");
    let discovery = Discovery::new(env.client.clone()).run().await?;
    let mut failures = Vec::new();
    let mut accepted = 0;

    // Every slice the plugin publishes, for every simulated profile and MIG mode.
    let names: Vec<String> = gpu_dra_api::profiles::known_names()
        .split(", ")
        .map(String::from)
        .collect();
    let mut sample_slice = None;
    for alias in &names {
        let model = gpu_dra_api::profiles::lookup(alias).map_err(|e| anyhow!("{e}"))?;
        let profile = format!("{alias}:8");
        let mut variants: Vec<Vec<&str>> = vec![vec![]];
        let smallest = model.profiles.first().map(|p| format!("all-{}", p.name));
        if model.mig_capable {
            if let Some(l) = &smallest {
                variants.push(vec!["--mig-layout", l]);
            }
            // "balanced" mixes 3g/2g/1g slices; only models with a plain 3g profile have it.
            if model
                .profiles
                .iter()
                .any(|p| p.name.starts_with("3g.") && !p.name.contains('+'))
            {
                variants.push(vec!["--mig-layout", "all-balanced"]);
            }
            variants.push(vec!["--feature-gates", "DynamicMIG=true"]);
        }
        if alias == "h100-80gb" {
            variants.push(vec!["--mig-layout", "all-3g.40gb"]);
            variants.push(vec!["--mig-layout", "all-1g.10gb"]);
            variants.push(vec!["--mig-layout", "3g.40gb,3g.40gb"]);
        }
        for v in variants {
            let mut args = vec![
                "--backend",
                "simulated",
                "--profile",
                &profile,
                "--node-name",
                "s1-offline",
            ];
            args.extend(v.iter().copied());
            let slices = match offline_slices(&env, &args) {
                Ok(s) => s,
                Err(e) => {
                    failures.push(format!("{alias} {v:?}: {e:#}"));
                    continue;
                }
            };
            if slices.is_empty() {
                failures.push(format!("{alias} {v:?}: no slices"));
            }
            for s in &slices {
                match dry_run_create(&env.client, &discovery, s, &env.ns).await {
                    Ok(()) => accepted += 1,
                    Err(e) => failures.push(format!(
                        "{alias} {v:?} slice {}: {e:#}",
                        s["metadata"]["name"]
                    )),
                }
                sample_slice.get_or_insert_with(|| s.clone());
            }
        }
    }

    // Every DeviceClass and example claim, as written.
    let mut files = yaml_files(&env.repo.join("deviceclasses"))?;
    files.extend(yaml_files(&env.repo.join("examples/claims"))?);
    let mut sample_template = None;
    for f in &files {
        for doc in yaml_docs(&std::fs::read_to_string(f)?)? {
            match dry_run_create(&env.client, &discovery, &doc, &env.ns).await {
                Ok(()) => accepted += 1,
                Err(e) => failures.push(format!("{}: {e:#}", f.display())),
            }
            if doc["kind"] == "ResourceClaimTemplate" {
                sample_template.get_or_insert_with(|| doc.clone());
            }
        }
    }

    // The server really validates: broken variants of accepted objects are refused.
    let mut bad_slice = sample_slice.context("no slice produced at all")?;
    bad_slice["spec"]["devices"][0]["name"] = serde_json::json!("GPU_0!");
    ensure!(
        dry_run_create(&env.client, &discovery, &bad_slice, &env.ns)
            .await
            .is_err(),
        "the API server accepted a slice with an invalid device name"
    );
    let mut bad_template =
        sample_template.context("no ResourceClaimTemplate in examples/claims")?;
    bad_template["spec"]["spec"]["devices"]["requests"][0]["exactly"] = serde_json::json!({
        "deviceClassName": "gpu.nvidia.com",
        "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName +"}}]
    });
    bad_template["spec"]["spec"]["devices"]["requests"][0]
        .as_object_mut()
        .context("request")?
        .remove("firstAvailable");
    ensure!(
        dry_run_create(&env.client, &discovery, &bad_template, &env.ns)
            .await
            .is_err(),
        "the API server accepted a claim template with a malformed CEL selector"
    );

    // A running plugin publishes exactly what the offline rendering shows, and it was accepted.
    let args = ["--profile", "h100-80gb:8", "--mig-layout", "all-balanced"];
    env.add_node("s1-live", &args).await?;
    let live: BTreeSet<String> = env.devices("s1-live").await?.into_keys().collect();
    let mut offline_args = vec!["--backend", "simulated", "--node-name", "s1-live"];
    offline_args.extend(args);
    let offline: BTreeSet<String> = offline_slices(&env, &offline_args)?
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .filter_map(|d| d["name"].as_str().map(String::from))
        .collect();
    ensure!(
        live == offline,
        "published devices {live:?} differ from `dra-plugin slices` {offline:?}"
    );

    println!(
        "s1: {accepted} objects accepted by the API server ({} profiles)",
        names.len()
    );
    if !failures.is_empty() {
        bail!("rejected by the API server:\n  {}", failures.join("\n  "));
    }
    env.teardown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_whole_gpus_fill_a_node() -> Result<()> {
    let mut env = env_or_skip!("s2_whole_gpus_fill_a_node");
    let node = "s2-h100";
    env.add_node(node, &["--profile", "h100-80gb:8"]).await?;
    env.create_from_file("examples/claims/single-gpu.yaml")
        .await?;
    let claim = [PodClaim {
        name: "gpu",
        template: "single-gpu",
    }];
    for i in 1..=8 {
        env.create_pod(&env.pod_manifest(&format!("gpu-{i}"), Some(node), &claim, None)?)
            .await?;
    }
    let mut devices = BTreeMap::new();
    for i in 1..=8 {
        let pod = format!("gpu-{i}");
        env.wait_running(&pod).await?;
        let c = env.pod_claim(&pod, "gpu").await?;
        let r = results(&c);
        ensure!(r.len() == 1, "pod {pod}: {} devices allocated", r.len());
        devices.insert(pod, (c, r[0].device.clone()));
    }
    let distinct: BTreeSet<&String> = devices.values().map(|(_, d)| d).collect();
    ensure!(distinct.len() == 8, "8 pods share devices: {distinct:?}");
    ensure!(
        distinct
            .iter()
            .all(|d| d.starts_with("gpu-") && !d.contains("mig")),
        "not whole GPUs: {distinct:?}"
    );

    env.create_pod(&env.pod_manifest("gpu-9", Some(node), &claim, None)?)
        .await?;
    let msg = wait_unschedulable(&env, "gpu-9").await?;
    println!("s2: 9th pod unschedulable: {msg}");
    ensure!(
        msg.to_lowercase().contains("claim"),
        "scheduler reason does not mention claims: {msg}"
    );
    let p9 = env.pods().get("gpu-9").await?;
    ensure!(
        p9.spec.as_ref().and_then(|s| s.node_name.clone()).is_none(),
        "gpu-9 got bound"
    );

    let (c1, dev1) = devices["gpu-1"].clone();
    let uid1 = c1.uid().unwrap_or_default();
    let file1 = cdi_file(&env, node, &uid1);
    ensure!(file1.exists(), "no CDI spec {}", file1.display());
    env.delete_pod("gpu-1").await?;
    env.wait_pod_gone("gpu-1").await?;
    ensure!(
        !file1.exists(),
        "CDI spec {} still there after unprepare",
        file1.display()
    );
    ensure!(
        !env.node(node).kubelet.prepared()?.contains_key(&uid1),
        "gpu-1 went without unprepare"
    );
    wait_until("claim of gpu-1 deleted", WAIT, || async {
        Ok(env
            .claims()
            .get_opt(&c1.name_any())
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;

    env.wait_running("gpu-9").await?;
    let c9 = env.pod_claim("gpu-9", "gpu").await?;
    ensure!(
        results(&c9)[0].device == dev1,
        "gpu-9 did not get the freed {dev1}"
    );
    for (uid, n) in env.node(node).kubelet.prepare_calls()? {
        ensure!(
            n == 1,
            "claim {uid} was sent to NodePrepareResources {n} times"
        );
    }
    env.check_violations()?;
    env.teardown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_inference_claim_mig_or_whole_gpu() -> Result<()> {
    let mut env = env_or_skip!("s3_inference_claim_mig_or_whole_gpu");
    env.add_node(
        "s3-mig",
        &["--profile", "h100-80gb:1", "--mig-layout", "all-3g.40gb"],
    )
    .await?;
    env.add_node("s3-whole", &["--profile", "h100-80gb:1"])
        .await?;
    env.create_from_file("examples/claims/inference-gpu.yaml")
        .await?;
    let claim = [PodClaim {
        name: "gpu",
        template: "inference-gpu",
    }];
    let cases = [
        ("on-mig", "s3-mig", "gpu/mig-slice", "gpu-0-mig-3g40gb-"),
        ("on-whole", "s3-whole", "gpu/whole-gpu", "gpu-0"),
    ];
    for (pod, node, _, _) in cases {
        env.create_pod(&env.pod_manifest(pod, Some(node), &claim, None)?)
            .await?;
    }
    for (pod, node, request, device_prefix) in cases {
        env.wait_running(pod).await?;
        let c = env.pod_claim(pod, "gpu").await?;
        let uid = c.uid().unwrap_or_default();
        let r = results(&c);
        ensure!(r.len() == 1, "{pod}: {} results", r.len());
        ensure!(
            r[0].request == request,
            "{pod}: allocated for {} instead of {request}",
            r[0].request
        );
        ensure!(
            r[0].device.starts_with(device_prefix)
                && (device_prefix != "gpu-0" || r[0].device == "gpu-0"),
            "{pod}: got device {}",
            r[0].device
        );
        let devices = env.devices(node).await?;
        let uuid = devices
            .get(&r[0].device)
            .and_then(|d| d.string("uuid"))
            .with_context(|| format!("{pod}: no uuid attribute on {}", r[0].device))?
            .to_string();
        let file = cdi_file(&env, node, &uid);
        ensure!(file.exists(), "{pod}: no CDI spec {}", file.display());
        let specs = e2e::cdi::load(&env.node(node).dirs.cdi)?;
        let id = format!("{CDI_KIND}={uid}-{}", r[0].device);
        let dev = specs
            .get(&id)
            .with_context(|| format!("{pod}: CDI device {id} not defined"))?;
        ensure!(
            dev.file == file,
            "{pod}: {id} defined in {} instead",
            dev.file.display()
        );
        let visible = dev
            .env_value("NVIDIA_VISIBLE_DEVICES")
            .context("no NVIDIA_VISIBLE_DEVICES")?;
        ensure!(
            visible == uuid,
            "{pod}: NVIDIA_VISIBLE_DEVICES={visible}, allocated device has uuid {uuid}"
        );
        let prepared = env.node(node).kubelet.prepared()?;
        let (_, pdevs) = prepared
            .get(&uid)
            .context("claim not prepared by the kubelet role")?;
        ensure!(
            pdevs.iter().any(|d| d.cdi_ids.contains(&id)),
            "{pod}: prepare returned {pdevs:?}, not {id}"
        );
        println!(
            "s3: {pod} on {node}: {} -> {} ({uuid})",
            r[0].request, r[0].device
        );
    }
    env.check_violations()?;
    env.teardown().await
}

fn cc_at_least(d: &DeviceInfo, major: u64, minor: u64) -> bool {
    let v = d.version("cudaComputeCapability").unwrap_or("0.0.0");
    let mut it = v.split('.').map(|p| p.parse::<u64>().unwrap_or(0));
    let (a, b) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_selection_by_attributes_and_pcie_root() -> Result<()> {
    let mut env = env_or_skip!("s4_selection_by_attributes_and_pcie_root");
    let node = "s4-mixed";
    env.add_node(node, &["--profile", "h100-80gb:4", "--profile", "l4:4"])
        .await?;
    let devices = env.devices(node).await?;
    for f in [
        "examples/claims/h100-sm90.yaml",
        "examples/claims/pre-hopper-small-gpu.yaml",
        "examples/claims/two-gpus-same-pcie-root.yaml",
    ] {
        env.create_from_file(f).await?;
    }
    env.create_from_yaml(
        r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: impossible-memory}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
          selectors:
          - cel: {expression: "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('4Ti')) >= 0"}
"#,
    )
    .await?;
    let gib = 1u128 << 30;

    // Hopper by productName, architecture, compute capability (semver) and memory quantity.
    let one = |t| {
        [PodClaim {
            name: "gpu",
            template: t,
        }]
    };
    env.create_pod(&env.pod_manifest("sel-h100", Some(node), &one("h100-sm90"), None)?)
        .await?;
    env.wait_running("sel-h100").await?;
    let d = results(&env.pod_claim("sel-h100", "gpu").await?)[0]
        .device
        .clone();
    let info = &devices[&d];
    ensure!(
        info.string("productName")
            .is_some_and(|p| p.starts_with("NVIDIA H100"))
            && info.string("architecture") == Some("Hopper")
            && cc_at_least(info, 9, 0)
            && info.capacity.get("memory").is_some_and(|m| *m > 70 * gib),
        "sel-h100 got {d}: {info:?}"
    );
    println!("s4: h100-sm90 -> {d} ({:?})", info.string("productName"));

    env.create_pod(&env.pod_manifest(
        "sel-small",
        Some(node),
        &one("pre-hopper-small-gpu"),
        None,
    )?)
    .await?;
    env.wait_running("sel-small").await?;
    let d = results(&env.pod_claim("sel-small", "gpu").await?)[0]
        .device
        .clone();
    let info = &devices[&d];
    ensure!(
        !cc_at_least(info, 9, 0) && info.capacity.get("memory").is_some_and(|m| *m < 40 * gib),
        "sel-small got {d}: {info:?}"
    );
    println!(
        "s4: pre-hopper-small-gpu -> {d} ({:?})",
        info.string("productName")
    );

    // Two GPUs behind one PCIe root. sel-h100 took the first GPU, so the next two in order do not
    // share a root: a scheduler ignoring the constraint would pick them.
    let pair = [PodClaim {
        name: "gpus",
        template: "two-gpus-same-pcie-root",
    }];
    env.create_pod(&env.pod_manifest("sel-pair", Some(node), &pair, None)?)
        .await?;
    env.wait_running("sel-pair").await?;
    let r = results(&env.pod_claim("sel-pair", "gpus").await?);
    ensure!(r.len() == 2, "sel-pair got {} devices", r.len());
    let roots: Vec<Option<&str>> = r
        .iter()
        .map(|x| devices[&x.device].string("resource.kubernetes.io/pcieRoot"))
        .collect();
    ensure!(
        roots[0].is_some() && roots[0] == roots[1],
        "sel-pair: pcieRoots {roots:?}"
    );
    let all_roots: BTreeSet<&str> = devices
        .values()
        .filter_map(|d| d.string("resource.kubernetes.io/pcieRoot"))
        .collect();
    println!(
        "s4: pair -> {}, {} on {:?} (node has roots {all_roots:?})",
        r[0].device, r[1].device, roots[0]
    );

    // A selector nothing matches keeps the pod pending.
    env.create_pod(&env.pod_manifest("sel-none", Some(node), &one("impossible-memory"), None)?)
        .await?;
    let msg = wait_unschedulable(&env, "sel-none").await?;
    println!("s4: impossible selector: {msg}");
    env.check_violations()?;
    env.teardown().await
}

fn apiserver_pid(env: &Env) -> Result<i32> {
    let s = std::fs::read_to_string(env.work.join("kube-apiserver.pid"))
        .context("reading kube-apiserver.pid")?;
    Ok(s.trim().parse()?)
}

async fn slice_devices(env: &Env, node: &str) -> Result<(BTreeSet<String>, BTreeSet<String>)> {
    let slices: Vec<ResourceSlice> = env.wait_slices(node).await?;
    let uids = slices.iter().filter_map(|s| s.uid()).collect();
    let devices = slices
        .iter()
        .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
        .map(|d| d.name)
        .collect();
    Ok((uids, devices))
}

/// Deletes the node's slices (as a restarting kubelet does) and waits until the plugin published the
/// same devices again in new objects.
async fn delete_slices_and_wait(env: &Env, node: &str) -> Result<()> {
    let (old_uids, old_devices) = slice_devices(env, node).await?;
    let api: Api<ResourceSlice> = Api::all(env.client.clone());
    for s in env.slices(node).await? {
        let _ = api.delete(&s.name_any(), &DeleteParams::default()).await;
    }
    wait_until(&format!("{node}'s slices republished"), WAIT, || async {
        let (uids, devices) = slice_devices(env, node).await?;
        Ok((uids.is_disjoint(&old_uids) && devices == old_devices).then_some(()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_robustness_plugin_kill_slices_apiserver() -> Result<()> {
    let mut env = env_or_skip!("s5_robustness_plugin_kill_slices_apiserver");
    let t0 = Instant::now();
    let node = "s5-h100";
    env.add_node(node, &["--profile", "h100-80gb:8"]).await?;
    env.create_from_file("examples/claims/single-gpu.yaml")
        .await?;
    let claim = [PodClaim {
        name: "gpu",
        template: "single-gpu",
    }];

    env.create_pod(&env.pod_manifest("r-a", Some(node), &claim, None)?)
        .await?;
    env.wait_running("r-a").await?;
    let ca = env.pod_claim("r-a", "gpu").await?;
    let uid_a = ca.uid().unwrap_or_default();
    let file_a = cdi_file(&env, node, &uid_a);
    let spec_a = std::fs::read(&file_a).with_context(|| format!("reading {}", file_a.display()))?;
    let prepared_a = env.node(node).kubelet.prepared()?[&uid_a].1.clone();

    // kill -9 between two prepares, then restart; the kubelet's plugin watcher finds the new
    // registration socket.
    let registrations = env.registrations(node);
    {
        let n = env.node_mut(node);
        n.plugin.kill9().await?;
        n.plugin.restart()?;
    }
    env.wait_registered(node, registrations).await?;
    env.create_pod(&env.pod_manifest("r-b", Some(node), &claim, None)?)
        .await?;
    env.wait_running("r-b").await?;
    let uid_b = env.pod_claim("r-b", "gpu").await?.uid().unwrap_or_default();
    let calls = env.node(node).kubelet.prepare_calls()?;
    ensure!(
        calls.get(&uid_a) == Some(&1) && calls.get(&uid_b) == Some(&1),
        "prepare calls {calls:?}"
    );
    ensure!(
        std::fs::read(&file_a)? == spec_a,
        "CDI spec of the prepared claim changed across the restart"
    );
    ensure!(
        results(&env.pod_claim("r-b", "gpu").await?)[0].device != results(&ca)[0].device,
        "r-b got r-a's device"
    );

    // A second prepare of a prepared claim (as a kubelet that lost its own checkpoint sends):
    // same answer, nothing redone.
    let mut dra = env.node(node).kubelet.dra_client()?;
    let resp = dra
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
            claims: vec![dra_v1::Claim {
                namespace: env.ns.clone(),
                uid: uid_a.clone(),
                name: ca.name_any(),
            }],
        })
        .await?
        .into_inner();
    let again = resp
        .claims
        .get(&uid_a)
        .context("re-prepare skipped the claim")?;
    ensure!(again.error.is_empty(), "re-prepare: {}", again.error);
    let again_ids: BTreeSet<&String> = again
        .devices
        .iter()
        .flat_map(|d| &d.cdi_device_ids)
        .collect();
    let first_ids: BTreeSet<&String> = prepared_a.iter().flat_map(|d| &d.cdi_ids).collect();
    ensure!(
        again_ids == first_ids,
        "re-prepare returned {again_ids:?}, first prepare {first_ids:?}"
    );
    ensure!(
        std::fs::read(&file_a)? == spec_a,
        "re-prepare rewrote the CDI spec"
    );

    // Slices deleted behind the plugin's back come back.
    delete_slices_and_wait(&env, node).await?;
    println!(
        "s5: slices republished after deletion (+{:.1}s)",
        t0.elapsed().as_secs_f64()
    );

    // The API server goes away for a while and comes back.
    let plugin_log = env.node(node).dirs.root.join("plugin.log");
    let log_lines = || {
        std::fs::read_to_string(&plugin_log)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    let lines_before = log_lines();
    let hold = env.work.join("kube-apiserver.hold");
    std::fs::write(&hold, b"")?;
    let pid = apiserver_pid(&env)?;
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()?;
    ensure!(
        killed.success(),
        "could not kill the API server (pid {pid})"
    );
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
    wait_until("API server down", WAIT, || async {
        Ok(nodes
            .list(&ListParams::default())
            .await
            .is_err()
            .then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(15)).await;
    std::fs::remove_file(&hold)?;
    wait_until("API server back", WAIT, || async {
        Ok(nodes.list(&ListParams::default()).await.ok().map(|_| ()))
    })
    .await?;
    println!(
        "s5: the plugin wrote {} log lines while the API server was down",
        log_lines().saturating_sub(lines_before)
    );
    println!(
        "s5: API server restarted (+{:.1}s)",
        t0.elapsed().as_secs_f64()
    );
    env.node_mut(node).plugin.check_alive()?;
    delete_slices_and_wait(&env, node).await?;
    println!(
        "s5: plugin republishes after the API server outage (+{:.1}s)",
        t0.elapsed().as_secs_f64()
    );
    env.create_pod(&env.pod_manifest("r-c", Some(node), &claim, None)?)
        .await?;
    env.wait_running("r-c").await?;
    println!(
        "s5: new pod prepared after the outage (+{:.1}s)",
        t0.elapsed().as_secs_f64()
    );

    env.delete_pod("r-a").await?;
    env.wait_pod_gone("r-a").await?;
    ensure!(!file_a.exists(), "CDI spec of r-a's claim still there");
    for (uid, n) in env.node(node).kubelet.prepare_calls()? {
        // r-a's claim: the kubelet's prepare and this test's own second one.
        let expected = if uid == uid_a { 2 } else { 1 };
        ensure!(
            n == expected,
            "claim {uid} was sent to NodePrepareResources {n} times"
        );
    }
    env.check_violations()?;
    env.teardown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s6_extended_resource_served_by_dra() -> Result<()> {
    let mut env = env_or_skip!("s6_extended_resource_served_by_dra");
    let node = "s6-h100";
    env.add_node(node, &["--profile", "h100-80gb:2"]).await?;
    let res =
        serde_json::json!({"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}});
    env.create_pod(&env.pod_manifest("legacy", Some(node), &[], Some(res))?)
        .await?;
    env.wait_running("legacy").await?;
    let pod: Pod = env.pods().get("legacy").await?;
    let ext = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.clone())
        .context("no status.extendedResourceClaimStatus")?;
    println!("s6: extendedResourceClaimStatus {ext:?}");
    ensure!(
        ext.request_mappings
            .iter()
            .any(|m| m.resource_name == "nvidia.com/gpu" && m.container_name == "main"),
        "request mappings {:?}",
        ext.request_mappings
    );
    let claim = env.claims().get(&ext.resource_claim_name).await?;
    let r = results(&claim);
    ensure!(
        r.len() == 1 && r[0].driver == e2e::DRIVER && r[0].device.starts_with("gpu-"),
        "allocation {r:?}"
    );
    let uid = claim.uid().unwrap_or_default();
    ensure!(
        env.node(node).kubelet.prepared()?.contains_key(&uid),
        "extended-resource claim not prepared"
    );
    let file = cdi_file(&env, node, &uid);
    ensure!(file.exists(), "no CDI spec {}", file.display());

    env.delete_pod("legacy").await?;
    env.wait_pod_gone("legacy").await?;
    ensure!(!file.exists(), "CDI spec still there after the pod went");
    wait_until("extended-resource claim deleted", WAIT, || async {
        Ok(env
            .claims()
            .get_opt(&ext.resource_claim_name)
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    env.check_violations()?;
    env.teardown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_many_pods_churn() -> Result<()> {
    let mut env = env_or_skip!("s7_many_pods_churn");
    let rounds: usize = std::env::var("E2E_S7_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let pods_per_round = 100;
    let whole_per_round = 16;
    for n in ["s7-gpu-1", "s7-gpu-2"] {
        env.add_node(n, &["--profile", "h100-80gb:8"]).await?;
    }
    for n in ["s7-mig-1", "s7-mig-2"] {
        env.add_node(
            n,
            &["--profile", "h100-80gb:8", "--mig-layout", "all-1g.10gb"],
        )
        .await?;
    }
    env.create_from_file("examples/claims/single-gpu.yaml")
        .await?;
    env.create_from_file("examples/claims/mig-1g-10gb.yaml")
        .await?;

    // From the pod's creation to the runtime's CreateContainer, which the kubelet calls once
    // the pod's claims are prepared.
    let mut created_to_container = Vec::new();
    let t0 = Instant::now();
    for round in 1..=rounds {
        let start = Instant::now();
        let mut created = BTreeMap::new();
        for i in 0..pods_per_round {
            let name = format!("r{round}-p{i:03}");
            let claim = if i < whole_per_round {
                [PodClaim {
                    name: "gpu",
                    template: "single-gpu",
                }]
            } else {
                [PodClaim {
                    name: "gpu",
                    template: "mig-1g-10gb",
                }]
            };
            let p = env
                .create_pod(&env.pod_manifest(&name, None, &claim, None)?)
                .await?;
            created.insert(p.uid().unwrap_or_default(), (name, Timestamp::now()));
        }
        let all_running = wait_until(
            &format!("round {round}: {pods_per_round} pods Running"),
            WAIT,
            || async {
                let pods = env.pods().list(&ListParams::default()).await?.items;
                let running = pods
                    .iter()
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .count();
                Ok((running == pods_per_round).then_some(()))
            },
        )
        .await;
        if let Err(e) = all_running {
            for p in env.pods().list(&ListParams::default()).await?.items {
                if p.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running") {
                    env.explain_pod(&p.name_any()).await;
                }
            }
            return Err(e);
        }
        let running_after = start.elapsed();
        let mut per_node = BTreeMap::new();
        for n in &env.nodes {
            let kubelet = n.kubelet.stock().context("s7 runs on stock kubelets")?;
            for c in kubelet.containers()? {
                if let Some((_, created_at)) = created.get(&c.pod_uid)
                    && c.error.is_empty()
                {
                    let at: Timestamp = c.time.parse().context("record time")?;
                    created_to_container.push(Duration::try_from(at.duration_since(*created_at))?);
                    *per_node.entry(n.name.clone()).or_insert(0) += 1;
                }
            }
        }
        ensure!(
            per_node.values().sum::<usize>() == pods_per_round,
            "round {round}: prepared pods per node {per_node:?}"
        );
        for (name, _) in created.values() {
            env.delete_pod(name).await?;
        }
        wait_until(&format!("round {round}: pods gone"), WAIT, || async {
            Ok(env
                .pods()
                .list(&ListParams::default())
                .await?
                .items
                .is_empty()
                .then_some(()))
        })
        .await?;
        let gone_after = start.elapsed();
        // The controller deletes the generated claims of gone pods; the next round starts clean.
        wait_until(
            &format!("round {round}: generated claims deleted"),
            WAIT,
            || async {
                Ok(env
                    .claims()
                    .list(&ListParams::default())
                    .await?
                    .items
                    .is_empty()
                    .then_some(()))
            },
        )
        .await?;
        println!(
            "s7: round {round}: {pods_per_round} pods Running after {:.1}s, pods gone after {:.1}s, claims gone after {:.1}s; per node {per_node:?}",
            running_after.as_secs_f64(),
            gone_after.as_secs_f64(),
            start.elapsed().as_secs_f64()
        );
    }

    // Nothing left: no prepared claims, no CDI files, no allocated (or generated) claims.
    wait_until("generated claims deleted", WAIT, || async {
        let left = env.claims().list(&ListParams::default()).await?.items;
        if left.is_empty() {
            Ok(Some(()))
        } else {
            Err(anyhow!(
                "{} claims left, e.g. {}",
                left.len(),
                left[0].name_any()
            ))
        }
    })
    .await?;
    for n in &env.nodes {
        let prepared = wait_until("the kubelet's checkpoint empty", WAIT, || async {
            let p = n.kubelet.prepared()?;
            Ok(p.is_empty().then_some(()))
        })
        .await;
        ensure!(prepared.is_ok(), "{}: claims still prepared", n.name);
        let files = e2e::cdi::spec_files(&n.dirs.cdi)?;
        ensure!(files.is_empty(), "{}: CDI files left: {files:?}", n.name);
        for (uid, c) in n.kubelet.prepare_calls()? {
            ensure!(
                c == 1,
                "{}: claim {uid} sent to NodePrepareResources {c} times",
                n.name
            );
        }
    }
    created_to_container.sort();
    println!(
        "s7: {} pods in {rounds} rounds over {:.1}s; created->CreateContainer p50 {:?} p99 {:?}",
        created_to_container.len(),
        t0.elapsed().as_secs_f64(),
        percentile(&created_to_container, 50),
        percentile(&created_to_container, 99),
    );
    ensure!(
        created_to_container.len() == rounds * pods_per_round,
        "latency samples missing"
    );
    env.check_violations()?;
    env.teardown().await
}
