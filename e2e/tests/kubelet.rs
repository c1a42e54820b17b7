//! Scenarios through the stock kubelet: scheduler → kubelet DRA manager → plugin → container
//! runtime (`fake-cri`, which refuses CDI devices it cannot resolve, as containerd does).
//!
//! Run one with `bash e2e/run.sh k1` (a substring of the test name).
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use e2e::env::{Env, PodClaim, WAIT, allocation_results, wait_until};
use e2e::env_or_skip;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

const CDI_KIND: &str = "k8s.gpu.nvidia.com/claim";

fn cdi_file(env: &Env, node: &str, claim_uid: &str) -> std::path::PathBuf {
    env.node(node)
        .dirs
        .cdi
        .join(format!("k8s.gpu.nvidia.com-claim_{claim_uid}.json"))
}

/// Runs `kubelet-dial` (Go, grpc-go, dialing as kubelet v1.37 does) with `args`; returns its JSON
/// lines, failing with them if any step failed.
fn kubelet_dial(args: &[&str]) -> Result<Vec<serde_json::Value>> {
    let tools = std::env::var_os("E2E_KUBELET_TOOLS").context("E2E_KUBELET_TOOLS is not set")?;
    let bin = Path::new(&tools).join("kubelet-dial");
    let out = Command::new(&bin)
        .args(args)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    let steps: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    if !out.status.success() {
        bail!(
            "kubelet-dial {args:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(steps)
}

/// The seed claim on a MIG node and a whole-GPU node, each in a pod that the stock kubelet runs:
/// the CDI devices the plugin returned reach the runtime; deleting the pod unprepares the claim
/// and frees the device for the next pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k1_seed_claim_runs_through_the_stock_kubelet() -> Result<()> {
    let mut env = env_or_skip!("k1_seed_claim_runs_through_the_stock_kubelet");
    env.add_node(
        "k1-mig",
        &["--profile", "h100-80gb:1", "--mig-layout", "all-3g.40gb"],
    )
    .await?;
    env.add_node("k1-whole", &["--profile", "h100-80gb:1"])
        .await?;
    env.create_from_file("examples/claims/inference-gpu.yaml")
        .await?;
    let claim = [PodClaim {
        name: "gpu",
        template: "inference-gpu",
    }];
    let cases = [
        ("on-mig", "k1-mig", "gpu/mig-slice", "gpu-0-mig-3g40gb-"),
        ("on-whole", "k1-whole", "gpu/whole-gpu", "gpu-0"),
    ];
    for (pod, node, _, _) in cases {
        env.create_pod(&env.pod_manifest(pod, Some(node), &claim, None)?)
            .await?;
    }
    for (pod, node, request, device_prefix) in cases {
        let running = env.wait_running(pod).await?;
        let c = env.pod_claim(pod, "gpu").await?;
        let uid = c.uid().unwrap_or_default();
        let r = allocation_results(&c);
        ensure!(
            r.len() == 1 && r[0].request == request && r[0].device.starts_with(device_prefix),
            "{pod}: allocation {r:?}"
        );
        let id = format!("{CDI_KIND}={uid}-{}", r[0].device);
        let at_runtime = env.cdi_devices_at_runtime(node, &running)?;
        ensure!(
            at_runtime == [id.clone()],
            "{pod}: the runtime got CDI devices {at_runtime:?}, expected [{id}]"
        );
        let specs = e2e::cdi::load(&env.node(node).dirs.cdi)?;
        let uuid = env
            .devices(node)
            .await?
            .get(&r[0].device)
            .and_then(|d| d.string("uuid"))
            .map(str::to_string)
            .context("no uuid attribute")?;
        let visible = specs
            .get(&id)
            .and_then(|d| d.env_value("NVIDIA_VISIBLE_DEVICES"))
            .with_context(|| format!("{id} not in the CDI specs"))?;
        ensure!(
            visible == uuid,
            "NVIDIA_VISIBLE_DEVICES={visible}, device uuid {uuid}"
        );
        let prepared = env.node(node).kubelet.prepared()?;
        ensure!(
            prepared.contains_key(&uid),
            "kubelet checkpoint {prepared:?} lacks {uid}"
        );
        println!(
            "k1: {pod} on {node}: {} -> {} ({uuid})",
            r[0].request, r[0].device
        );
    }

    // Deletion: the kubelet unprepares, the CDI spec goes, and the device serves the next pod.
    let first = env.pod_claim("on-whole", "gpu").await?;
    let file = cdi_file(&env, "k1-whole", &first.uid().unwrap_or_default());
    ensure!(file.exists(), "no CDI spec {}", file.display());
    env.delete_pod("on-whole").await?;
    env.wait_pod_gone("on-whole").await?;
    ensure!(!file.exists(), "CDI spec still there after the pod went");
    env.create_pod(&env.pod_manifest("again", Some("k1-whole"), &claim, None)?)
        .await?;
    env.wait_running("again").await?;
    env.check_violations()?;
    env.teardown().await
}

/// A pod asking for `nvidia.com/gpu: 1` (no claim in its spec) runs through the stock kubelet on
/// a device the scheduler allocated through the DeviceClass with `extendedResourceName`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k2_extended_resource_pod_runs() -> Result<()> {
    let mut env = env_or_skip!("k2_extended_resource_pod_runs");
    let node = "k2-h100";
    env.add_node(node, &["--profile", "h100-80gb:2"]).await?;
    let res =
        serde_json::json!({"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}});
    env.create_pod(&env.pod_manifest("legacy", Some(node), &[], Some(res))?)
        .await?;
    let pod = env.wait_running("legacy").await?;
    let ext = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.clone())
        .context("no status.extendedResourceClaimStatus")?;
    let claim = env.claims().get(&ext.resource_claim_name).await?;
    let r = allocation_results(&claim);
    ensure!(
        r.len() == 1 && r[0].device.starts_with("gpu-"),
        "allocation {r:?}"
    );
    let id = format!(
        "{CDI_KIND}={}-{}",
        claim.uid().unwrap_or_default(),
        r[0].device
    );
    let at_runtime = env.cdi_devices_at_runtime(node, &pod)?;
    ensure!(
        at_runtime == [id.clone()],
        "runtime got {at_runtime:?}, expected [{id}]"
    );
    env.check_violations()?;
    env.teardown().await
}

/// The kubelet restarts while a pod runs: it wipes the node's slices, the plugin publishes them
/// again and registers again, the prepared claim stays prepared (same CDI spec, no second
/// prepare), and new pods run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k3_kubelet_restart_keeps_prepared_claims() -> Result<()> {
    let mut env = env_or_skip!("k3_kubelet_restart_keeps_prepared_claims");
    let node = "k3-h100";
    env.add_node(node, &["--profile", "h100-80gb:2"]).await?;
    env.create_from_file("examples/claims/inference-gpu.yaml")
        .await?;
    let claim = [PodClaim {
        name: "gpu",
        template: "inference-gpu",
    }];
    env.create_pod(&env.pod_manifest("before", Some(node), &claim, None)?)
        .await?;
    env.wait_running("before").await?;
    let uid = env
        .pod_claim("before", "gpu")
        .await?
        .uid()
        .unwrap_or_default();
    let spec = cdi_file(&env, node, &uid);
    let written = std::fs::metadata(&spec)?.modified()?;
    let prepares_before = prepare_log_count(&env, node, &uid)?;

    let client = env.client.clone();
    let registrations = env.registrations(node);
    env.node_mut(node)
        .kubelet
        .stock_mut()
        .context("a stock kubelet node")?
        .restart(&client)
        .await?;
    env.wait_registered(node, registrations).await?;
    env.wait_slices(node).await?;
    let pod = env.wait_running("before").await?;
    ensure!(
        std::fs::metadata(&spec)?.modified()? == written,
        "the claim's CDI spec was written again after the kubelet restart"
    );
    let prepares_after = prepare_log_count(&env, node, &uid)?;
    ensure!(
        prepares_after == prepares_before,
        "claim {uid} prepared again by the plugin ({prepares_before} -> {prepares_after})"
    );
    let restarts: i32 = pod
        .status
        .and_then(|s| s.container_statuses)
        .unwrap_or_default()
        .iter()
        .map(|c| c.restart_count)
        .sum();
    ensure!(restarts == 0, "containers restarted {restarts} times");
    env.create_pod(&env.pod_manifest("after", Some(node), &claim, None)?)
        .await?;
    env.wait_running("after").await?;
    env.check_violations()?;
    env.teardown().await
}

