//! The NVML backend on the real control plane: a node whose plugin runs `--backend nvml` against
//! the mock libnvidia-ml (`mock-nvml/`, built here with make + gcc through
//! `dra-plugin mock-nvml-root`, from the same hardware profile the simulated nodes use). Dynamic
//! MIG goes through NVML calls: the instance the scheduler picked is created in (mock) NVML at
//! prepare, its NVML UUID reaches the CDI spec, and it is destroyed at unprepare.
use anyhow::{Context, Result, ensure};
use e2e::env::PodClaim;
use e2e::mock_nvml::{add_dynamic_mig_node, mig_state, mock_root};
use k8s_openapi::api::resource::v1::DeviceRequestAllocationResult;
use kube::ResourceExt;

use e2e::env_or_skip;

#[tokio::test]
async fn nvml1_mock_nvml_node_dynamic_mig_inference() -> Result<()> {
    let mut env = env_or_skip!("nvml1_mock_nvml_node_dynamic_mig_inference");
    let node = "nvml1-h100";
    let mock = env.work.join("nodes").join(node).join("mock-nvml");
    mock_root(&env, node, "h100-80gb:1", &mock).await?;
    let conf = std::fs::read_to_string(mock.join("root/usr/lib64/mock-nvml.conf"))?;
    let gpu_uuid = conf
        .lines()
        .find_map(|l| l.strip_prefix("gpu 0 "))
        .and_then(|rest| rest.split(' ').next())
        .context("gpu 0 in the mock's description")?
        .to_string();

    let root = mock.join("root");
    add_dynamic_mig_node(&mut env, node, &root).await?;
    let log = std::fs::read_to_string(env.node(node).dirs.root.join("plugin.log"))?;
    let lib = root.join("usr/lib64/libnvidia-ml.so.1");
    ensure!(
        log.contains("NVML session open") && log.contains(&lib.display().to_string()),
        "the plugin did not open NVML from the mock ({}):\n{log}",
        lib.display()
    );

    // Slices the API server accepted, from NVML: the GPU with the mock's UUID and its 25 placements.
    let devices = env.devices(node).await?;
    ensure!(
        devices.len() == 26,
        "{} devices published, want GPU + 25 placements: {:?}",
        devices.len(),
        devices.keys().collect::<Vec<_>>()
    );
    let gpu = devices.get("gpu-0").context("gpu-0 not published")?;
    ensure!(
        gpu.string("uuid") == Some(gpu_uuid.as_str()),
        "gpu-0 uuid {:?}, the mock says {gpu_uuid}",
        gpu.string("uuid")
    );
    ensure!(
        gpu.string("productName") == Some("NVIDIA H100 80GB HBM3"),
        "productName {:?}",
        gpu.string("productName")
    );
    ensure!(
        mig_state(&mock)?.iter().all(|l| !l.starts_with("gi ")),
        "no MIG instance before any claim"
    );

    env.create_from_file("examples/claims/inference-gpu.yaml")
        .await?;
    let claim = [PodClaim {
        name: "gpu",
        template: "inference-gpu",
    }];
    env.create_pod(&env.pod_manifest("infer-0", Some(node), &claim, None)?)
        .await?;
    env.wait_running("infer-0").await?;

    let c = env.pod_claim("infer-0", "gpu").await?;
    let results: Vec<DeviceRequestAllocationResult> = c
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.clone())
        .unwrap_or_default();
    ensure!(results.len() == 1, "{} allocation results", results.len());
    let (request, device) = (&results[0].request, &results[0].device);
    ensure!(request == "gpu/mig-slice", "allocated for {request}");
    ensure!(device.starts_with("gpu-0-mig-3g40gb-9-"), "got {device}");
    let start: u32 = device.rsplit('-').next().unwrap_or_default().parse()?;

    // The CDI spec carries the UUID NVML gave the instance the plugin created there.
    let specs = e2e::cdi::load(&env.node(node).dirs.cdi)?;
    let id = format!(
        "k8s.gpu.nvidia.com/claim={}-{device}",
        c.uid().unwrap_or_default()
    );
    let visible = specs
        .get(&id)
        .with_context(|| format!("CDI device {id} not defined"))?
        .env_value("NVIDIA_VISIBLE_DEVICES")
        .context("no NVIDIA_VISIBLE_DEVICES")?
        .to_string();
    let mock_uuid = conf
        .lines()
        .find_map(|l| l.strip_prefix(&format!("place 9 {start} 4 ")))
        .with_context(|| format!("no 3g.40gb placement at {start} in the mock"))?;
    ensure!(
        visible == mock_uuid,
        "NVIDIA_VISIBLE_DEVICES={visible}, the mock's MIG device there is {mock_uuid}"
    );
    let state = mig_state(&mock)?;
    ensure!(
        state.contains(&"gpu 0 1 1".to_string()),
        "MIG mode on in NVML: {state:?}"
    );
    let gis: Vec<&String> = state.iter().filter(|l| l.starts_with("gi 0 ")).collect();
    ensure!(
        gis.len() == 1 && gis[0].ends_with(&format!(" 9 {start}")),
        "one 3g.40gb GPU instance at {start} in NVML: {state:?}"
    );
    ensure!(
        state.iter().filter(|l| l.starts_with("ci 0 ")).count() == 1,
        "its compute instance: {state:?}"
    );
    println!("infer-0: {device} = {visible} (created through NVML)");

    // Deleting the pod unprepares the claim: the instance is destroyed in NVML, MIG mode off again.
    env.delete_pod("infer-0").await?;
    env.wait_pod_gone("infer-0").await?;
    let state = mig_state(&mock)?;
    ensure!(
        !state
            .iter()
            .any(|l| l.starts_with("gi ") || l.starts_with("ci ")),
        "instance destroyed: {state:?}"
    );
    ensure!(
        state.contains(&"gpu 0 0 0".to_string()),
        "MIG mode off again: {state:?}"
    );
    env.check_violations()?;
    env.teardown().await
}

