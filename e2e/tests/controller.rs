//! The controller (`dra-controller run`) on the real control plane: GPUCluster → DeviceClasses, plugin
//! DaemonSet, RBAC and the ValidatingAdmissionPolicy; the migration pool's one-allocator rule; the
//! CRD's singleton rule; the VAP against the plugin's ServiceAccount; ComputeDomain objects, status and
//! cleanup; the GPU Operator's GPUClusters (accepted whole, left alone until handed over) and the
//! chart's refusal of a foreign GPUCluster CRD.
//!
//! The controller runs as a subprocess (`E2E_CONTROLLER_BIN`, default `target/debug/dra-controller`;
//! build it with `cargo build -p dra-controller`). There is no kubelet and no DaemonSet controller, so
//! DaemonSets stay without pods; daemon pods for ComputeDomain status are made by hand.
//!
//! `cargo test -p e2e --test controller -- --test-threads=1` against a cluster from `e2e/run.sh --up`
//! (with `E2E_KUBECONFIG` and `E2E_WORKDIR` set); without `E2E_KUBECONFIG` every scenario prints SKIP.
//!
//! One file over 600 lines on purpose: each file under e2e/tests is its own test binary linked
//! with kube and k8s-openapi, so scenarios of one kind share a file rather than a binary each.
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result, anyhow, bail};
use e2e::controller::{apply_crd_docs, apply_repo_crds, controller_bin};
use e2e::env::{WAIT, client_from_env, repo_root, wait_until, yaml_docs};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use serde_json::{Value, json};
use tokio::process::{Child, Command};
// `http` through tonic (already a dependency of this crate) for the impersonation headers.
use tonic::codegen::http;

/// The driver namespace the controller is started with.
const NS: &str = "gpu-dra";
const PLUGIN: &str = "gpu-dra-kubelet-plugin";
const POOL_LABEL: &str = "e2e-controller-pool";
const DRA_LABEL: &str = "nvidia.com/gpu.deploy.dra-driver";
const DEVICE_PLUGIN_LABEL: &str = "nvidia.com/gpu.deploy.device-plugin";
const CD_LABEL: &str = "resource.nvidia.com/computeDomain";
const CLASSES: [&str; 5] = [
    "gpu.nvidia.com",
    "mig.nvidia.com",
    "vfio.gpu.nvidia.com",
    "compute-domain-daemon.nvidia.com",
    "compute-domain-default-channel.nvidia.com",
];

