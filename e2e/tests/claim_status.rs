//! What a prepared claim shows beyond its CDI spec, through the stock kubelet: its
//! `status.devices` entries (KEP-4817) and, with `DeviceMetadata`, the per-request metadata file
//! the runtime mounts into the container (KEP-5304).
//!
//! Needs `E2E_KUBELET_TOOLS` (kubelet-dial), as `e2e/run.sh` sets it.
//!
//! Run with `E2E_TEST_TARGETS="--test claim_status" bash e2e/run.sh`.
use anyhow::{Context, Result, ensure};
use e2e::env::{Env, PodClaim, WAIT, allocation_results, wait_until};
use e2e::env_or_skip;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::ResourceExt;
use serde_json::{Value, json};

const DRIVER: &str = "gpu.nvidia.com";

/// Runs `kubelet-dial` (grpc-go, dialing as kubelet v1.37 does) with `args`.
fn kubelet_dial(args: &[&str]) -> Result<()> {
    let tools = std::env::var_os("E2E_KUBELET_TOOLS").context("E2E_KUBELET_TOOLS is not set")?;
    let bin = std::path::Path::new(&tools).join("kubelet-dial");
    let out = std::process::Command::new(&bin)
        .args(args)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    ensure!(
        out.status.success(),
        "kubelet-dial {args:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The claim's `status.devices` entries of our driver.
fn our_entries(c: &ResourceClaim) -> Vec<Value> {
    let v = serde_json::to_value(c).unwrap_or_default();
    v["status"]["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["driver"] == DRIVER)
        .cloned()
        .collect()
}

/// Waits until the claim `name` has an entry for each allocated device of ours, and checks each
/// one's UUID (the slice's `uuid` attribute) and Ready condition.
async fn wait_entries(env: &Env, node: &str, name: &str) -> Result<ResourceClaim> {
    let c = wait_until(&format!("status.devices of {name}"), WAIT, || async {
        let c = env.claims().get(name).await?;
        let n = allocation_results(&c).len();
        Ok((n > 0 && our_entries(&c).len() == n).then_some(c))
    })
    .await?;
    let devices = env.devices(node).await?;
    for (r, e) in allocation_results(&c).iter().zip(our_entries(&c)) {
        let uuid = devices
            .get(&r.device)
            .and_then(|d| d.string("uuid"))
            .context("no uuid attribute")?;
        ensure!(
            e["device"] == r.device.as_str()
                && e["pool"] == r.pool.as_str()
                && e["data"]["uuid"] == uuid
                && e["conditions"][0]["type"] == "Ready"
                && e["conditions"][0]["status"] == "True",
            "{name}: entry {e} for {r:?} (uuid {uuid})"
        );
    }
    Ok(c)
}

/// One pod with a claim from a template (`gpu`) and a claim it names (`direct`), on a MIG node
/// with `DeviceMetadata`: both claims get status entries with the MIG UUIDs; the container gets
/// one metadata CDI device per claim request, whose spec mounts a file that names the claim, the
/// request as allocated and the device; deleting the pod removes the entries of the claim that
/// outlives it, and the metadata files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_status_devices_and_metadata_through_the_stock_kubelet() -> Result<()> {
    let mut env = env_or_skip!("s1_status_devices_and_metadata_through_the_stock_kubelet");
    let node = "s1-mig";
    env.add_node(
        node,
        &[
            "--profile",
            "h100-80gb:1",
            "--mig-layout",
            "all-3g.40gb",
            "--feature-gates",
            "DeviceMetadata=true,PassthroughSupport=true",
        ],
    )
    .await?;
    env.create_from_file("examples/claims/inference-gpu.yaml")
        .await?;
    env.create_from_yaml(
        r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: s1-direct
spec:
  devices:
    requests:
    - name: slice
      exactly:
        deviceClassName: mig.nvidia.com
"#,
    )
    .await?;
    let claim = [PodClaim {
        name: "gpu",
        template: "inference-gpu",
    }];
    let mut pod = serde_json::to_value(env.pod_manifest("s1", Some(node), &claim, None)?)?;
    pod["spec"]["resourceClaims"]
        .as_array_mut()
        .context("resourceClaims")?
        .push(json!({"name": "direct", "resourceClaimName": "s1-direct"}));
    pod["spec"]["containers"][0]["resources"]["claims"]
        .as_array_mut()
        .context("claims")?
        .push(json!({"name": "direct"}));
    let pod: Pod = serde_json::from_value(pod)?;
    env.create_pod(&pod).await?;
    let running = env.wait_running("s1").await?;

    let templated = env.pod_claim("s1", "gpu").await?;
    let templated = wait_entries(&env, node, &templated.name_any()).await?;
    let direct = wait_entries(&env, node, "s1-direct").await?;

    let stock = env.node(node).kubelet.stock().context("a stock kubelet")?;
    let at_runtime: Vec<String> = stock
        .containers()?
        .into_iter()
        .filter(|c| c.pod_uid == running.uid().unwrap_or_default() && c.error.is_empty())
        .flat_map(|c| c.cdi_devices)
        .collect();
    let specs_dir = env.node(node).dirs.cdi.clone();
    let cases = [
        (
            &templated,
            "gpu",
            "gpu/mig-slice",
            "resourceclaimtemplates/gpu/gpu",
        ),
        (&direct, "slice", "slice", "resourceclaims/s1-direct/slice"),
    ];
    let mut host_files = Vec::new();
    for (c, request, request_ref, container_dir) in cases {
        let uid = c.uid().unwrap_or_default();
        let id = format!("{DRIVER}/metadata={uid}_{request}");
        ensure!(
            at_runtime.contains(&id),
            "the runtime got {at_runtime:?}, not {id}"
        );
        let spec_file = specs_dir.join(format!("{DRIVER}_metadata_{uid}_{request}.json"));
        let spec: Value = serde_json::from_slice(&std::fs::read(&spec_file)?)?;
        let mount = &spec["devices"][0]["containerEdits"]["mounts"][0];
        ensure!(
            mount["containerPath"]
                == format!(
                    "/var/run/kubernetes.io/dra-device-attributes/{container_dir}/{DRIVER}-metadata.json"
                )
                && mount["options"] == json!(["ro", "bind"]),
            "{}: {spec}",
            spec_file.display()
        );
        let host = mount["hostPath"].as_str().context("hostPath")?.to_string();
        let text = std::fs::read(&host).with_context(|| format!("reading {host}"))?;
        let docs: Vec<Value> = serde_json::Deserializer::from_slice(&text)
            .into_iter()
            .collect::<Result<_, _>>()?;
        let versions: Vec<&str> = docs
            .iter()
            .filter_map(|d| d["apiVersion"].as_str())
            .collect();
        ensure!(
            versions
                == [
                    "metadata.resource.k8s.io/v1beta1",
                    "metadata.resource.k8s.io/v1alpha1"
                ],
            "{host}: versions {versions:?}"
        );
        let d = &docs[0];
        let device = &allocation_results(c)[0].device;
        ensure!(
            d["kind"] == "DeviceMetadata"
                && d["metadata"]["uid"] == uid.as_str()
                && d["metadata"]["name"] == c.name_any().as_str()
                && d["requests"][0]["name"] == request_ref
                && d["requests"][0]["devices"][0]["name"] == device.as_str()
                && d["requests"][0]["devices"][0]["driver"] == DRIVER,
            "{host}: {d}"
        );
        host_files.push(host);
    }

    // An unprepare under the kubelet (kubelet-dial's, as in k0) drops our entries of a claim
    // that stays allocated: our own clearing, not the API server's on deallocation.
    let registration = std::fs::read_dir(&env.node(node).dirs.registrar)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "sock"))
        .context("no registration socket")?;
    let direct_uid = direct.uid().unwrap_or_default();
    kubelet_dial(&[
        "--registration-socket",
        &registration.display().to_string(),
        "--claim-uid",
        &direct_uid,
        "--claim-namespace",
        &env.ns,
        "--claim-name",
        "s1-direct",
    ])?;
    wait_until(
        "s1-direct allocated without entries of ours",
        WAIT,
        || async {
            let c = env.claims().get("s1-direct").await?;
            let allocated = !allocation_results(&c).is_empty();
            Ok((allocated && our_entries(&c).is_empty()).then_some(()))
        },
    )
    .await?;

    env.delete_pod("s1").await?;
    env.wait_pod_gone("s1").await?;
    wait_until(
        "no status.devices entries of ours on s1-direct",
        WAIT,
        || async {
            let c = env.claims().get("s1-direct").await?;
            Ok(our_entries(&c).is_empty().then_some(()))
        },
    )
    .await?;
    // The kubelet may unprepare after the pod object is gone.
    wait_until("the metadata files removed", WAIT, || async {
        Ok((!host_files.iter().any(|f| std::path::Path::new(f).exists())).then_some(()))
    })
    .await?;
    env.check_violations()?;
    env.teardown().await
}