/// kill -9 of the plugin while a burst of dynamic-MIG prepares is in flight, against the mock whose
/// MIG state outlives the process (as a GPU's does): after the restart every pod runs, there is
/// exactly one instance per claim (nothing leaked, nothing created twice), and deleting the pods
/// leaves no instance behind.
#[tokio::test]
async fn nvml2_kill9_during_prepares_no_leak_no_double() -> Result<()> {
    let mut env = env_or_skip!("nvml2_kill9_during_prepares_no_leak_no_double");
    let node = "nvml2-h100";
    let mock = env.work.join("nodes").join(node).join("mock-nvml");
    mock_root(&env, node, "h100-80gb:2", &mock).await?;
    let root = mock.join("root");
    add_dynamic_mig_node(&mut env, node, &root).await?;
    env.create_from_yaml(
        r#"
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
"#,
    )
    .await?;
    let claim = [PodClaim {
        name: "mig",
        template: "mig-1g",
    }];
    let pods: Vec<String> = (0..10).map(|i| format!("burst-{i}")).collect();
    for p in &pods {
        env.create_pod(&env.pod_manifest(p, Some(node), &claim, None)?)
            .await?;
    }
    // Kill as soon as the first prepare has finished: the others are queued or in flight.
    let cdi = env.node(node).dirs.cdi.clone();
    let deadline = std::time::Instant::now() + e2e::env::WAIT;
    while std::fs::read_dir(&cdi)?.count() == 0 {
        ensure!(
            std::time::Instant::now() < deadline,
            "no claim was ever prepared"
        );
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    env.node_mut(node).plugin.kill9().await?;
    let at_kill = std::fs::read_dir(&cdi)?.count();
    println!("killed the plugin with {at_kill} of 10 claims prepared");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    env.node_mut(node).plugin.restart()?;

    let mut devices = Vec::new();
    for p in &pods {
        env.wait_running(p).await?;
        let c = env.pod_claim(p, "mig").await?;
        let r = e2e::env::allocation_results(&c);
        ensure!(r.len() == 1, "{p}: {} results", r.len());
        devices.push(r[0].device.clone());
    }
    let instances: Vec<String> = mig_state(&mock)?
        .into_iter()
        .filter(|l| l.starts_with("gi "))
        .collect();
    ensure!(
        instances.len() == pods.len(),
        "{} GPU instances for {} claims after the crash: {instances:?}",
        instances.len(),
        pods.len()
    );
    let mut unique = devices.clone();
    unique.sort();
    unique.dedup();
    ensure!(
        unique.len() == devices.len(),
        "a placement was handed out twice: {devices:?}"
    );

    for p in &pods {
        env.delete_pod(p).await?;
    }
    for p in &pods {
        env.wait_pod_gone(p).await?;
    }
    let left: Vec<String> = mig_state(&mock)?
        .into_iter()
        .filter(|l| l.starts_with("gi "))
        .collect();
    ensure!(
        left.is_empty(),
        "instances left after every pod is gone: {left:?}"
    );
    env.check_violations()?;
    env.teardown().await
}
