//! The node-scoped ValidatingAdmissionPolicy the controller renders (`gpu-dra-resourceslices-own-
//! node`) against real credentials: a token of the plugin's ServiceAccount bound to a Pod on node A
//! through TokenRequest's `boundObjectRef`, as the kubelet mints a pod's projected token, so the
//! API server itself adds the `authentication.kubernetes.io/node-name` extra the policy reads
//! (controller.rs c3 impersonates that extra instead).
//!
//! The controller runs as a subprocess (`E2E_CONTROLLER_BIN`, default `target/debug/dra-controller`).
//! `E2E_TEST_TARGETS="--test slice_policy" bash e2e/run.sh`; without `E2E_KUBECONFIG` it prints SKIP.
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result, anyhow, bail};
use e2e::controller::{apply_repo_crds, controller_bin};
use e2e::env::{WAIT, client_from_env, create_node, repo_root, wait_until};
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;
use tokio::process::{Child, Command};

/// The driver namespace the controller is started with (controller.rs uses the same).
const NS: &str = "gpu-dra";
const PLUGIN: &str = "gpu-dra-kubelet-plugin";
const VAP: &str = "gpu-dra-resourceslices-own-node";
const NODE_A: &str = "sp-a";
const NODE_B: &str = "sp-b";

fn ssa() -> PatchParams {
    PatchParams::apply("e2e").force()
}

fn gpuclusters(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("nvidia.com", "v1alpha1", "GPUCluster");
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "gpuclusters"),
    )
}

/// The CRDs, the driver namespace, two nodes, the controller and a GPUCluster.
async fn setup(client: &Client, kubeconfig: &Path, log: &Path) -> Result<Child> {
    apply_repo_crds(client, &repo_root()).await?;
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
    Api::<Namespace>::all(client.clone())
        .patch(NS, &ssa(), &Patch::Apply(&ns))
        .await?;
    for n in [NODE_A, NODE_B] {
        create_node(client, n, "slice_policy").await?;
    }
    let bin = controller_bin(&repo_root())?;
    let out = std::fs::File::create(log)?;
    let child = Command::new(&bin)
        .args(["run", "--namespace", NS, "--metrics-addr", "127.0.0.1:0"])
        .args(["--controllers", "gpucluster", "--identity", "slice-policy"])
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::from(out.try_clone()?))
        .stderr(Stdio::from(out))
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    // The pool selects no node: only the plugin's RBAC and the policy matter here.
    let gc = json!({
        "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
        "metadata": {"name": "gpu-cluster"},
        "spec": {"draDriver": {}, "migrationPool": {"nodeSelector": {"matchLabels": {"e2e-slice-policy-pool": "true"}}}},
    });
    gpuclusters(client)
        .patch("gpu-cluster", &ssa(), &Patch::Apply(&gc))
        .await?;
    Ok(child)
}

/// A client authenticated only by `token` (none of the admin kubeconfig's credentials).
async fn token_client(kubeconfig: &Path, token: String) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let mut cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    cfg.auth_info = AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    Ok(Client::try_from(cfg)?)
}

/// A token of the plugin's ServiceAccount, bound to `pod` when given (as a pod's projected token).
async fn plugin_token(client: &Client, pod: Option<&Pod>) -> Result<String> {
    let bound = pod.map(|p| {
        json!({"kind": "Pod", "apiVersion": "v1", "name": p.metadata.name, "uid": p.metadata.uid})
    });
    let req: TokenRequest = serde_json::from_value(json!({
        "spec": {"audiences": [], "expirationSeconds": 3600, "boundObjectRef": bound},
    }))?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    let answer = sas
        .create_token_request(PLUGIN, &PostParams::default(), &req)
        .await?;
    answer
        .status
        .and_then(|s| s.token)
        .context("TokenRequest status has no token")
}

fn slice(name: &str, node: &str) -> Result<ResourceSlice> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.nvidia.com", "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }))?)
}

/// The policy's denial message, or an error for any other outcome.
fn denied<T: std::fmt::Debug>(what: &str, r: kube::Result<T>) -> Result<String> {
    match r {
        Err(kube::Error::Api(s)) if s.message.contains(VAP) => Ok(s.message),
        other => Err(anyhow!("{what}: want a denial by {VAP}, got {other:?}")),
    }
}

