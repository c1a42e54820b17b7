//! Whole manifest files applied as `kubectl apply -f` does: every document, of any kind the API
//! server serves (found through discovery), server-side applied (created, where it has only a
//! `generateName`); a failing document is reported and the rest still go in. Also the controllers that turn Deployments and Jobs into pods, which
//! the shared control plane does not run (`controlplane/cluster.sh` runs only what every scenario
//! needs).
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result, anyhow};
use kube::Client;
use kube::api::{
    Api, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::discovery::{ApiResource, Discovery, Scope};
use serde_json::Value;
use tokio::process::{Child, Command};

/// The field manager of everything applied from a file.
const MANAGER: &str = "e2e-manifests";

/// One object a file created.
#[derive(Debug, Clone)]
pub struct AppliedObject {
    pub kind: String,
    pub name: String,
    /// `None` for cluster-scoped kinds.
    pub namespace: Option<String>,
    ar: ApiResource,
}

/// What applying a file did: the objects it created and the documents the API server refused
/// (`kind/name: error`), as `kubectl apply` lists them.
#[derive(Debug, Default)]
pub struct Applied {
    pub objects: Vec<AppliedObject>,
    pub errors: Vec<String>,
}

impl Applied {
    /// `default_ns`, every namespace the file's namespaced objects went to and the Namespaces it
    /// created; each once.
    pub fn namespaces(&self, default_ns: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .objects
            .iter()
            .filter_map(|o| match o.kind.as_str() {
                "Namespace" => Some(o.name.clone()),
                _ => o.namespace.clone(),
            })
            .chain([default_ns.to_string()])
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

/// `apiVersion kind` of every document the API server does not serve.
pub fn unserved(discovery: &Discovery, docs: &[Value]) -> Vec<String> {
    docs.iter()
        .filter(|d| resolve(discovery, d).is_err())
        .map(|d| format!("{} {}", d["apiVersion"], d["kind"]))
        .collect()
}

fn resolve(discovery: &Discovery, doc: &Value) -> Result<(ApiResource, bool)> {
    let api_version = doc["apiVersion"].as_str().context("no apiVersion")?;
    let kind = doc["kind"].as_str().context("no kind")?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let (ar, caps) = discovery
        .resolve_gvk(&GroupVersionKind::gvk(group, version, kind))
        .ok_or_else(|| anyhow!("the API server does not serve {api_version} {kind}"))?;
    Ok((ar, caps.scope == Scope::Namespaced))
}

/// Server-side applies every document in order; namespaced ones without a namespace go to
/// `default_ns` (as `kubectl apply -n`).
pub async fn apply_docs(
    client: &Client,
    discovery: &Discovery,
    docs: &[Value],
    default_ns: &str,
) -> Applied {
    let mut out = Applied::default();
    for doc in docs {
        let label = format!("{}/{}", doc["kind"], doc["metadata"]["name"]).replace('"', "");
        match apply_one(client, discovery, doc, default_ns).await {
            Ok(o) => out.objects.push(o),
            Err(e) => out.errors.push(format!("{label}: {e:#}")),
        }
    }
    out
}

async fn apply_one(
    client: &Client,
    discovery: &Discovery,
    doc: &Value,
    default_ns: &str,
) -> Result<AppliedObject> {
    let (ar, namespaced) = resolve(discovery, doc)?;
    let mut doc = doc.clone();
    let namespace = namespaced.then(|| {
        let ns = doc["metadata"]["namespace"]
            .as_str()
            .unwrap_or(default_ns)
            .to_string();
        doc["metadata"]["namespace"] = Value::String(ns.clone());
        ns
    });
    let api: Api<DynamicObject> = match &namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let name = match doc["metadata"]["name"].as_str() {
        Some(name) => {
            api.patch(name, &PatchParams::apply(MANAGER), &Patch::Apply(&doc))
                .await?;
            name.to_string()
        }
        // Apply needs a name; a `generateName` document is for `kubectl create` (as NVIDIA's
        // bats tests use it), which lets the server pick the name.
        None if doc["metadata"]["generateName"].is_string() => {
            let obj: DynamicObject = serde_json::from_value(doc)?;
            let created = api.create(&PostParams::default(), &obj).await?;
            created.metadata.name.context("created without a name")?
        }
        None => anyhow::bail!("no metadata.name (apply needs one)"),
    };
    Ok(AppliedObject {
        kind: ar.kind.clone(),
        name,
        namespace,
        ar,
    })
}

/// Deletes what a file created, last first (`kubectl delete -f`); gone objects are fine.
pub async fn delete_applied(client: &Client, applied: &Applied) -> Result<()> {
    for o in applied.objects.iter().rev() {
        let api: Api<DynamicObject> = match &o.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &o.ar),
            None => Api::all_with(client.clone(), &o.ar),
        };
        match api.delete(&o.name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("deleting {} {}", o.kind, o.name)),
        }
    }
    Ok(())
}

/// A second kube-controller-manager running only the workload controllers (Deployments,
/// ReplicaSets, Jobs, or those a test names) for one test; killed when dropped, so no other
/// scenario sees them.
pub struct WorkloadControllers {
    child: Child,
}

impl WorkloadControllers {
    /// Starts `kube-controller-manager` from the directory of `E2E_KUBELET_BIN` (the control
    /// plane's binaries), logging to `log`.
    pub fn start(kubeconfig: &Path, log: &Path) -> Result<WorkloadControllers> {
        Self::start_only(
            kubeconfig,
            log,
            "deployment-controller,replicaset-controller,job-controller",
        )
    }

    /// [`Self::start`] with the given `--controllers` list.
    pub fn start_only(kubeconfig: &Path, log: &Path, controllers: &str) -> Result<Self> {
        let bin = std::env::var_os("E2E_KUBELET_BIN")
            .map(PathBuf::from)
            .and_then(|k| k.parent().map(|d| d.join("kube-controller-manager")))
            .context("E2E_KUBELET_BIN is not set (run through e2e/run.sh)")?;
        let out = std::fs::File::create(log)?;
        let child = Command::new(&bin)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["--leader-elect=false", "--secure-port=0", "--v=1"])
            .arg(format!("--controllers={controllers}"))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(WorkloadControllers { child })
    }

    /// Fails when the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            anyhow::bail!("the workload kube-controller-manager exited ({status})");
        }
        Ok(())
    }
}
