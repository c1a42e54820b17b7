//! The pieces scenarios that run `dra-controller` share: our CRDs installed, untyped access to
//! `nvidia.com` objects (the e2e crate builds `gpu-dra-api` without its `crd` feature), and the
//! controller started as a subprocess against the scenario's namespace.
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::Value;
use tokio::process::{Child, Command};

use crate::env::{Env, WAIT, wait_until, yaml_docs};

/// Cluster-scoped `nvidia.com/v1alpha1` objects of `kind`, read and written untyped.
pub fn nvidia_api(env: &Env, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("nvidia.com", "v1alpha1", kind);
    Api::all_with(
        env.client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

/// Server-side applies `deploy/crds/crds.yaml` (GPUCluster, ComputeDomain, ComputeDomainClique,
/// MigLayout) and waits until each CRD is Established.
pub async fn apply_crds(env: &Env) -> Result<()> {
    apply_repo_crds(&env.client, &env.repo).await
}

/// [`apply_crds`] for scenarios that hold a client rather than an [`Env`].
pub async fn apply_repo_crds(client: &Client, repo: &Path) -> Result<()> {
    let path = repo.join("deploy/crds/crds.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    apply_crd_docs(client, yaml_docs(&text)?).await
}

/// Server-side applies CRD documents and waits until each is Established.
pub async fn apply_crd_docs(client: &Client, docs: Vec<Value>) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for doc in docs {
        let name = doc["metadata"]["name"].as_str().context("CRD name")?;
        let ssa = PatchParams::apply("e2e").force();
        crds.patch(name, &ssa, &Patch::Apply(&doc))
            .await
            .with_context(|| format!("applying CRD {name}"))?;
        wait_until(&format!("CRD {name} Established"), WAIT, || async {
            let conds = crds.get(name).await?.status.and_then(|s| s.conditions);
            Ok(conds
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(()))
        })
        .await?;
    }
    Ok(())
}

/// The `dra-controller` binary the scenarios run: `E2E_CONTROLLER_BIN`, else the debug build.
pub fn controller_bin(repo: &Path) -> Result<PathBuf> {
    let bin = std::env::var_os("E2E_CONTROLLER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target/debug/dra-controller"));
    if !bin.exists() {
        bail!(
            "{} not found: `cargo build -p dra-controller` or set E2E_CONTROLLER_BIN",
            bin.display()
        );
    }
    Ok(bin)
}

/// Where [`start_controller`] writes the controller's log.
pub fn controller_log(env: &Env) -> PathBuf {
    env.work.join(format!("controller-{}.log", env.test))
}

/// `dra-controller run --controllers gpucluster` for the scenario's namespace
/// (`E2E_CONTROLLER_BIN`, default `target/debug/dra-controller`), killed when dropped.
pub fn start_controller(env: &Env) -> Result<Child> {
    start_controller_with(env, "gpucluster", &[])
}

/// `dra-controller run --controllers <controllers>` with extra environment (e.g. `FEATURE_GATES`),
/// otherwise as [`start_controller`].
pub fn start_controller_with(env: &Env, controllers: &str, vars: &[(&str, &str)]) -> Result<Child> {
    let bin = controller_bin(&env.repo)?;
    std::fs::create_dir_all(&env.work)?;
    let log = std::fs::File::create(controller_log(env))?;
    Command::new(&bin)
        .args(["run", "--namespace", &env.ns])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .args(["--controllers", controllers, "--identity", &env.test])
        .envs(vars.iter().copied())
        .env("KUBECONFIG", &env.kubeconfig)
        .env("RUST_LOG", "info")
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))
}