fn prepare_log_count(env: &Env, node: &str, uid: &str) -> Result<u32> {
    Ok(env
        .node(node)
        .kubelet
        .prepare_calls()?
        .get(uid)
        .copied()
        .unwrap_or(0))
}

/// The plugin is killed (-9) while pods run and started again: it re-registers with the stock
/// kubelet, the running pod keeps its claim, deleting it unprepares, and a new pod runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k4_plugin_restart_while_pods_run() -> Result<()> {
    let mut env = env_or_skip!("k4_plugin_restart_while_pods_run");
    let node = "k4-h100";
    env.add_node(node, &["--profile", "h100-80gb:2"]).await?;
    env.create_from_file("examples/claims/inference-gpu.yaml")
        .await?;
    let claim = [PodClaim {
        name: "gpu",
        template: "inference-gpu",
    }];
    env.create_pod(&env.pod_manifest("running", Some(node), &claim, None)?)
        .await?;
    env.wait_running("running").await?;
    let uid = env
        .pod_claim("running", "gpu")
        .await?
        .uid()
        .unwrap_or_default();
    let spec = cdi_file(&env, node, &uid);

    let registrations = env.registrations(node);
    let n = env.node_mut(node);
    n.plugin.kill9().await?;
    n.plugin.restart()?;
    env.wait_registered(node, registrations).await?;
    env.wait_slices(node).await?;
    ensure!(
        spec.exists(),
        "the running pod's CDI spec went with the plugin restart"
    );
    env.create_pod(&env.pod_manifest("second", Some(node), &claim, None)?)
        .await?;
    env.wait_running("second").await?;
    env.delete_pod("running").await?;
    env.wait_pod_gone("running").await?;
    ensure!(!spec.exists(), "CDI spec still there after the pod went");
    env.check_violations()?;
    env.teardown().await
}

