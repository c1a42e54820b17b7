//! `spec.dcgmExporter` through the real kubelet: a workload pod holds one GPU of a two-GPU node;
//! the controller (`dra-controller run`, GPUCluster with `dcgmExporter` on) renders the exporter's
//! admin-access ResourceClaimTemplate, DaemonSet and Service, and labels its namespace for admin
//! access. The exporter pod gets both GPUs, the held one included, prepared by our plugin, and the
//! workload keeps running. Without `dcgmExporter` the DaemonSet and the template go.
//!
//! kube-controller-manager's DaemonSet controller runs for this test only (a second instance), so
//! the exporter pod comes from the DaemonSet as in a real cluster.
//! The controller runs as a subprocess (`E2E_CONTROLLER_BIN`, default `target/debug/dra-controller`).

use anyhow::{Context, Result, ensure};
use e2e::controller::{apply_crds, nvidia_api, start_controller};
use e2e::env::{Env, PodClaim, WAIT, allocation_results, wait_until};
use e2e::env_or_skip;
use e2e::manifests::WorkloadControllers;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::process::Child;

const EXPORTER: &str = "nvidia-dcgm-exporter";
const ADMIN_ACCESS_LABEL: &str = "resource.kubernetes.io/admin-access";
const CDI_KIND: &str = "k8s.gpu.nvidia.com/claim";
const POOL_LABEL: &str = "e2e-dcgm-pool";

const WHOLE: &str = r#"
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
"#;

/// The GPUCluster, its pool the scenario's node, with `dcgmExporter` when `exporter`. Applied as a
/// whole by one field manager, so leaving the field out removes it.
async fn apply_gpucluster(env: &Env, exporter: bool) -> Result<()> {
    let mut spec = json!({
        "draDriver": { "computeDomains": { "enabled": false } },
        "migrationPool": { "nodeSelector": { "matchLabels": { POOL_LABEL: env.test } } },
    });
    if exporter {
        spec["dcgmExporter"] =
            json!({ "enabled": true, "version": "e2e", "serviceMonitor": { "enabled": false } });
    }
    let gc = json!({
        "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
        "metadata": { "name": "gpu-cluster" }, "spec": spec,
    });
    nvidia_api(env, "GPUCluster", "gpuclusters")
        .patch(
            "gpu-cluster",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&gc),
        )
        .await?;
    Ok(())
}

/// The pod the DaemonSet controller created for `ds` on `node`, once there is one.
async fn daemon_pod(env: &Env, ds: &DaemonSet, node: &str) -> Result<Pod> {
    let uid = ds.uid().context("DaemonSet uid")?;
    wait_until("the DaemonSet controller's exporter pod", WAIT, || async {
        let pods = env.pods().list(&ListParams::default()).await?.items;
        Ok(pods.into_iter().find(|p| {
            let owned = p.owner_references().iter().any(|o| o.uid == uid);
            let on_node = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
            owned && on_node
        }))
    })
    .await
}

