//! One scenario's world: a namespace, Node objects with a plugin and a kubelet each, and helpers to
//! create and observe objects on the real control plane started by `e2e/run.sh`.
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::{ApiResource, Discovery, Scope};
use kube::{Client, Config, ResourceExt};
use serde_json::json;

use crate::node_kubelet::NodeKubelet;
use crate::plugin::{NodeDirs, Plugin};
use crate::real_kubelet::KubeletSetup;

/// How long a scenario waits for anything the cluster should do on its own (not a timing assertion:
/// a generous bound so a broken run ends instead of hanging).
pub const WAIT: Duration = Duration::from_secs(180);

/// A node: its Node object, its plugin process and whoever plays its kubelet.
pub struct NodeEnv {
    pub name: String,
    pub plugin: Plugin,
    pub kubelet: NodeKubelet,
    pub dirs: NodeDirs,
    /// Plugins of other drivers on the node (`Env::add_plugin`).
    pub more_plugins: Vec<Plugin>,
}

pub struct Env {
    pub client: Client,
    pub ns: String,
    pub test: String,
    pub work: PathBuf,
    pub repo: PathBuf,
    pub kubeconfig: PathBuf,
    pub plugin_bin: PathBuf,
    pub nodes: Vec<NodeEnv>,
    kubelet_setup: Option<KubeletSetup>,
    started: Instant,
}

fn init_tracing() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("E2E_LOG")
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,e2e=info")),
            )
            .with_test_writer()
            .with_ansi(false)
            .try_init();
    });
}

/// A client for the cluster in `E2E_KUBECONFIG`, or `None` (the scenario is skipped) when unset.
pub async fn client_from_env() -> Result<Option<(Client, PathBuf)>> {
    let Some(path) = std::env::var_os("E2E_KUBECONFIG").map(PathBuf::from) else {
        return Ok(None);
    };
    let kc = Kubeconfig::read_from(&path).with_context(|| format!("reading {}", path.display()))?;
    let cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Some((Client::try_from(cfg)?, path)))
}

/// Polls `f` until it returns `Some`, failing with `what` and the last observation after `timeout`.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last = String::from("(no error)");
    loop {
        match f().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}; last error: {last}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Parses a multi-document YAML file into JSON values (empty documents dropped).
pub fn yaml_docs(text: &str) -> Result<Vec<serde_json::Value>> {
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let v: serde_json::Value = serde::Deserialize::deserialize(doc)?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// A published device: attributes (the driver's domain prefix stripped) as JSON
/// (`{"string": ..}`, `{"version": ..}`, ...) and capacities in base units.
#[derive(Debug, Clone, Default)]
pub struct DeviceInfo {
    pub attributes: BTreeMap<String, serde_json::Value>,
    pub capacity: BTreeMap<String, u128>,
}

impl DeviceInfo {
    pub fn string(&self, attr: &str) -> Option<&str> {
        self.attributes
            .get(attr)
            .and_then(|v| v.get("string"))
            .and_then(|v| v.as_str())
    }

    pub fn version(&self, attr: &str) -> Option<&str> {
        self.attributes
            .get(attr)
            .and_then(|v| v.get("version"))
            .and_then(|v| v.as_str())
    }
}

/// A pod's reference to a claim: `(name in pod, template name)`.
mod nodes;

pub struct PodClaim<'a> {
    pub name: &'a str,
    pub template: &'a str,
}