/// Two nodes, each with its own stock kubelet: pods land on both and each node's plugin prepares
/// only its own claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k5_two_nodes_two_kubelets() -> Result<()> {
    let mut env = env_or_skip!("k5_two_nodes_two_kubelets");
    env.add_node("k5-a", &["--profile", "l4:1"]).await?;
    env.add_node("k5-b", &["--profile", "l4:1"]).await?;
    let res =
        serde_json::json!({"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}});
    for (pod, node) in [("pa", "k5-a"), ("pb", "k5-b")] {
        env.create_pod(&env.pod_manifest(pod, Some(node), &[], Some(res.clone()))?)
            .await?;
    }
    for (pod, node) in [("pa", "k5-a"), ("pb", "k5-b")] {
        let p = env.wait_running(pod).await?;
        ensure!(
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node),
            "{pod} not on {node}"
        );
        ensure!(
            env.cdi_devices_at_runtime(node, &p)?.len() == 1,
            "{pod}: no CDI device at the runtime"
        );
    }
    env.check_violations()?;
    env.teardown().await
}

/// The regression test of the kubelet's dialing: a grpc-go client that dials the registration
/// socket by its bare path (the percent-encoded path becomes the HTTP/2 :authority) and the DRA
/// socket as `unix:<path>`, as kubelet v1.37 does, calls GetInfo, NotifyRegistrationStatus,
/// NodePrepareResources, NodeUnprepareResources and the health stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k0_grpc_go_dials_the_plugin_like_the_kubelet() -> Result<()> {
    let mut env = env_or_skip!("k0_grpc_go_dials_the_plugin_like_the_kubelet");
    let node = "k0-h100";
    env.add_node(
        node,
        &[
            "--profile",
            "h100-80gb:1",
            "--feature-gates",
            "NVMLDeviceHealthCheck=true",
        ],
    )
    .await?;
    env.create_from_file("examples/claims/inference-gpu.yaml")
        .await?;
    let claim = [PodClaim {
        name: "gpu",
        template: "inference-gpu",
    }];
    env.create_pod(&env.pod_manifest("held", Some(node), &claim, None)?)
        .await?;
    env.wait_running("held").await?;
    let c = env.pod_claim("held", "gpu").await?;
    let (uid, name) = (c.uid().unwrap_or_default(), c.name_any());
    let registration = std::fs::read_dir(&env.node(node).dirs.registrar)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "sock"))
        .context("no registration socket")?;
    let reg = registration.display().to_string();
    let steps = kubelet_dial(&[
        "--registration-socket",
        &reg,
        "--claim-uid",
        &uid,
        "--claim-namespace",
        &env.ns,
        "--claim-name",
        &name,
        "--health",
    ])?;
    let names: Vec<&str> = steps.iter().filter_map(|s| s["step"].as_str()).collect();
    ensure!(
        names == ["registration", "prepare", "unprepare", "health"],
        "steps {steps:?}"
    );
    // The unprepare above took the claim away under the kubelet; it prepares it again for the
    // next pod of the claim or unprepares (a no-op now) when the pod goes.
    env.delete_pod("held").await?;
    env.wait_pod_gone("held").await?;
    env.check_violations()?;
    env.teardown().await
}