fn gvk_api(client: &Client, group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    let _ = client;
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn gpuclusters(client: &Client) -> Api<DynamicObject> {
    let ar = gvk_api(
        client,
        "nvidia.com",
        "v1alpha1",
        "GPUCluster",
        "gpuclusters",
    );
    Api::all_with(client.clone(), &ar)
}

fn computedomains(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = gvk_api(
        client,
        "resource.nvidia.com",
        "v1beta1",
        "ComputeDomain",
        "computedomains",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

fn ssa() -> PatchParams {
    PatchParams::apply("e2e").force()
}

/// One scenario's controller world: CRDs, the driver namespace, a running controller, our nodes.
struct World {
    client: Client,
    kubeconfig: PathBuf,
    test: String,
    log: PathBuf,
    controller: std::sync::Mutex<Option<Child>>,
    nodes: Vec<String>,
    namespaces: Vec<String>,
}

impl World {
    async fn new(test: &str) -> Result<Option<World>> {
        let Some((client, kubeconfig)) = client_from_env().await? else {
            println!(
                "SKIP {test}: E2E_KUBECONFIG is not set; run `bash e2e/run.sh {test}` to start a cluster"
            );
            return Ok(None);
        };
        let work = std::env::var_os("E2E_WORKDIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let w = World {
            client,
            kubeconfig,
            test: test.to_owned(),
            log: work.join(format!("controller-{test}.log")),
            controller: std::sync::Mutex::new(None),
            nodes: Vec::new(),
            namespaces: Vec::new(),
        };
        w.apply_crds().await?;
        let nss: Api<Namespace> = Api::all(w.client.clone());
        nss.patch(
            NS,
            &ssa(),
            &Patch::Apply(
                json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": NS } }),
            ),
        )
        .await?;
        Ok(Some(w))
    }

    /// Server-side applies `deploy/crds/crds.yaml` and waits until each CRD is Established.
    async fn apply_crds(&self) -> Result<()> {
        apply_repo_crds(&self.client, &repo_root()).await
    }

    /// Starts `dra-controller run` with both controllers against the test cluster.
    fn start_controller(&mut self) -> Result<()> {
        let bin = controller_bin(&repo_root())?;
        let log = std::fs::File::create(&self.log)?;
        let child = Command::new(&bin)
            .args([
                "run",
                "--namespace",
                NS,
                "--metrics-addr",
                "127.0.0.1:0",
                "--controllers",
                "gpucluster,computedomain",
                "--identity",
                &self.test,
            ])
            .env("KUBECONFIG", &self.kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("E2E_CONTROLLER_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        *self.controller.lock().unwrap() = Some(child);
        Ok(())
    }

    /// Fails if the controller exited (it must run for the whole scenario).
    fn controller_alive(&self) -> Result<()> {
        if let Some(c) = self.controller.lock().unwrap().as_mut()
            && let Some(status) = c.try_wait()?
        {
            bail!(
                "dra-controller exited ({status}); log: {}",
                self.log.display()
            );
        }
        Ok(())
    }

    /// A Ready node labelled into the pool; `gpus` puts `nvidia.com/gpu` in capacity and allocatable as
    /// the device plugin would.
    async fn node(&mut self, name: &str, gpus: Option<&str>) -> Result<()> {
        let api: Api<Node> = Api::all(self.client.clone());
        if api.get_opt(name).await?.is_some() {
            api.delete(name, &DeleteParams::default()).await?;
            wait_gone(self, &api, name).await?;
        }
        let node: Node = serde_json::from_value(json!({ "metadata": { "name": name, "labels": {
            "kubernetes.io/hostname": name, "e2e-test": self.test, POOL_LABEL: "true",
        } } }))?;
        api.create(&PostParams::default(), &node).await?;
        self.nodes.push(name.to_owned());
        let mut res = json!({ "cpu": "16", "memory": "64Gi", "pods": "110" });
        if let Some(n) = gpus {
            res["nvidia.com/gpu"] = json!(n);
        }
        let status = json!({ "status": { "capacity": res, "allocatable": res,
            "conditions": [{ "type": "Ready", "status": "True", "reason": "E2E", "message": "no kubelet" }] } });
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        Ok(())
    }

    async fn namespace(&mut self, name: &str) -> Result<()> {
        let nss: Api<Namespace> = Api::all(self.client.clone());
        if nss.get_opt(name).await?.is_some() {
            bail!("namespace {name} already exists (left over from an earlier run?)");
        }
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": name } }))?,
        )
        .await?;
        self.namespaces.push(name.to_owned());
        Ok(())
    }

    /// Applies `gpu-cluster` with the pool on our label and compute domains on.
    async fn apply_gpucluster(&self) -> Result<()> {
        self.apply_gpucluster_pool(json!({ "matchLabels": { POOL_LABEL: "true" } }))
            .await
    }

    /// Applies `gpu-cluster` with compute domains on and `selector` as the pool's node selector.
    async fn apply_gpucluster_pool(&self, selector: Value) -> Result<()> {
        let gc = json!({
            "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
            "metadata": { "name": "gpu-cluster" },
            "spec": {
                "draDriver": { "computeDomains": { "enabled": true } },
                "migrationPool": { "nodeSelector": selector },
            },
        });
        gpuclusters(&self.client)
            .patch("gpu-cluster", &ssa(), &Patch::Apply(&gc))
            .await
            .context("applying the GPUCluster")?;
        Ok(())
    }

    /// Waits until the GPUCluster's status satisfies `pred`, returning it.
    async fn gpucluster_status(
        &mut self,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        self.controller_alive()?;
        let api = gpuclusters(&self.client);
        wait_until(what, WAIT, || async {
            self.controller_alive()?;
            let gc = api.get("gpu-cluster").await?;
            let status = gc.data.get("status").cloned().unwrap_or(Value::Null);
            if pred(&status) {
                Ok(Some(status))
            } else {
                Err(anyhow!("status now: {status}"))
            }
        })
        .await
    }

    /// Sets (`Some`) or removes (`None`) one label of a node.
    async fn set_node_label(&self, name: &str, key: &str, value: Option<&str>) -> Result<()> {
        let patch = json!({ "metadata": { "labels": { key: value } } });
        Api::<Node>::all(self.client.clone())
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// Waits until the node's DRA-plugin and device-plugin labels are `dra` and `device_plugin`
    /// (`None`: absent).
    async fn wait_node_labels(
        &self,
        name: &str,
        dra: Option<&str>,
        device_plugin: Option<&str>,
    ) -> Result<()> {
        let what = format!("{name}: {DRA_LABEL}={dra:?}, {DEVICE_PLUGIN_LABEL}={device_plugin:?}");
        wait_until(&what, WAIT, || async {
            self.controller_alive()?;
            let labels = self.node_labels(name).await?;
            let now = (
                labels.get(DRA_LABEL).map(String::as_str),
                labels.get(DEVICE_PLUGIN_LABEL).map(String::as_str),
            );
            if now == (dra, device_plugin) {
                Ok(Some(()))
            } else {
                Err(anyhow!("labels now {now:?}"))
            }
        })
        .await
    }

    async fn node_labels(&self, name: &str) -> Result<std::collections::BTreeMap<String, String>> {
        Ok(Api::<Node>::all(self.client.clone())
            .get(name)
            .await?
            .labels()
            .clone())
    }

    /// Deletes the GPUCluster (its finalizer runs the ordered teardown), our nodes and namespaces, and
    /// stops the controller. Runs whether or not the scenario passed.
    async fn cleanup(self) -> Result<()> {
        let gcs = gpuclusters(&self.client);
        let mut result = Ok(());
        if gcs.get_opt("gpu-cluster").await?.is_some() {
            gcs.delete("gpu-cluster", &DeleteParams::default()).await?;
            result = wait_gone(&self, &gcs, "gpu-cluster")
                .await
                .context("GPUCluster teardown");
            if result.is_err() {
                // Leave no stuck singleton for the next scenario.
                let strip = json!({ "metadata": { "finalizers": null } });
                gcs.patch(
                    "gpu-cluster",
                    &PatchParams::default(),
                    &Patch::Merge(&strip),
                )
                .await
                .ok();
            }
        }
        let child = self.controller.lock().unwrap().take();
        if let Some(mut c) = child {
            c.kill().await.ok();
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        for n in &self.nodes {
            nodes.delete(n, &DeleteParams::default()).await.ok();
        }
        let nss: Api<Namespace> = Api::all(self.client.clone());
        for ns in &self.namespaces {
            nss.delete(ns, &DeleteParams::default()).await.ok();
        }
        result
    }
}

/// Waits for `name` to go; fails early if the controller died.
async fn wait_gone<K>(w: &World, api: &Api<K>, name: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    wait_until(&format!("{name} to be gone"), WAIT, || async {
        w.controller_alive()?;
        Ok(api.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

/// Waits for `name` to exist; fails early if the controller died.
async fn wait_exists<K>(w: &World, api: &Api<K>, name: &str) -> Result<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    wait_until(&format!("{name} to exist"), WAIT, || async {
        w.controller_alive()?;
        Ok(api.get_opt(name).await?)
    })
    .await
}

/// Runs `body`, then `cleanup` whatever happened; on failure prints the controller's log tail.
async fn scenario<F>(test: &str, body: F) -> Result<()>
where
    F: AsyncFnOnce(&mut World) -> Result<()>,
{
    let Some(mut w) = World::new(test).await? else {
        return Ok(());
    };
    let result = body(&mut w).await;
    let log = w.log.clone();
    let cleaned = w.cleanup().await;
    if result.is_err() || cleaned.is_err() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        println!("--- {} (last lines)", log.display());
        for l in tail.into_iter().rev() {
            println!("{l}");
        }
    }
    result?;
    cleaned
}

#[tokio::test]
async fn c1_gpucluster_deploys_classes_plugin_vap_and_keeps_conflicting_nodes_off() -> Result<()> {
    scenario("c1", async |w| {
        w.node("ctl-c1-ready", None).await?;
        w.node("ctl-c1-conflict", Some("4")).await?;
        w.start_controller()?;
        w.apply_gpucluster().await?;
        let c = &w.client.clone();

        // DeviceClasses, applied by the controller and so accepted by the API server's validation.
        let classes: Api<DeviceClass> = Api::all(c.clone());
        // Waits for the controller's own apply: an earlier scenario may have left the same classes
        // applied by another field manager, which the controller takes over.
        for name in CLASSES {
            wait_until(&format!("{name} applied by the controller"), WAIT, || async {
                w.controller_alive()?;
                let class = classes.get_opt(name).await?;
                Ok(class.filter(|c| {
                    c.owner_references().first().map(|o| o.kind.as_str()) == Some("GPUCluster")
                }))
            })
            .await?;
        }
        // NVIDIA's placement of the `nvidia.com/gpu` mapping, and no second class mapping it.
        let gpu = classes.get("gpu.nvidia.com").await?;
        assert_eq!(
            gpu.spec.as_ref().and_then(|s| s.extended_resource_name.as_deref()),
            Some("nvidia.com/gpu")
        );
        assert!(classes.get_opt("migration.gpu.nvidia.com").await?.is_none());

        // The plugin DaemonSet, its RBAC, the VAP and the ComputeDomain controller.
        let ds = wait_exists(w, &Api::<DaemonSet>::namespaced(c.clone(), NS), PLUGIN).await?;
        let pod = ds.spec.template.spec.as_ref().context("pod spec")?;
        assert_eq!(
            pod.node_selector.as_ref().and_then(|s| s.get(DRA_LABEL)).map(String::as_str),
            Some("true")
        );
        let container = &pod.containers[0];
        assert_eq!(container.args.as_deref(), Some(&["run".to_owned()][..]));
        wait_exists(w, &Api::<ServiceAccount>::namespaced(c.clone(), NS), PLUGIN).await?;
        wait_exists(w, &Api::<ClusterRole>::all(c.clone()), PLUGIN).await?;
        wait_exists(w, &Api::<ClusterRoleBinding>::all(c.clone()), PLUGIN).await?;
        let vap_name = "gpu-dra-resourceslices-own-node";
        wait_exists(w, &Api::<ValidatingAdmissionPolicy>::all(c.clone()), vap_name).await?;
        wait_exists(w, &Api::<ValidatingAdmissionPolicyBinding>::all(c.clone()), vap_name).await?;
        wait_exists(w, &Api::<Deployment>::namespaced(c.clone(), NS),
            "compute-domain-controller",
        )
        .await?;

        // The pool: two nodes, one placed, one in conflict with a condition saying so.
        let status = w
            .gpucluster_status("pool 2 / ready 1 / conflict on ctl-c1-conflict", |s| {
                s["poolNodes"] == 2
                    && s["readyNodes"] == 1
                    && s["conflictingNodes"] == json!(["ctl-c1-conflict"])
            })
            .await?;
        let conflict = status["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "PoolConflict"))
            .cloned()
            .context("PoolConflict condition")?;
        assert_eq!(conflict["status"], "True", "{conflict}");
        assert!(
            conflict["message"].as_str().unwrap_or_default().contains("ctl-c1-conflict"),
            "{conflict}"
        );
        println!("c1: status {status}");

        let ready = w.node_labels("ctl-c1-ready").await?;
        assert_eq!(ready.get(DRA_LABEL).map(String::as_str), Some("true"));
        assert_eq!(ready.get(DEVICE_PLUGIN_LABEL).map(String::as_str), Some("false"));
        let conflicting = w.node_labels("ctl-c1-conflict").await?;
        assert_eq!(conflicting.get(DRA_LABEL), None, "no plugin while it advertises nvidia.com/gpu");
        assert_eq!(
            conflicting.get(DEVICE_PLUGIN_LABEL).map(String::as_str),
            Some("false"),
            "the device plugin is told to go"
        );

        // The device plugin is gone: the node stops advertising, the plugin follows.
        let gone = json!({ "status": { "capacity": { "nvidia.com/gpu": null }, "allocatable": { "nvidia.com/gpu": null } } });
        Api::<Node>::all(c.clone())
            .patch_status("ctl-c1-conflict", &PatchParams::default(), &Patch::Merge(&gone))
            .await?;
        w.gpucluster_status("conflict cleared, both nodes ready", |s| {
            s["readyNodes"] == 2 && s["conflictingNodes"].is_null()
        })
        .await?;
        let nodes: Api<Node> = Api::all(c.clone());
        wait_until("ctl-c1-conflict labelled for the plugin", WAIT, || async {
            let n = nodes.get("ctl-c1-conflict").await?;
            Ok((n.labels().get(DRA_LABEL).map(String::as_str) == Some("true")).then_some(()))
        })
        .await?;
        println!("c1: conflict cleared, ctl-c1-conflict labelled {DRA_LABEL}=true");
        Ok(())
    })
    .await
}

#[tokio::test]
async fn c2_second_gpucluster_name_is_rejected_by_the_crd() -> Result<()> {
    scenario("c2", async |w| {
        let gc = json!({
            "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
            "metadata": { "name": "gpu-cluster-2" }, "spec": { "draDriver": {} },
        });
        let err = gpuclusters(&w.client)
            .create(&PostParams::default(), &serde_json::from_value(gc)?)
            .await
            .err()
            .context("gpu-cluster-2 was accepted")?;
        match err {
            kube::Error::Api(s) => {
                assert_eq!(s.code, 422, "{s:?}");
                assert!(
                    s.message.contains("must be named gpu-cluster"),
                    "{}",
                    s.message
                );
                println!("c2: rejected: {}", s.message);
            }
            other => bail!("unexpected error {other}"),
        }
        Ok(())
    })
    .await
}

/// A client that is the plugin's ServiceAccount with a token bound to `node` (as a pod's token would
/// be), by impersonation through the admin credential.
async fn plugin_client(kubeconfig: &Path, node: &str) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let mut cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    let h = |s: &str| {
        s.parse::<http::HeaderName>()
            .map_err(|e| anyhow!("{s}: {e}"))
    };
    let v = |s: &str| {
        s.parse::<http::HeaderValue>()
            .map_err(|e| anyhow!("{s}: {e}"))
    };
    cfg.headers.extend([
        (
            h("Impersonate-User")?,
            v(&format!("system:serviceaccount:{NS}:{PLUGIN}"))?,
        ),
        (h("Impersonate-Group")?, v("system:serviceaccounts")?),
        (
            h("Impersonate-Group")?,
            v(&format!("system:serviceaccounts:{NS}"))?,
        ),
        (h("Impersonate-Group")?, v("system:authenticated")?),
        (
            h("Impersonate-Extra-authentication.kubernetes.io%2fnode-name")?,
            v(node)?,
        ),
    ]);
    Ok(Client::try_from(cfg)?)
}

fn slice(name: &str, node: &str) -> Result<ResourceSlice> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": { "name": name },
        "spec": {
            "driver": "gpu.nvidia.com", "nodeName": node,
            "pool": { "name": node, "generation": 1, "resourceSliceCount": 1 },
            "devices": [{ "name": "gpu-0", "attributes": { "type": { "string": "gpu" } } }],
        },
    }))?)
}

#[tokio::test]
async fn c3_vap_confines_the_plugin_service_account_to_its_node() -> Result<()> {
    scenario("c3", async |w| {
        w.node("ctl-c3-a", None).await?;
        w.node("ctl-c3-b", None).await?;
        w.start_controller()?;
        w.apply_gpucluster().await?;
        let c = w.client.clone();
        let vap = "gpu-dra-resourceslices-own-node";
        wait_exists(
            w,
            &Api::<ValidatingAdmissionPolicyBinding>::all(c.clone()),
            vap,
        )
        .await?;
        wait_exists(w, &Api::<ClusterRoleBinding>::all(c.clone()), PLUGIN).await?;

        let as_plugin: Api<ResourceSlice> =
            Api::all(plugin_client(&w.kubeconfig, "ctl-c3-a").await?);
        // Its own node: allowed (RBAC and impersonation work). The policy is compiled and its binding
        // observed asynchronously by the API server, so the denial below is polled for.
        let own = slice("ctl-c3-a-gpu", "ctl-c3-a")?;
        as_plugin
            .create(&PostParams::default(), &own)
            .await
            .context("the plugin writing its own node's slice")?;
        let other = slice("ctl-c3-b-gpu", "ctl-c3-b")?;
        let denied = wait_until("the VAP to deny a slice of another node", WAIT, || async {
            match as_plugin.create(&PostParams::default(), &other).await {
                Err(kube::Error::Api(s))
                    if s.message.contains(vap)
                        || s.message.contains("may only write ResourceSlices") =>
                {
                    Ok(Some(s))
                }
                Err(e) => Err(anyhow!("unexpected error: {e}")),
                Ok(_) => {
                    // Admitted before the policy was active: take it back and try again.
                    Api::<ResourceSlice>::all(c.clone())
                        .delete("ctl-c3-b-gpu", &DeleteParams::default())
                        .await?;
                    Ok(None)
                }
            }
        })
        .await?;
        assert_eq!(
            denied.code, 422,
            "a policy denial without a reason is Invalid: {denied:?}"
        );
        assert!(denied.message.contains("ctl-c3-b"), "{}", denied.message);
        println!("c3: denied: {}", denied.message);
        // Deleting its own slice is allowed; the admin may still write any slice.
        as_plugin
            .delete("ctl-c3-a-gpu", &DeleteParams::default())
            .await
            .context("the plugin deleting its own node's slice")?;
        let admin: Api<ResourceSlice> = Api::all(c.clone());
        admin.create(&PostParams::default(), &other).await?;
        admin
            .delete("ctl-c3-b-gpu", &DeleteParams::default())
            .await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn c4_computedomain_objects_status_and_cleanup() -> Result<()> {
    scenario("c4", async |w| {
        w.node("ctl-c4-a", None).await?;
        w.namespace("ctl-c4").await?;
        w.start_controller()?;
        let c = w.client.clone();
        let cds = computedomains(&c, "ctl-c4");
        let cd = json!({
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
            "metadata": { "name": "cd1", "namespace": "ctl-c4" },
            "spec": { "numNodes": 1, "channel": { "resourceClaimTemplate": { "name": "cd1-channel" } } },
        });
        let created = cds
            .create(&PostParams::default(), &serde_json::from_value(cd)?)
            .await?;
        let uid = created.uid().context("uid")?;
        let daemon = format!("compute-domain-daemon-{uid}");

        // The spec is immutable.
        let change = json!({ "spec": { "numNodes": 2 } });
        let err = cds
            .patch("cd1", &PatchParams::default(), &Patch::Merge(&change))
            .await
            .err()
            .context("a spec change was accepted")?;
        assert!(err.to_string().contains("immutable"), "{err}");

        let workload: Api<ResourceClaimTemplate> = Api::namespaced(c.clone(), "ctl-c4");
        let rct = wait_exists(w, &workload, "cd1-channel").await?;
        let rct_json = serde_json::to_value(&rct)?;
        let devices = &rct_json["spec"]["spec"]["devices"];
        assert_eq!(
            devices["requests"][0]["exactly"]["deviceClassName"],
            "compute-domain-default-channel.nvidia.com"
        );
        assert_eq!(
            devices["config"][0]["opaque"]["parameters"],
            json!({ "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig",
                    "domainID": uid, "allocationMode": "Single" })
        );
        let daemon_rcts: Api<ResourceClaimTemplate> = Api::namespaced(c.clone(), NS);
        wait_exists(w, &daemon_rcts, &daemon).await?;
        let daemonsets: Api<DaemonSet> = Api::namespaced(c.clone(), NS);
        wait_exists(w, &daemonsets, &daemon).await?;
        let finalized = cds.get("cd1").await?;
        assert!(
            finalized.finalizers().iter().any(|f| f == CD_LABEL),
            "{:?}",
            finalized.finalizers()
        );

        // Status: no daemon yet → NotReady; a ready daemon pod on the node → Ready with that node.
        let status_of = |want: &'static str| {
            let cds = cds.clone();
            async move {
                wait_until(&format!("ComputeDomain status {want}"), WAIT, || async {
                    let cd = cds.get("cd1").await?;
                    let s = cd.data.get("status").cloned().unwrap_or(Value::Null);
                    Ok((s["status"] == want).then_some(s))
                })
                .await
            }
        };
        status_of("NotReady").await?;
        // What the compute-domain plugin does while preparing a channel on the node.
        let nodes: Api<Node> = Api::all(c.clone());
        let label = json!({ "metadata": { "labels": { CD_LABEL: uid } } });
        nodes
            .patch("ctl-c4-a", &PatchParams::default(), &Patch::Merge(&label))
            .await?;
        // What the DaemonSet controller and the kubelet would do: a daemon pod there, then Ready.
        let ds = daemonsets.get(&daemon).await?;
        let template = serde_json::to_value(&ds.spec.template)?;
        let pod = json!({
            "metadata": { "name": "daemon-ctl-c4-a", "namespace": NS,
                          "labels": template["metadata"]["labels"], "annotations": template["metadata"]["annotations"] },
            "spec": { "nodeName": "ctl-c4-a", "containers": [{ "name": "imex-daemon", "image": "e2e/none" }] },
        });
        let pods: Api<Pod> = Api::namespaced(c.clone(), NS);
        pods.create(&PostParams::default(), &serde_json::from_value(pod)?)
            .await?;
        let ready = json!({ "status": { "phase": "Running", "podIP": "10.9.0.1",
            "conditions": [{ "type": "Ready", "status": "True" }] } });
        pods.patch_status("daemon-ctl-c4-a", &PatchParams::default(), &Patch::Merge(&ready))
            .await?;
        let status = status_of("Ready").await?;
        assert_eq!(
            status["nodes"],
            // NVIDIA's default gates: a daemon without an NVLink clique is listed with index -1.
            json!([{ "name": "ctl-c4-a", "ipAddress": "10.9.0.1", "cliqueID": "", "index": -1, "status": "Ready" }])
        );
        println!("c4: status {status}");

        // Delete: everything goes, then the domain.
        cds.delete("cd1", &DeleteParams::default()).await?;
        wait_gone(w, &cds, "cd1").await?;
        for (what, gone) in [
            ("workload template", workload.get_opt("cd1-channel").await?.is_none()),
            ("daemon template", daemon_rcts.get_opt(&daemon).await?.is_none()),
            ("daemon DaemonSet", daemonsets.get_opt(&daemon).await?.is_none()),
            ("node label", !nodes.get("ctl-c4-a").await?.labels().contains_key(CD_LABEL)),
        ] {
            assert!(gone, "{what} left after the ComputeDomain was deleted");
        }
        println!("c4: deleted; templates, DaemonSet and node label gone");
        pods.delete("daemon-ctl-c4-a", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
            .await?;
        Ok(())
    })
    .await
}

/// The helm binary: `E2E_HELM_BIN`, or what `deploy/helm/build-helm.sh` builds (or finds cached) from
/// the Go module proxy.
async fn helm_bin() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("E2E_HELM_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let script = repo_root().join("deploy/helm/build-helm.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .await
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    let stdout = String::from_utf8(out.stdout)?;
    let bin = stdout
        .lines()
        .last()
        .map(PathBuf::from)
        .context("build-helm.sh printed no path")?;
    if !bin.exists() {
        bail!(
            "build-helm.sh printed {}, which does not exist",
            bin.display()
        );
    }
    Ok(bin)
}

/// `helm template` of the chart into namespace `NS` with `--set` values, as parsed documents.
async fn helm_template(helm: &Path, sets: &[&str]) -> Result<Vec<Value>> {
    let chart = repo_root().join("deploy/helm/gpu-dra-driver");
    let mut cmd = Command::new(helm);
    cmd.args(["template", "gpu-dra"])
        .arg(&chart)
        .args(["--namespace", NS, "--include-crds"]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().await.context("running helm template")?;
    if !out.status.success() {
        bail!(
            "helm template {sets:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    yaml_docs(&String::from_utf8(out.stdout)?)
}

fn kind_name(doc: &Value) -> String {
    format!(
        "{}/{}",
        doc["kind"].as_str().unwrap_or("?"),
        doc["metadata"]["name"].as_str().unwrap_or("?")
    )
}

#[tokio::test]
async fn c5_helm_chart_renders_and_passes_server_dry_run() -> Result<()> {
    scenario("c5", async |w| {
        let helm = helm_bin().await?;
        let version = Command::new(&helm)
            .args(["version", "--template", "{{.Version}}"])
            .output()
            .await?;
        println!(
            "c5: {} {}",
            helm.display(),
            String::from_utf8_lossy(&version.stdout)
        );

        // Without the CR (the default) the chart has no GPUCluster.
        let plain = helm_template(&helm, &[]).await?;
        assert!(
            !plain.iter().any(|d| d["kind"] == "GPUCluster"),
            "GPUCluster rendered with deployCR=false"
        );

        let docs = helm_template(&helm, &["gpuCluster.deployCR=true"]).await?;
        let mut rendered: Vec<String> = docs.iter().map(kind_name).collect();
        rendered.sort();
        assert_eq!(
            rendered,
            [
                "ClusterRole/gpu-dra-controller",
                "ClusterRoleBinding/gpu-dra-controller",
                "CustomResourceDefinition/computedomaincliques.resource.nvidia.com",
                "CustomResourceDefinition/computedomains.resource.nvidia.com",
                "CustomResourceDefinition/gpuclusters.nvidia.com",
                "CustomResourceDefinition/miglayouts.nvidia.com",
                "Deployment/gpu-dra-controller",
                "GPUCluster/gpu-cluster",
                "Service/gpu-dra-controller-metrics",
                "ServiceAccount/gpu-dra-controller",
            ],
            "objects rendered by the chart"
        );
        let gc = docs
            .iter()
            .find(|d| d["kind"] == "GPUCluster")
            .context("GPUCluster")?;
        assert_eq!(
            gc["spec"]["draDriver"]["version"], "v0.1.0",
            "the CR's driver version defaults to the chart's appVersion: {gc}"
        );

        // The chart's CRDs for real (the GPUCluster needs its schema), then everything else dry-run.
        let (crds, objects): (Vec<Value>, Vec<Value>) = docs
            .into_iter()
            .partition(|d| d["kind"] == "CustomResourceDefinition");
        apply_crd_docs(&w.client, crds).await?;
        let discovery = wait_until("discovery to serve nvidia.com GPUCluster", WAIT, || async {
            let d = kube::Discovery::new(w.client.clone()).run().await?;
            let gvk = GroupVersionKind::gvk("nvidia.com", "v1alpha1", "GPUCluster");
            Ok(d.resolve_gvk(&gvk).is_some().then_some(d))
        })
        .await?;
        for obj in &objects {
            e2e::env::dry_run_create(&w.client, &discovery, obj, NS)
                .await
                .with_context(|| format!("server-side dry-run of {}", kind_name(obj)))?;
        }
        println!("c5: {} objects passed server-side dry-run", objects.len());
        // Dry-run leaves nothing behind.
        let deployments: Api<Deployment> = Api::namespaced(w.client.clone(), NS);
        assert!(deployments.get_opt("gpu-dra-controller").await?.is_none());
        if let Some(gc) = gpuclusters(&w.client).get_opt("gpu-cluster").await? {
            assert!(
                gc.managed_fields()
                    .iter()
                    .all(|m| m.manager.as_deref() != Some("e2e-validate")),
                "a dry-run wrote the GPUCluster"
            );
        }

        // The check can fail: the same path rejects what the API server finds invalid.
        let mut broken = objects
            .iter()
            .find(|d| d["kind"] == "Deployment")
            .cloned()
            .context("Deployment")?;
        broken["spec"]["replicas"] = json!(-1);
        let err = e2e::env::dry_run_create(&w.client, &discovery, &broken, NS)
            .await
            .err()
            .context("a Deployment with replicas -1 passed dry-run")?;
        assert!(format!("{err:#}").contains("replicas"), "{err:#}");
        Ok(())
    })
    .await
}

#[tokio::test]
async fn c6_relabelling_moves_the_pool_and_claims_hold_a_leaving_node() -> Result<()> {
    scenario("c6", async |w| {
        w.node("ctl-c6-a", None).await?;
        w.node("ctl-c6-b", None).await?;
        w.set_node_label("ctl-c6-b", POOL_LABEL, None).await?;
        w.namespace("ctl-c6").await?;
        w.start_controller()?;
        w.apply_gpucluster().await?;

        // Only a matches the pool's selector.
        w.wait_node_labels("ctl-c6-a", Some("true"), Some("false")).await?;
        w.wait_node_labels("ctl-c6-b", None, None).await?;
        w.gpucluster_status("pool 1 / ready 1", |s| {
            s["poolNodes"] == 1 && s["readyNodes"] == 1
        })
        .await?;

        // Relabel the nodes: the pool moves from a to b; a gets the device plugin back (no plugin pod
        // and no claims there, so nothing holds it).
        w.set_node_label("ctl-c6-b", POOL_LABEL, Some("true")).await?;
        w.set_node_label("ctl-c6-a", POOL_LABEL, None).await?;
        w.wait_node_labels("ctl-c6-b", Some("true"), Some("false")).await?;
        w.wait_node_labels("ctl-c6-a", None, None).await?;
        println!("c6: node relabelled, pool moved a -> b");

        // Change the GPUCluster's selector instead: back to a by hostname.
        w.apply_gpucluster_pool(json!({ "matchLabels": { "kubernetes.io/hostname": "ctl-c6-a" } }))
            .await?;
        w.wait_node_labels("ctl-c6-a", Some("true"), Some("false")).await?;
        w.wait_node_labels("ctl-c6-b", None, None).await?;
        w.gpucluster_status("pool 1 / ready 1 after the selector change", |s| {
            s["poolNodes"] == 1 && s["readyNodes"] == 1 && s["drainingNodes"].is_null()
        })
        .await?;
        println!("c6: selector changed, pool moved b -> a");

        // A claim allocated on a (as the scheduler would write it): a leaves the pool but keeps the
        // plugin, listed as draining, until the claim is gone.
        let claims: Api<ResourceClaim> = Api::namespaced(w.client.clone(), "ctl-c6");
        let claim = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": { "name": "held", "namespace": "ctl-c6" },
            "spec": { "devices": { "requests": [
                { "name": "gpu", "exactly": { "deviceClassName": "gpu.nvidia.com" } } ] } },
        });
        claims
            .create(&PostParams::default(), &serde_json::from_value(claim)?)
            .await?;
        let allocation = json!({ "status": { "allocation": { "devices": { "results": [
            { "request": "gpu", "driver": "gpu.nvidia.com", "pool": "ctl-c6-a", "device": "gpu-0" } ] } } } });
        claims
            .patch_status("held", &PatchParams::default(), &Patch::Merge(&allocation))
            .await?;
        w.apply_gpucluster_pool(json!({ "matchLabels": { "kubernetes.io/hostname": "ctl-c6-b" } }))
            .await?;
        w.wait_node_labels("ctl-c6-b", Some("true"), Some("false")).await?;
        let status = w
            .gpucluster_status("ctl-c6-a draining", |s| {
                s["drainingNodes"] == json!(["ctl-c6-a"]) && s["poolNodes"] == 1
            })
            .await?;
        println!("c6: a draining while a claim is allocated there: {status}");
        let held = w.node_labels("ctl-c6-a").await?;
        assert_eq!(
            held.get(DRA_LABEL).map(String::as_str),
            Some("true"),
            "the plugin must stay to unprepare the claim"
        );
        assert_eq!(held.get(DEVICE_PLUGIN_LABEL).map(String::as_str), Some("false"));

        claims.delete("held", &DeleteParams::default()).await?;
        w.wait_node_labels("ctl-c6-a", None, None).await?;
        w.gpucluster_status("nothing draining once the claim is gone", |s| {
            s["drainingNodes"].is_null() && s["poolNodes"] == 1 && s["readyNodes"] == 1
        })
        .await?;
        println!("c6: claim gone, a released");
        Ok(())
    })
    .await
}

/// The GPU Operator's GPUClusters (`dra-controller/tests/operator/gpuclusters.yaml`), without status.
fn operator_gpuclusters() -> Result<Vec<Value>> {
    let path = repo_root().join("dra-controller/tests/operator/gpuclusters.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let mut docs = yaml_docs(&text)?;
    for d in &mut docs {
        d.as_object_mut().context("object")?.remove("status");
    }
    Ok(docs)
}

/// Every field of `sub` is in `sup` with the same value (`sup` may have more: defaults).
fn subset(sub: &Value, sup: &Value) -> bool {
    match (sub, sup) {
        (Value::Object(a), Value::Object(b)) => a
            .iter()
            .all(|(k, v)| b.get(k).is_some_and(|w| subset(v, w))),
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(v, w)| subset(v, w))
        }
        _ => sub == sup,
    }
}

/// `helm template --dry-run=server` against the test cluster, so the chart's `lookup` runs.
async fn helm_server_template(helm: &Path, kubeconfig: &Path, sets: &[&str]) -> Result<String> {
    let chart = repo_root().join("deploy/helm/gpu-dra-driver");
    let mut cmd = Command::new(helm);
    cmd.args(["template", "gpu-dra"])
        .arg(&chart)
        .args(["--namespace", NS, "--dry-run=server", "--kubeconfig"])
        .arg(kubeconfig);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().await.context("running helm template")?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(String::new())
    } else {
        Ok(stderr)
    }
}

#[tokio::test]
async fn c7_gpu_operator_gpuclusters_are_accepted_and_left_alone_until_handed_over() -> Result<()> {
    scenario("c7", async |w| {
        // Every operator object passes our CRD on the real API server and keeps every field.
        for (i, gc) in operator_gpuclusters()?.iter().enumerate() {
            let stored = gpuclusters(&w.client)
                .create(
                    &PostParams {
                        dry_run: true,
                        ..Default::default()
                    },
                    &serde_json::from_value(gc.clone())?,
                )
                .await
                .with_context(|| format!("operator GPUCluster {} refused", i + 1))?;
            let stored = serde_json::to_value(&stored)?;
            let spec = gc.get("spec").cloned().unwrap_or_else(|| json!({}));
            if !subset(&spec, &stored["spec"]) {
                bail!(
                    "operator GPUCluster {}: fields lost: sent {spec}, stored {}",
                    i + 1,
                    stored["spec"]
                );
            }
        }
        println!("c7: every operator GPUCluster accepted without loss (server dry-run)");

        // The operator's chart default, written by the operator's field manager with its finalizer.
        w.node("ctl-c7-a", None).await?;
        let mut gc = operator_gpuclusters()?[2].clone();
        gc["metadata"]["finalizers"] = json!([gpu_dra_api::names::GPUCLUSTER_FINALIZER]);
        gc["spec"]["migrationPool"] =
            json!({ "nodeSelector": { "matchLabels": { POOL_LABEL: "true" } } });
        gpuclusters(&w.client)
            .patch(
                "gpu-cluster",
                &PatchParams::apply("gpu-operator").force(),
                &Patch::Apply(&gc),
            )
            .await
            .context("applying as gpu-operator")?;
        w.start_controller()?;
        let status = w
            .gpucluster_status("ControllerConflict=True", |s| {
                conditions(s).any(|c| c["type"] == "ControllerConflict" && c["status"] == "True")
            })
            .await?;
        let c = conditions(&status)
            .find(|c| c["type"] == "ControllerConflict")
            .cloned()
            .unwrap_or_default();
        assert_eq!(c["reason"], "GPUOperatorManaged", "{c}");
        println!("c7: stands by: {}", c["message"]);
        // Left alone: no plugin DaemonSet, node labels untouched.
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        let daemonsets: Api<DaemonSet> = Api::namespaced(w.client.clone(), NS);
        assert!(
            daemonsets.get_opt(PLUGIN).await?.is_none(),
            "plugin deployed while standing by"
        );
        assert!(!w.node_labels("ctl-c7-a").await?.contains_key(DRA_LABEL));
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(w.client.clone(), "default");
        let warned = events
            .list(&Default::default())
            .await?
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("GPUOperatorManaged")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("gpu-cluster")
            });
        assert!(warned, "no Warning Event");

        // Handed over by annotation: reconciles, and the condition goes.
        let ann = json!({ "metadata": { "annotations": {
            gpu_dra_api::names::GPUCLUSTER_CONTROLLER_ANNOTATION: "gpu-dra-controller" } } });
        gpuclusters(&w.client)
            .patch("gpu-cluster", &PatchParams::default(), &Patch::Merge(&ann))
            .await?;
        wait_exists(w, &daemonsets, PLUGIN).await?;
        w.wait_node_labels("ctl-c7-a", Some("true"), Some("false"))
            .await?;
        w.gpucluster_status("ControllerConflict gone", |s| {
            !conditions(s).any(|c| c["type"] == "ControllerConflict")
        })
        .await?;
        println!("c7: reconciles after the annotation");

        // The chart refuses a gpuclusters CRD that is not ours, and accepts ours.
        let helm = helm_bin().await?;
        let ok = helm_server_template(&helm, &w.kubeconfig, &[]).await?;
        assert!(ok.is_empty(), "with our CRD: {ok}");
        let crds: Api<CustomResourceDefinition> = Api::all(w.client.clone());
        let unlabel = json!({ "metadata": { "labels": { "app.kubernetes.io/part-of": null } } });
        crds.patch(
            "gpuclusters.nvidia.com",
            &PatchParams::default(),
            &Patch::Merge(&unlabel),
        )
        .await?;
        let refused = helm_server_template(&helm, &w.kubeconfig, &[]).await;
        let forced =
            helm_server_template(&helm, &w.kubeconfig, &["crds.checkExisting=false"]).await;
        w.apply_crds().await?;
        let refused = refused?;
        assert!(
            refused.contains("is not gpu-dra-driver's"),
            "helm did not refuse: {refused}"
        );
        assert!(forced?.is_empty(), "crds.checkExisting=false still refused");
        println!(
            "c7: helm refuses a foreign CRD: {}",
            refused
                .lines()
                .find(|l| l.contains("not gpu-dra-driver's"))
                .unwrap_or_default()
        );
        Ok(())
    })
    .await
}

fn conditions(status: &Value) -> impl Iterator<Item = &Value> {
    status["conditions"].as_array().into_iter().flatten()
}
