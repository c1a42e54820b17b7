//! `examples/quota/gpu-quota.yaml` on the real control plane: a namespace's ResourceQuota on
//! `<class>.deviceclass.resource.k8s.io/devices` refuses the claim that would go past it, per
//! DeviceClass, and kube-controller-manager's quota controller gives the room back when a claim is
//! deleted. `examples/quota/nvidia-gpu-quota.yaml` limits `requests.nvidia.com/gpu`, which counts
//! pods asking for `nvidia.com/gpu` (served through DRA on a stock kubelet) and claims of the class
//! that maps that name alike.
//!
//! `E2E_TEST_TARGETS="--test quota" bash e2e/run.sh`; without `E2E_KUBECONFIG` it prints SKIP.
use std::path::Path;

use anyhow::{Context, Result, bail};
use e2e::env::{Env, client_from_env, yaml_docs};
use e2e::env_or_skip;
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

const NS: &str = "e2e-quota";

fn claim(name: &str, class: &str, count: u32) -> Result<ResourceClaim> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {
            "deviceClassName": class, "allocationMode": "ExactCount", "count": count,
        }}]}},
    }))?)
}

/// Admitted, or the quota's refusal message; other errors fail.
async fn create(api: &Api<ResourceClaim>, c: &ResourceClaim) -> Result<Result<(), String>> {
    match api.create(&PostParams::default(), c).await {
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(s)) if s.message.contains("exceeded quota") => Ok(Err(s.message)),
        Err(e) => Err(e.into()),
    }
}

/// The example's ResourceQuota, created in `ns`.
async fn create_example_quota(client: &kube::Client, ns: &str, file: &str) -> Result<()> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/quota")
        .join(file);
    let doc = yaml_docs(&std::fs::read_to_string(&path)?)?
        .pop()
        .with_context(|| format!("the ResourceQuota of {}", path.display()))?;
    let quota: ResourceQuota = serde_json::from_value(doc)?;
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), ns);
    quotas.create(&PostParams::default(), &quota).await?;
    Ok(())
}

async fn body(client: &kube::Client) -> Result<()> {
    create_example_quota(client, NS, "gpu-quota.yaml").await?;
    let quotas = Quota::new(client, NS, "gpus");
    // Admission counts against the status the quota controller fills in first.
    quotas.wait_used(GPU_KEY, "0").await?;

    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    create(&claims, &claim("two-gpus", "gpu.nvidia.com", 2)?)
        .await?
        .map_err(anyhow::Error::msg)
        .context("two GPUs fit the quota")?;
    let refused = create(&claims, &claim("third-gpu", "gpu.nvidia.com", 1)?).await?;
    let Err(message) = refused else {
        bail!("a third GPU was admitted past the quota of two");
    };
    println!("quota: {message}");
    assert!(
        message.contains("gpu.nvidia.com.deviceclass.resource.k8s.io/devices"),
        "{message}"
    );
    // Another class has its own limit.
    create(&claims, &claim("mig-four", "mig.nvidia.com", 4)?)
        .await?
        .map_err(anyhow::Error::msg)
        .context("four MIG devices fit their own limit")?;

    quotas.wait_used(GPU_KEY, "2").await?;
    // Deleting a claim gives its devices back: the third GPU fits now.
    claims.delete("two-gpus", &DeleteParams::default()).await?;
    quotas.wait_used(GPU_KEY, "0").await?;
    create(&claims, &claim("third-gpu", "gpu.nvidia.com", 1)?)
        .await?
        .map_err(anyhow::Error::msg)
        .context("a GPU fits again after the claim holding two is deleted")?;
    Ok(())
}

const GPU_KEY: &str = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices";

/// One ResourceQuota, read back as kube-controller-manager's quota controller fills it in.
struct Quota {
    api: Api<ResourceQuota>,
    name: &'static str,
}

impl Quota {
    fn new(client: &kube::Client, ns: &str, name: &'static str) -> Self {
        let api = Api::namespaced(client.clone(), ns);
        Quota { api, name }
    }