/// An XID on a prepared GPU reaches the pod through the stock kubelet's health stream: the
/// container's `allocatedResourcesStatus` reports the device (by its CDI ID) Unhealthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_unhealthy_device_shows_in_pod_status() -> Result<()> {
    let mut env = env_or_skip!("k6_unhealthy_device_shows_in_pod_status");
    let node = "k6-h100";
    env.add_node(
        node,
        &[
            "--profile",
            "h100-80gb:2",
            "--feature-gates",
            "NVMLDeviceHealthCheck=true",
        ],
    )
    .await?;
    env.create_from_file("examples/claims/single-gpu.yaml")
        .await?;
    let claim = [PodClaim {
        name: "gpu",
        template: "single-gpu",
    }];
    env.create_pod(&env.pod_manifest("watched", Some(node), &claim, None)?)
        .await?;
    env.wait_running("watched").await?;
    let device = allocation_results(&env.pod_claim("watched", "gpu").await?)
        .first()
        .map(|r| r.device.clone())
        .context("no allocated device")?;
    let events = env.node(node).dirs.plugin.join("simulated-health-events");
    std::fs::write(&events, format!("{device} xid 79\n"))?;
    let status = wait_until(
        &format!("{device} Unhealthy in the pod's allocatedResourcesStatus"),
        WAIT,
        || async {
            let p = env.pods().get("watched").await?;
            let statuses = p
                .status
                .and_then(|s| s.container_statuses)
                .unwrap_or_default();
            let health: Vec<(String, String)> = statuses
                .iter()
                .flat_map(|c| c.allocated_resources_status.clone().unwrap_or_default())
                .flat_map(|s| s.resources.unwrap_or_default())
                .map(|r| (r.resource_id, r.health.unwrap_or_default()))
                .collect();
            let unhealthy = health
                .iter()
                .any(|(id, h)| id.ends_with(&format!("-{device}")) && h == "Unhealthy");
            Ok(unhealthy.then_some(health))
        },
    )
    .await?;
    println!("k6: allocatedResourcesStatus {status:?}");
    env.check_violations()?;
    env.teardown().await
}

