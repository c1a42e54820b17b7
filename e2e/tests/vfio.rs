//! VFIO passthrough (`PassthroughSupport`) through the stock kubelet, on a fake host PCI bus
//! (`vfio/fake_pci.rs`: the simulated GPUs' addresses and IOMMU groups in a sysfs tree, and a
//! fake kernel that moves the `driver` link on `bind`/`unbind` writes).
//!
//! Run with `E2E_TEST_TARGETS="--test vfio" bash e2e/run.sh`.
#[path = "vfio/fake_pci.rs"]
mod fake_pci;

use std::collections::BTreeSet;

use anyhow::{Context, Result, ensure};
use e2e::env::{Env, PodClaim, WAIT, allocation_results, wait_until};
use e2e::env_or_skip;
use fake_pci::{FakePci, NVIDIA, VFIO_PCI};
use gpu_dra_api::simulated::{GpuGroup, simulate_node};
use kube::ResourceExt;
use serde_json::Value;

const CDI_KIND: &str = "k8s.gpu.nvidia.com/claim";
const NODE: &str = "vf1";
const PROFILE: &str = "h100-80gb:2";
const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";

/// NVIDIA's `gpu-test-vfiopci.yaml` and `gpu-test-vfio-config.yaml` claim templates.
const TEMPLATES: &str = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: single-gpu
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: vfio.gpu.nvidia.com
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: single-gpu-full-vfioconfig
spec:
  spec:
    devices:
      config:
      - opaque:
          driver: gpu.nvidia.com
          parameters:
            apiVersion: resource.nvidia.com/v1beta1
            kind: VfioDeviceConfig
            iommu:
              backendPolicy: LegacyOnly
              enableAPIDevice: true
        requests: ["gpu"]
      requests:
      - name: gpu
        exactly:
          deviceClassName: vfio.gpu.nvidia.com
"#;

/// `(PCI address, IOMMU group, PCI device ID)` of each GPU the simulated backend reports.
fn simulated_functions() -> Result<Vec<(String, u32, u16)>> {
    let inv = simulate_node(NODE, &[GpuGroup::parse(PROFILE)?], None)?;
    inv.gpus
        .iter()
        .map(|g| {
            let p = g
                .pci
                .as_ref()
                .context("a simulated GPU without PCI facts")?;
            let group = p
                .iommu_group
                .context("a simulated GPU without IOMMU group")?;
            Ok((g.pci_bus_id.clone(), group, p.device_id))
        })
        .collect()
}