    /// Waits until `status.used[key]` reads `want` (the quota controller's recount).
    async fn wait_used(&self, key: &str, want: &str) -> Result<()> {
        let name = self.name;
        let mut last = None;
        for _ in 0..120 {
            let q = self.api.get(name).await?;
            last = q
                .status
                .and_then(|s| s.used)
                .and_then(|u| u.get(key).cloned());
            if last.as_ref().is_some_and(|q| q.0 == want) {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        bail!("quota {name}, usage of {key}: want {want}, have {last:?} after 60 s")
    }
}

#[tokio::test]
async fn q1_a_device_class_quota_limits_claims_per_namespace() -> Result<()> {
    let Some((client, _)) = client_from_env().await? else {
        println!("SKIP q1: E2E_KUBECONFIG is not set; run `bash e2e/run.sh`");
        return Ok(());
    };
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}}))?;
    nss.create(&PostParams::default(), &ns).await?;
    let result = body(&client).await;
    let cleaned = nss.delete(NS, &DeleteParams::default()).await;
    result?;
    cleaned?;
    Ok(())
}

const LEGACY_KEY: &str = "requests.nvidia.com/gpu";

/// Creates a pod asking for `nvidia.com/gpu: 1` on the scenario's node: admitted, or the quota's
/// refusal message.
async fn legacy_pod(env: &Env, name: &str, node: &str) -> Result<Result<(), String>> {
    let res = json!({"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}});
    let pod = env.pod_manifest(name, Some(node), &[], Some(res))?;
    match env.create_pod(&pod).await {
        Ok(_) => Ok(Ok(())),
        Err(e) => match e.downcast_ref::<kube::Error>() {
            Some(kube::Error::Api(s)) if s.message.contains("exceeded quota") => {
                Ok(Err(s.message.clone()))
            }
            _ => Err(e),
        },
    }
}

fn refused_on(what: &str, outcome: Result<(), String>, key: &str) -> Result<()> {
    let Err(message) = outcome else {
        bail!("{what} was admitted past the quota of two on {key}");
    };
    println!("q2: {what}: {message}");
    anyhow::ensure!(message.contains(key), "{what}: {message}");
    Ok(())
}

/// `requests.nvidia.com/gpu` counts a pod's `nvidia.com/gpu` (which runs through the stock kubelet
/// on a DRA-allocated GPU) and a claim of the class mapping that name alike; the claim the
/// scheduler makes for the pod is not counted twice; deleting the claim makes room for the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn q2_nvidia_gpu_quota_counts_pods_and_claims() -> Result<()> {
    let mut env = env_or_skip!("q2_nvidia_gpu_quota_counts_pods_and_claims");
    let node = "q2-h100";
    env.add_node(node, &["--profile", "h100-80gb:3"]).await?;
    create_example_quota(&env.client, &env.ns, "nvidia-gpu-quota.yaml").await?;
    let quota = Quota::new(&env.client, &env.ns, "nvidia-gpus");
    quota.wait_used(LEGACY_KEY, "0").await?;

    legacy_pod(&env, "legacy-a", node)
        .await?
        .map_err(anyhow::Error::msg)
        .context("the first nvidia.com/gpu pod fits")?;
    let running = env.wait_running("legacy-a").await?;
    let ext = running
        .status
        .and_then(|s| s.extended_resource_claim_status)
        .context("legacy-a runs without a DRA claim for nvidia.com/gpu")?;
    println!("q2: legacy-a runs on claim {}", ext.resource_claim_name);
    quota.wait_used(LEGACY_KEY, "1").await?;

    let claims = env.claims();
    create(&claims, &claim("one-gpu", "gpu.nvidia.com", 1)?)
        .await?
        .map_err(anyhow::Error::msg)
        .context("a claim of one GPU fits beside the pod")?;
    // The pod (1) and the claim (1); the pod's own claim is not counted again.
    quota.wait_used(LEGACY_KEY, "2").await?;
    refused_on(
        "a second nvidia.com/gpu pod",
        legacy_pod(&env, "legacy-b", node).await?,
        LEGACY_KEY,
    )?;
    refused_on(
        "a second gpu.nvidia.com claim",
        create(&claims, &claim("another-gpu", "gpu.nvidia.com", 1)?).await?,
        LEGACY_KEY,
    )?;

    claims.delete("one-gpu", &DeleteParams::default()).await?;
    quota.wait_used(LEGACY_KEY, "1").await?;
    legacy_pod(&env, "legacy-b", node)
        .await?
        .map_err(anyhow::Error::msg)
        .context("the second pod fits after the claim is deleted")?;
    env.wait_running("legacy-b").await?;
    quota.wait_used(LEGACY_KEY, "2").await?;
    env.check_violations()?;
    env.teardown().await
}