/// A registration the stock kubelet refuses shows in the plugin's log and as a Node Event: a
/// second registration socket (a hard link to the plugin's own) makes the kubelet register the
/// same DRA endpoint twice, which it refuses with NotifyRegistrationStatus(false).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k8_refused_registration_is_logged_and_an_event() -> Result<()> {
    let mut env = env_or_skip!("k8_refused_registration_is_logged_and_an_event");
    let node = "k8-l4";
    env.add_node(node, &["--profile", "l4:1"]).await?;
    let registry = env.node(node).dirs.registrar.clone();
    let own = registry.join(format!("{}-reg.sock", e2e::DRIVER));
    let twin = registry.join("twin-reg.sock");
    std::fs::hard_link(&own, &twin)
        .with_context(|| format!("linking {} to {}", twin.display(), own.display()))?;
    let log = env.node(node).dirs.root.join("plugin.log");
    let line = wait_until("the refusal in the plugin's log", WAIT, || async {
        let text = std::fs::read_to_string(&log)?;
        Ok(text
            .lines()
            .find(|l| l.contains("WARN") && l.contains("the kubelet refused the registration"))
            .map(str::to_string))
    })
    .await?;
    println!("k8: {line}");
    ensure!(
        line.contains("already registered"),
        "the kubelet's reason is missing: {line}"
    );
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(env.client.clone(), "default");
    let event = wait_until("a RegistrationFailed Event on the Node", WAIT, || async {
        let list = events.list(&ListParams::default()).await?.items;
        Ok(list.into_iter().find(|e| {
            e.reason.as_deref() == Some("RegistrationFailed")
                && e.involved_object.kind.as_deref() == Some("Node")
                && e.involved_object.name.as_deref() == Some(node)
        }))
    })
    .await?;
    println!("k8: event {:?} {:?}", event.type_, event.message);
    ensure!(
        event.type_.as_deref() == Some("Warning"),
        "event type {:?}",
        event.type_
    );
    std::fs::remove_file(&twin)?;
    // The plugin's own registration stands: a pod still runs.
    let res =
        serde_json::json!({"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}});
    env.create_pod(&env.pod_manifest("after", Some(node), &[], Some(res))?)
        .await?;
    env.wait_running("after").await?;
    env.check_violations()?;
    env.teardown().await
}

/// A ComputeDomain workload pod through the stock kubelet: the node runs the GPU plugin and the
/// compute-domain plugin, both registered; the pod's channel claim (the template the controller
/// renders for a ComputeDomain) is prepared by the compute-domain plugin, its CDI device reaches
/// the runtime, and the node carries the domain's label while the channel is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k9_compute_domain_channel_through_the_kubelet() -> Result<()> {
    let mut env = env_or_skip!("k9_compute_domain_channel_through_the_kubelet");
    let node = "k9-gb200";
    let cd_driver = "compute-domain.nvidia.com";
    env.add_node(node, &["--profile", "gb200:4"]).await?;
    env.add_plugin(node, cd_driver, &[]).await?;
    let domain = "5f6c1a52-0b9e-4d7e-9c1a-3d2e8f7a6b10";
    env.create_from_yaml(&format!(
        r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: cd1-channel
spec:
  spec:
    devices:
      requests:
      - name: channel
        exactly:
          deviceClassName: compute-domain-default-channel.nvidia.com
      config:
      - requests: [channel]
        opaque:
          driver: {cd_driver}
          parameters:
            apiVersion: resource.nvidia.com/v1beta1
            kind: ComputeDomainChannelConfig
            domainID: {domain}
            allocationMode: Single
"#
    ))
    .await?;
    let claims = [PodClaim {
        name: "channel",
        template: "cd1-channel",
    }];
    env.create_pod(&env.pod_manifest("worker", Some(node), &claims, None)?)
        .await?;
    let pod = env.wait_running("worker").await?;
    let claim = env.pod_claim("worker", "channel").await?;
    let r = allocation_results(&claim);
    ensure!(
        r.len() == 1 && r[0].driver == cd_driver && r[0].device == "channel-0",
        "allocation {r:?}"
    );
    let at_runtime = env.cdi_devices_at_runtime(node, &pod)?;
    let uid = claim.uid().unwrap_or_default();
    ensure!(
        at_runtime.len() == 1 && at_runtime[0].ends_with(&format!("={uid}-channel-0")),
        "the runtime got {at_runtime:?}"
    );
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
    let labels = nodes.get(node).await?.metadata.labels.unwrap_or_default();
    ensure!(
        labels
            .get("resource.nvidia.com/computeDomain")
            .map(String::as_str)
            == Some(domain),
        "node labels {labels:?}"
    );
    env.delete_pod("worker").await?;
    env.wait_pod_gone("worker").await?;
    env.check_violations()?;
    env.teardown().await
}