async fn gone<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    wait_until(&format!("{name} gone"), WAIT, || async {
        Ok(api.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

async fn namespace_label(env: &Env) -> Result<Option<String>> {
    let ns = Api::<Namespace>::all(env.client.clone())
        .get(&env.ns)
        .await?;
    Ok(ns.labels().get(ADMIN_ACCESS_LABEL).cloned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dx1_exporter_gets_every_gpu_with_admin_access() -> Result<()> {
    let mut env = env_or_skip!("dx1_exporter_gets_every_gpu_with_admin_access");
    let node = "dx1-h100";
    apply_crds(&env).await?;
    env.add_node(node, &["--profile", "h100-80gb:2"]).await?;
    env.create_from_yaml(WHOLE).await?;
    let claim = [PodClaim {
        name: "gpu",
        template: "whole",
    }];
    env.create_pod(&env.pod_manifest("dx1-work", Some(node), &claim, None)?)
        .await?;
    let work = env.wait_running("dx1-work").await?;
    let work_claim = env.pod_claim("dx1-work", "gpu").await?;
    let held = allocation_results(&work_claim);
    ensure!(held.len() == 1, "workload allocation {held:?}");
    let work_cdi = env.cdi_devices_at_runtime(node, &work)?;

    let label = json!({ "metadata": { "labels": { POOL_LABEL: env.test } } });
    Api::<Node>::all(env.client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&label))
        .await?;
    apply_gpucluster(&env, true).await?;
    let mut controller = start_controller(&env)?;
    let daemonsets = WorkloadControllers::start_only(
        &env.kubeconfig,
        &env.work.join("dx1-daemonset-controller.log"),
        "daemonset-controller",
    )?;
    let outcome = exporter_scenario(&env, node, &work, &held[0].device, &work_cdi).await;
    drop(daemonsets);
    let finished = finish(&env, &mut controller).await;
    outcome?;
    finished?;
    env.check_violations()?;
    env.teardown().await
}

async fn exporter_scenario(
    env: &Env,
    node: &str,
    work: &Pod,
    held: &str,
    work_cdi: &[String],
) -> Result<()> {
    let daemonsets: Api<DaemonSet> = Api::namespaced(env.client.clone(), &env.ns);
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(env.client.clone(), &env.ns);
    let services: Api<Service> = Api::namespaced(env.client.clone(), &env.ns);
    let ds = wait_until("the exporter DaemonSet", WAIT, || async {
        Ok(daemonsets.get_opt(EXPORTER).await?)
    })
    .await?;
    templates
        .get(EXPORTER)
        .await
        .context("the admin-access template")?;
    // Applied after the DaemonSet, so it may not exist yet when the DaemonSet first does.
    let svc = wait_until("the exporter Service", WAIT, || async {
        Ok(services.get_opt(EXPORTER).await?)
    })
    .await?;
    let port = svc.spec.and_then(|s| s.ports).unwrap_or_default();
    ensure!(
        port.first().map(|p| p.port) == Some(9400),
        "Service ports {port:?}"
    );
    ensure!(
        namespace_label(env).await?.as_deref() == Some("true"),
        "namespace {} lacks {ADMIN_ACCESS_LABEL}=true",
        env.ns
    );
    // The node joins the pool (the controller's label), so the template's nodeSelector fits.
    wait_until("the DRA driver label on the node", WAIT, || async {
        let n = Api::<Node>::all(env.client.clone()).get(node).await?;
        Ok((n
            .labels()
            .get("nvidia.com/gpu.deploy.dra-driver")
            .map(String::as_str)
            == Some("true"))
        .then_some(()))
    })
    .await?;

    let pod = daemon_pod(env, &ds, node).await?;
    let pod_name = pod.name_any();
    let exporter = env.wait_running(&pod_name).await?;
    check_exporter_claim(env, node, &exporter, held).await?;

    // The workload is untouched: still running, same claim, same CDI devices, still prepared.
    let now = env.pods().get(&work.name_any()).await?;
    ensure!(now.uid() == work.uid(), "the workload pod was replaced");
    ensure!(
        now.status.and_then(|s| s.phase).as_deref() == Some("Running"),
        "the workload pod left Running"
    );
    ensure!(
        env.cdi_devices_at_runtime(node, work)? == work_cdi,
        "workload CDI changed"
    );
    let work_claim = env.pod_claim(&work.name_any(), "gpu").await?;
    let prepared = env.node(node).kubelet.prepared()?;
    ensure!(
        prepared.contains_key(&work_claim.uid().unwrap_or_default()),
        "the workload claim is no longer prepared: {prepared:?}"
    );

    apply_gpucluster(env, false).await?;
    gone(&daemonsets, EXPORTER).await?;
    gone(&env.pods(), &pod_name).await?;
    gone(&templates, EXPORTER).await?;
    gone(&services, EXPORTER).await?;
    wait_until("the admin-access label released", WAIT, || async {
        Ok(namespace_label(env).await?.is_none().then_some(()))
    })
    .await?;
    env.wait_running(&work.name_any()).await?;
    println!("dx1: exporter got every GPU (held {held}) with admin access; removed cleanly");
    Ok(())
}

/// The exporter's claim: `All` over the node's GPUs with admin access, the held one included, and
/// the kubelet gave the runtime one CDI device per GPU, each resolvable in the plugin's specs.
async fn check_exporter_claim(env: &Env, node: &str, pod: &Pod, held: &str) -> Result<()> {
    let claim = env.pod_claim(&pod.name_any(), "gpus").await?;
    let uid = claim.uid().unwrap_or_default();
    let results = allocation_results(&claim);
    let mut devices: Vec<&str> = results.iter().map(|r| r.device.as_str()).collect();
    devices.sort();
    ensure!(
        devices == ["gpu-0", "gpu-1"],
        "exporter devices {devices:?}"
    );
    ensure!(
        devices.contains(&held),
        "the held {held} is not in {devices:?}"
    );
    for r in &results {
        ensure!(
            r.admin_access == Some(true),
            "{} without adminAccess: {r:?}",
            r.device
        );
    }
    let want: Vec<String> = devices
        .iter()
        .map(|d| format!("{CDI_KIND}={uid}-{d}"))
        .collect();
    let got = env.cdi_devices_at_runtime(node, pod)?;
    ensure!(
        got == want,
        "exporter CDI at runtime {got:?}, want {want:?}"
    );
    // The claim's spec makes every GPU of the claim visible, the held one included.
    let specs = e2e::cdi::load(&env.node(node).dirs.cdi)?;
    let held_id = format!("{CDI_KIND}={uid}-{held}");
    let published = env.devices(node).await?;
    let uuid = |d: &str| {
        published
            .get(d)
            .and_then(|i| i.string("uuid"))
            .map(str::to_string)
    };
    let mut want_uuids: Vec<String> = devices.iter().filter_map(|d| uuid(d)).collect();
    want_uuids.sort();
    let visible = specs
        .get(&held_id)
        .and_then(|d| d.env_value("NVIDIA_VISIBLE_DEVICES"))
        .with_context(|| format!("{held_id} not in the CDI specs"))?;
    let mut visible: Vec<String> = visible.split(',').map(str::to_string).collect();
    visible.sort();
    ensure!(
        want_uuids.len() == 2 && visible == want_uuids,
        "{held_id}: NVIDIA_VISIBLE_DEVICES={visible:?}, want {want_uuids:?}"
    );
    ensure!(
        env.node(node).kubelet.prepared()?.contains_key(&uid),
        "the kubelet did not prepare the exporter claim"
    );
    Ok(())
}

/// Deletes the GPUCluster while the controller runs (its finalizer needs it), then stops it.
async fn finish(env: &Env, controller: &mut Child) -> Result<()> {
    let alive = controller.try_wait()?.is_none();
    nvidia_api(env, "GPUCluster", "gpuclusters")
        .delete("gpu-cluster", &DeleteParams::default())
        .await?;
    wait_until("GPUCluster gone", WAIT, || async {
        Ok(nvidia_api(env, "GPUCluster", "gpuclusters")
            .get_opt("gpu-cluster")
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    controller.kill().await?;
    ensure!(alive, "dra-controller exited during the scenario");
    Ok(())
}