async fn body(client: &Client, kubeconfig: &Path, controller: &mut Child) -> Result<()> {
    let alive = |c: &mut Child| -> Result<()> {
        match c.try_wait()? {
            Some(s) => bail!("the controller exited: {s}"),
            None => Ok(()),
        }
    };
    wait_until("the policy binding and the plugin's RBAC", WAIT, || async {
        let vapb = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .get_opt(VAP)
            .await?;
        let crb = Api::<ClusterRoleBinding>::all(client.clone())
            .get_opt(PLUGIN)
            .await?;
        let sa = Api::<ServiceAccount>::namespaced(client.clone(), NS)
            .get_opt(PLUGIN)
            .await?;
        Ok((vapb.is_some() && crb.is_some() && sa.is_some()).then_some(()))
    })
    .await?;
    alive(controller)?;

    // A pod of the plugin on node A: never started (no kubelet), but a token can be bound to it.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "sp-plugin-a"},
        "spec": {"nodeName": NODE_A, "serviceAccountName": PLUGIN, "automountServiceAccountToken": false,
                 "containers": [{"name": "plugin", "image": "e2e.invalid/plugin"}]},
    }))?;
    let pod = Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await?;
    let as_a: Api<ResourceSlice> =
        Api::all(token_client(kubeconfig, plugin_token(client, Some(&pod)).await?).await?);
    let admin: Api<ResourceSlice> = Api::all(client.clone());
    let pp = PostParams::default();

    as_a.create(&pp, &slice("sp-a-gpu", NODE_A)?)
        .await
        .context("node A's own slice")?;
    // The API server compiles the policy and sees its binding asynchronously: poll for the denial.
    let first = wait_until(
        "the policy to deny node B's slice to node A",
        WAIT,
        || async {
            match as_a.create(&pp, &slice("sp-b-gpu", NODE_B)?).await {
                Ok(_) => {
                    admin.delete("sp-b-gpu", &DeleteParams::default()).await?;
                    Ok(None)
                }
                r => Ok(Some(denied("create", r)?)),
            }
        },
    )
    .await?;
    assert!(first.contains(NODE_B), "{first}");
    println!("slice_policy: {first}");

    admin.create(&pp, &slice("sp-b-gpu", NODE_B)?).await?;
    let change = json!({"metadata": {"labels": {"changed-by": "node-a"}}});
    let m = denied(
        "patch",
        as_a.patch("sp-b-gpu", &PatchParams::default(), &Patch::Merge(&change))
            .await,
    )?;
    assert!(m.contains(NODE_B), "{m}");
    let m = denied(
        "delete",
        as_a.delete("sp-b-gpu", &DeleteParams::default()).await,
    )?;
    assert!(m.contains(NODE_B), "{m}");
    assert!(
        admin.get_opt("sp-b-gpu").await?.is_some(),
        "node B's slice survived"
    );

    // Its own slice: changed and deleted.
    as_a.patch("sp-a-gpu", &PatchParams::default(), &Patch::Merge(&change))
        .await?;
    as_a.delete("sp-a-gpu", &DeleteParams::default()).await?;

    // A token bound to nothing carries no node: even its own node's slice is refused.
    let unbound: Api<ResourceSlice> =
        Api::all(token_client(kubeconfig, plugin_token(client, None).await?).await?);
    let m = denied(
        "unbound create",
        unbound.create(&pp, &slice("sp-a-gpu2", NODE_A)?).await,
    )?;
    assert!(m.contains("not bound to a node"), "{m}");
    alive(controller)
}

async fn cleanup(client: &Client, mut controller: Child) -> Result<()> {
    let dp = DeleteParams::default();
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    for s in ["sp-a-gpu", "sp-b-gpu", "sp-a-gpu2"] {
        slices.delete(s, &dp).await.ok();
    }
    Api::<Pod>::namespaced(client.clone(), NS)
        .delete("sp-plugin-a", &dp)
        .await
        .ok();
    let gcs = gpuclusters(client);
    gcs.delete("gpu-cluster", &dp).await.ok();
    let gone = wait_until("the GPUCluster to be gone", WAIT, || async {
        Ok(gcs.get_opt("gpu-cluster").await?.is_none().then_some(()))
    })
    .await;
    if gone.is_err() {
        let strip = json!({"metadata": {"finalizers": null}});
        gcs.patch(
            "gpu-cluster",
            &PatchParams::default(),
            &Patch::Merge(&strip),
        )
        .await
        .ok();
    }
    controller.kill().await.ok();
    for n in [NODE_A, NODE_B] {
        Api::<Node>::all(client.clone()).delete(n, &dp).await.ok();
    }
    gone
}

#[tokio::test]
async fn sp1_a_pod_bound_token_writes_only_its_nodes_slices() -> Result<()> {
    let Some((client, kubeconfig)) = client_from_env().await? else {
        println!("SKIP sp1: E2E_KUBECONFIG is not set; run `bash e2e/run.sh`");
        return Ok(());
    };
    let work = std::env::var_os("E2E_WORKDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let log = work.join("controller-slice-policy.log");
    let mut controller = setup(&client, &kubeconfig, &log).await?;
    let result = body(&client, &kubeconfig, &mut controller).await;
    let cleaned = cleanup(&client, controller).await;
    if result.is_err() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        println!("--- {} (last lines)", log.display());
        for l in text
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            println!("{l}");
        }
    }
    result?;
    cleaned
}