/// The repository the scenarios read manifests and binaries from: `E2E_REPO_ROOT`, else this
/// checkout.
pub fn repo_root() -> PathBuf {
    std::env::var_os("E2E_REPO_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
}

impl Env {
    /// Sets up a scenario, or returns `None` (and says so) when no cluster is configured.
    pub async fn new(test: &str) -> Result<Option<Env>> {
        init_tracing();
        let Some((client, kubeconfig)) = client_from_env().await? else {
            println!(
                "SKIP {test}: E2E_KUBECONFIG is not set; run `bash e2e/run.sh {test}` to start a cluster"
            );
            return Ok(None);
        };
        let repo = repo_root();
        let work = std::env::var_os("E2E_WORKDIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| std::env::temp_dir().join("gpu-dra-e2e-work"));
        let plugin_bin = std::env::var_os("E2E_PLUGIN_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo.join("target/debug/dra-plugin"));
        let ns = test.replace('_', "-");
        let kubelet_setup = KubeletSetup::from_env(&repo, &kubeconfig);
        let env = Env {
            client,
            ns: ns.clone(),
            test: test.to_string(),
            work,
            repo,
            kubeconfig,
            plugin_bin,
            nodes: Vec::new(),
            kubelet_setup,
            started: Instant::now(),
        };
        let nss: Api<Namespace> = Api::all(env.client.clone());
        if let Some(existing) = nss.get_opt(&ns).await? {
            if existing.metadata.deletion_timestamp.is_none() {
                bail!(
                    "namespace {ns} already exists (left over from a failed run on this cluster?)"
                );
            }
            // The same scenario ran just before on a kept cluster; its namespace is still going.
            wait_until(&format!("namespace {ns} deleted"), WAIT, || async {
                Ok(nss.get_opt(&ns).await?.is_none().then_some(()))
            })
            .await?;
        }
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
        env.apply_deviceclasses().await?;
        Ok(Some(env))
    }

    /// Server-side applies every DeviceClass in `deviceclasses/`.
    pub async fn apply_deviceclasses(&self) -> Result<()> {
        let ar = ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("resource.k8s.io", "v1", "DeviceClass"),
            "deviceclasses",
        );
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar);
        for f in yaml_files(&self.repo.join("deviceclasses"))? {
            for doc in yaml_docs(&std::fs::read_to_string(&f)?)? {
                let name = doc["metadata"]["name"]
                    .as_str()
                    .context("DeviceClass without name")?
                    .to_string();
                api.patch(
                    &name,
                    &PatchParams::apply("e2e").force(),
                    &Patch::Apply(&doc),
                )
                .await
                .with_context(|| format!("applying {}", f.display()))?;
            }
        }
        Ok(())
    }

    pub fn node(&self, name: &str) -> &NodeEnv {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .expect("node of this scenario")
    }

    /// The CDI devices the runtime got for `pod`'s containers on `node` (CreateContainer calls
    /// that succeeded), sorted and without repeats.
    pub fn cdi_devices_at_runtime(&self, node: &str, pod: &Pod) -> Result<Vec<String>> {
        let uid = pod.uid().unwrap_or_default();
        let mut ids: Vec<String> = self
            .node(node)
            .kubelet
            .stock()
            .context("a stock kubelet node")?
            .containers()?
            .into_iter()
            .filter(|c| c.pod_uid == uid && c.error.is_empty())
            .flat_map(|c| c.cdi_devices)
            .collect();
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    pub fn node_mut(&mut self, name: &str) -> &mut NodeEnv {
        self.nodes
            .iter_mut()
            .find(|n| n.name == name)
            .expect("node of this scenario")
    }

    /// The ResourceSlices of `node` (field selector on spec.nodeName).
    pub async fn slices(&self, node: &str) -> Result<Vec<ResourceSlice>> {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        Ok(api
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await?
            .items)
    }

    /// Waits until the node's pool is complete: slices present, all of the newest generation, as
    /// many as `resourceSliceCount` says.
    pub async fn wait_slices(&self, node: &str) -> Result<Vec<ResourceSlice>> {
        wait_until(&format!("ResourceSlices of {node}"), WAIT, || async {
            let slices = self.slices(node).await?;
            let Some(generation) = slices.iter().map(|s| s.spec.pool.generation).max() else {
                return Ok(None);
            };
            let current: Vec<ResourceSlice> = slices
                .into_iter()
                .filter(|s| s.spec.pool.generation == generation)
                .collect();
            let want = current[0].spec.pool.resource_slice_count;
            Ok((i64::try_from(current.len()) == Ok(want)).then_some(current))
        })
        .await
    }

    /// The node's published devices by name.
    pub async fn devices(&self, node: &str) -> Result<BTreeMap<String, DeviceInfo>> {
        let mut out = BTreeMap::new();
        for s in self.wait_slices(node).await? {
            for d in s.spec.devices.unwrap_or_default() {
                let mut info = DeviceInfo::default();
                let unqualified = |k: &str| {
                    k.strip_prefix(crate::DRIVER)
                        .and_then(|k| k.strip_prefix('/'))
                        .unwrap_or(k)
                        .to_string()
                };
                for (k, v) in d.attributes.unwrap_or_default() {
                    let key = unqualified(&k);
                    info.attributes.insert(key, serde_json::to_value(v)?);
                }
                for (k, v) in d.capacity.unwrap_or_default() {
                    let key = unqualified(&k);
                    let n = gpu_dra_api::quantity::parse_int(&v.value.0)
                        .map_err(|e| anyhow!("capacity {k} of {}: {e}", d.name))?;
                    info.capacity.insert(key, n);
                }
                out.insert(d.name, info);
            }
        }
        Ok(out)
    }

    /// Creates every document of a YAML file in the scenario's namespace (namespaced kinds).
    pub async fn create_from_file(&self, rel: &str) -> Result<()> {
        let text = std::fs::read_to_string(self.repo.join(rel))
            .with_context(|| format!("reading {rel}"))?;
        self.create_from_yaml(&text).await
    }

    pub async fn create_from_yaml(&self, text: &str) -> Result<()> {
        for doc in yaml_docs(text)? {
            match doc["kind"].as_str() {
                Some("ResourceClaimTemplate") => {
                    let t: ResourceClaimTemplate = serde_json::from_value(doc)?;
                    Api::<ResourceClaimTemplate>::namespaced(self.client.clone(), &self.ns)
                        .create(&PostParams::default(), &t)
                        .await?;
                }
                Some("ResourceClaim") => {
                    let c: ResourceClaim = serde_json::from_value(doc)?;
                    Api::<ResourceClaim>::namespaced(self.client.clone(), &self.ns)
                        .create(&PostParams::default(), &c)
                        .await?;
                }
                k => bail!("unsupported kind {k:?}"),
            }
        }
        Ok(())
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// A pod pinned to this scenario's nodes (and to `node` if given) whose one container uses all of
    /// `claims`, each from a ResourceClaimTemplate. `extra_resources` goes into the container's
    /// `resources` (for extended resources).
    pub fn pod_manifest(
        &self,
        name: &str,
        node: Option<&str>,
        claims: &[PodClaim<'_>],
        resources: Option<serde_json::Value>,
    ) -> Result<Pod> {
        let mut selector = json!({"e2e-test": self.test});
        if let Some(n) = node {
            selector["kubernetes.io/hostname"] = json!(n);
        }
        let mut res = resources.unwrap_or_else(|| json!({}));
        if !claims.is_empty() {
            res["claims"] = json!(
                claims
                    .iter()
                    .map(|c| json!({"name": c.name}))
                    .collect::<Vec<_>>()
            );
        }
        let pod = json!({
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {
                "nodeSelector": selector,
                "terminationGracePeriodSeconds": 30,
                "resourceClaims": claims.iter().map(|c| json!({
                    "name": c.name, "resourceClaimTemplateName": c.template})).collect::<Vec<_>>(),
                "containers": [{"name": "main", "image": "registry.invalid/cuda-app:1", "resources": res}],
            }
        });
        Ok(serde_json::from_value(pod)?)
    }

    pub async fn create_pod(&self, pod: &Pod) -> Result<Pod> {
        Ok(self.pods().create(&PostParams::default(), pod).await?)
    }

    /// Waits for phase Running (set by the node's kubelet role after prepare).
    pub async fn wait_running(&self, name: &str) -> Result<Pod> {
        let r = wait_until(&format!("pod {name} Running"), WAIT, || async {
            let p = self.pods().get(name).await?;
            let phase = p.status.as_ref().and_then(|s| s.phase.clone());
            Ok((phase.as_deref() == Some("Running")).then_some(p))
        })
        .await;
        if r.is_err() {
            self.explain_pod(name).await;
        }
        r
    }

    /// Prints what is known about a pod that did not get where it should (for failing runs).
    pub async fn explain_pod(&self, name: &str) {
        if let Ok(p) = self.pods().get(name).await {
            println!(
                "pod {name}: status {}",
                serde_json::to_string(&p.status).unwrap_or_default()
            );
            let uid = p.uid().unwrap_or_default();
            for n in &self.nodes {
                for line in n.kubelet.describe_pod(&uid) {
                    println!("pod {name} on {}: {line}", n.name);
                }
            }
        }
    }

    /// A graceful delete, as a user does; the kubelet role unprepares and then lets it go.
    pub async fn delete_pod(&self, name: &str) -> Result<()> {
        match self.pods().delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn wait_pod_gone(&self, name: &str) -> Result<()> {
        wait_until(&format!("pod {name} gone"), WAIT, || async {
            Ok(self.pods().get_opt(name).await?.is_none().then_some(()))
        })
        .await
    }

    /// The claim a pod got for its pod-level claim `claim_name` (from a template).
    pub async fn pod_claim(&self, pod: &str, claim_name: &str) -> Result<ResourceClaim> {
        let p = self.pods().get(pod).await?;
        let name = p
            .status
            .and_then(|s| s.resource_claim_statuses)
            .and_then(|l| l.into_iter().find(|s| s.name == claim_name))
            .and_then(|s| s.resource_claim_name)
            .ok_or_else(|| anyhow!("pod {pod} has no generated claim {claim_name}"))?;
        Ok(self.claims().get(&name).await?)
    }

    /// Fails with every violation any node's kubelet or runtime recorded.
    pub fn check_violations(&self) -> Result<()> {
        let mut v = Vec::new();
        for n in &self.nodes {
            v.extend(
                n.kubelet
                    .violations()?
                    .into_iter()
                    .map(|e| format!("{}: {e}", n.name)),
            );
        }
        if v.is_empty() {
            Ok(())
        } else {
            bail!("kubelet violations:\n  {}", v.join("\n  "))
        }
    }

    /// Waits until the scenario's namespace has no pods left (`what` names the wait).
    pub async fn wait_no_pods(&self, what: &str) -> Result<()> {
        wait_until(what, WAIT, || async {
            let pods = self.pods().list(&ListParams::default()).await?.items;
            Ok(pods.is_empty().then_some(()))
        })
        .await
    }

    /// Deletes the scenario's pods (through the kubelets), checks nothing stays prepared or
    /// allocated, stops the plugins and kubelets and removes nodes and namespace.
    pub async fn teardown(mut self) -> Result<()> {
        let pods = self.pods().list(&ListParams::default()).await?.items;
        for p in &pods {
            self.delete_pod(&p.name_any()).await?;
        }
        self.wait_no_pods("all pods of the scenario gone").await?;
        wait_until("no allocated claims left", WAIT, || async {
            let claims = self.claims().list(&ListParams::default()).await?.items;
            let allocated: Vec<String> = claims
                .iter()
                .filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some()))
                .map(|c| c.name_any())
                .collect();
            if allocated.is_empty() {
                Ok(Some(()))
            } else {
                Err(anyhow!("still allocated: {allocated:?}"))
            }
        })
        .await?;
        // The stock kubelet forgets a claim in its checkpoint right after the unprepare call.
        wait_until("no claim prepared, no CDI spec left", WAIT, || async {
            for n in &self.nodes {
                let prepared = n.kubelet.prepared()?;
                if !prepared.is_empty() {
                    bail!("{}: claims still prepared: {:?}", n.name, prepared.keys());
                }
                let files = crate::cdi::spec_files(&n.dirs.cdi)?;
                if !files.is_empty() {
                    bail!("{}: CDI spec files left: {files:?}", n.name);
                }
            }
            Ok(Some(()))
        })
        .await?;
        self.check_violations()?;
        let nodes: Api<Node> = Api::all(self.client.clone());
        for n in &mut self.nodes {
            n.plugin.stop().await?;
            for p in &mut n.more_plugins {
                p.stop().await?;
            }
            if let Some(k) = n.kubelet.stock_mut() {
                k.stop().await?;
            }
        }
        let lp = ListParams::default().labels(&format!("e2e-test={}", self.test));
        for n in nodes.list(&lp).await?.items {
            nodes
                .delete(&n.name_any(), &DeleteParams::default())
                .await?;
        }
        let nss: Api<Namespace> = Api::all(self.client.clone());
        nss.delete(&self.ns, &DeleteParams::default()).await?;
        println!(
            "{}: passed in {:.1}s",
            self.test,
            self.started.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

/// Every `*.yaml` file of a directory, sorted.
pub fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    v.sort();
    Ok(v)
}

/// A Node the scheduler will place pods on, without a kubelet: Ready, capacity for cpu, memory and
/// pods, no taints (the TaintNodesByCondition admission plugin is off).
pub async fn create_node(client: &Client, name: &str, test: &str) -> Result<Node> {
    let api: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "e2e-test": test}},
    }))?;
    api.create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("creating node {name}"))?;
    let status = json!({
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi", "pods": "250"},
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "250"},
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "reason": "E2EHarness",
                            "message": "kubelet role played by the e2e harness"}],
        }
    });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    let n = api.get(name).await?;
    if let Some(t) = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .filter(|t| !t.is_empty())
    {
        bail!("node {name} got taints {t:?}");
    }
    Ok(n)
}