/// The claim's CDI spec file, parsed.
fn cdi_spec(env: &Env, claim_uid: &str) -> Result<Value> {
    let file = env
        .node(NODE)
        .dirs
        .cdi
        .join(format!("k8s.gpu.nvidia.com-claim_{claim_uid}.json"));
    let text = std::fs::read_to_string(&file).with_context(|| format!("{}", file.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", file.display()))
}

fn device_nodes(edits: &Value) -> Vec<String> {
    edits["deviceNodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n["path"].as_str().map(String::from))
        .collect()
}

/// The published device names now.
async fn names(env: &Env) -> Result<BTreeSet<String>> {
    Ok(env.devices(NODE).await?.into_keys().collect())
}

/// Checks one running pod's vfio claim: CDI ID at the runtime, `/dev/vfio/<group>` in its spec
/// (plus `/dev/vfio/vfio` when the config asks for the API device), the GPU on vfio-pci.
/// Returns the device and the GPU's PCI address.
async fn check_running(
    env: &Env,
    pci: &FakePci,
    functions: &[(String, u32, u16)],
    pod: &str,
    api_device: bool,
) -> Result<(String, String)> {
    let running = env.wait_running(pod).await?;
    let claim = env.pod_claim(pod, "gpu").await?;
    let uid = claim.uid().unwrap_or_default();
    let r = allocation_results(&claim);
    ensure!(
        r.len() == 1 && r[0].device.starts_with("gpu-vfio-"),
        "{pod}: allocation {r:?}"
    );
    let device = r[0].device.clone();
    let addr = env.devices(NODE).await?[&device]
        .string(PCI_BUS_ID)
        .with_context(|| format!("{device} has no {PCI_BUS_ID}"))?
        .to_string();
    let group = functions
        .iter()
        .find(|f| f.0 == addr)
        .with_context(|| format!("{addr} is not a simulated GPU"))?
        .1;

    let id = format!("{CDI_KIND}={uid}-{device}");
    let at_runtime = env.cdi_devices_at_runtime(NODE, &running)?;
    ensure!(
        at_runtime == [id.clone()],
        "{pod}: runtime got {at_runtime:?}, expected [{id}]"
    );

    let spec = cdi_spec(env, &uid)?;
    let dev = spec["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["name"] == format!("{uid}-{device}"))
        .with_context(|| format!("{pod}: no {device} in the CDI spec {spec}"))?;
    let want = format!("/dev/vfio/{group}");
    ensure!(
        device_nodes(&dev["containerEdits"]) == [want.clone()],
        "{pod}: device edits {}, want the node {want}",
        dev["containerEdits"]
    );
    let common = &spec["containerEdits"];
    ensure!(
        common["env"] == serde_json::json!(["NVIDIA_VISIBLE_DEVICES=void"]),
        "{pod}: spec-wide edits {common}"
    );
    let api: Vec<String> = if api_device {
        vec!["/dev/vfio/vfio".into()]
    } else {
        Vec::new()
    };
    ensure!(
        device_nodes(common) == api,
        "{pod}: spec-wide device nodes {common}"
    );
    ensure!(
        pci.driver_of(&addr).as_deref() == Some(VFIO_PCI),
        "{pod}: {addr} is on {:?}, kernel log {:?}",
        pci.driver_of(&addr),
        pci.log()
    );
    println!("v1: {pod}: {device} = {addr} on vfio-pci, {want}");
    Ok((device, addr))
}

/// NVIDIA's two vfio demo claims on a node with two GPUs: each pod gets a `gpu-vfio-<index>`
/// device, its GPU is bound to vfio-pci, the container gets `/dev/vfio/<group>`; the sibling
/// `gpu-<minor>` devices leave the pool while held; deleting the pods binds the GPUs back to
/// nvidia and publishes the `gpu-<minor>` devices again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_vfio_claims_bind_gpus_to_vfio_pci() -> Result<()> {
    let mut env = env_or_skip!("v1_vfio_claims_bind_gpus_to_vfio_pci");
    let functions = simulated_functions()?;
    let pci = FakePci::start(&env.work.join("nodes").join(NODE).join("host"), &functions)?;
    let (sys, dev) = (pci.sys.display().to_string(), pci.dev.display().to_string());
    env.add_node(
        NODE,
        &[
            "--profile",
            PROFILE,
            "--feature-gates",
            "PassthroughSupport=true",
            "--host-sysfs-root",
            &sys,
            "--host-dev-root",
            &dev,
        ],
    )
    .await?;
    let all: BTreeSet<String> = ["gpu-0", "gpu-1", "gpu-vfio-0", "gpu-vfio-1"]
        .map(String::from)
        .into();
    ensure!(
        names(&env).await? == all,
        "published {:?}",
        names(&env).await?
    );
    // The GPU device of each PCI address, to find the sibling of a vfio device.
    let by_addr: Vec<(String, String)> = env
        .devices(NODE)
        .await?
        .into_iter()
        .filter(|(_, d)| d.string("type") == Some("gpu"))
        .filter_map(|(n, d)| Some((d.string(PCI_BUS_ID)?.to_string(), n)))
        .collect();

    env.create_from_yaml(TEMPLATES).await?;
    let cases = [
        ("vfio-plain", "single-gpu", false),
        ("vfio-full-config", "single-gpu-full-vfioconfig", true),
    ];
    for (pod, template, _) in cases {
        let claim = [PodClaim {
            name: "gpu",
            template,
        }];
        env.create_pod(&env.pod_manifest(pod, Some(NODE), &claim, None)?)
            .await?;
    }
    let mut held = BTreeSet::new();
    let mut siblings = BTreeSet::new();
    for (pod, _, api_device) in cases {
        let (device, addr) = check_running(&env, &pci, &functions, pod, api_device).await?;
        held.insert(device);
        let gpu = by_addr
            .iter()
            .find(|(a, _)| *a == addr)
            .context("no sibling")?;
        siblings.insert(gpu.1.clone());
    }
    ensure!(held.len() == 2, "both pods got {held:?}");
    wait_until(
        "the held GPUs' gpu devices leave the pool",
        WAIT,
        || async {
            let now = names(&env).await?;
            Ok((now.is_disjoint(&siblings) && now.is_superset(&held)).then_some(()))
        },
    )
    .await?;

    for (pod, _, _) in cases {
        env.delete_pod(pod).await?;
    }
    for (pod, _, _) in cases {
        env.wait_pod_gone(pod).await?;
    }
    wait_until("the GPUs back on nvidia", WAIT, || async {
        Ok(functions
            .iter()
            .all(|f| pci.driver_of(&f.0).as_deref() == Some(NVIDIA))
            .then_some(()))
    })
    .await?;
    wait_until("the gpu devices published again", WAIT, || async {
        Ok((names(&env).await? == all).then_some(()))
    })
    .await?;
    let log = pci.log();
    println!("v1: kernel saw {log:?}");
    ensure!(
        !log.iter().any(|l| l.contains("refused")),
        "the fake kernel refused writes: {log:?}"
    );
    env.teardown().await
}