/// Dry-run creates an object (any kind the server knows), so the API server validates it.
pub async fn dry_run_create(
    client: &Client,
    discovery: &Discovery,
    obj: &serde_json::Value,
    ns: &str,
) -> Result<()> {
    let api_version = obj["apiVersion"].as_str().context("no apiVersion")?;
    let kind = obj["kind"].as_str().context("no kind")?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    let (ar, caps) = discovery
        .resolve_gvk(&gvk)
        .ok_or_else(|| anyhow!("the API server does not serve {api_version} {kind}"))?;
    let api: Api<DynamicObject> = if caps.scope == Scope::Namespaced {
        Api::namespaced_with(client.clone(), ns, &ar)
    } else {
        Api::all_with(client.clone(), &ar)
    };
    let mut dobj: DynamicObject = serde_json::from_value(obj.clone())?;
    if caps.scope == Scope::Namespaced {
        dobj.metadata.namespace = Some(ns.to_string());
    }
    let pp = PostParams {
        dry_run: true,
        field_manager: Some("e2e".into()),
    };
    match api.create(&pp, &dobj).await {
        Ok(_) => Ok(()),
        // Already there (the scenario applied the DeviceClasses): validate as an update instead.
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let name = dobj
                .metadata
                .name
                .clone()
                .context("object without a name")?;
            let params = PatchParams::apply("e2e-validate").force().dry_run();
            api.patch(&name, &params, &Patch::Apply(obj)).await?;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// The device results of a claim's allocation (empty while unallocated).
pub fn allocation_results(
    claim: &k8s_openapi::api::resource::v1::ResourceClaim,
) -> Vec<k8s_openapi::api::resource::v1::DeviceRequestAllocationResult> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.clone())
        .unwrap_or_default()
}
