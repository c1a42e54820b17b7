//! `examples/quota/gpu-quota.yaml` on the real control plane: a namespace's ResourceQuota on
//! `<class>.deviceclass.resource.k8s.io/devices` refuses the claim that would go past it, per
//! DeviceClass, and kube-controller-manager's quota controller gives the room back when a claim is
//! deleted.
//!
//! `E2E_TEST_TARGETS="--test quota" bash e2e/run.sh`; without `E2E_KUBECONFIG` it prints SKIP.
use std::path::Path;

use anyhow::{Context, Result, bail};
use e2e::env::{client_from_env, yaml_docs};
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

async fn body(client: &kube::Client) -> Result<()> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/quota/gpu-quota.yaml");
    let doc = yaml_docs(&std::fs::read_to_string(&path)?)?
        .pop()
        .context("the example's ResourceQuota")?;
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), NS);
    let quota: ResourceQuota = serde_json::from_value(doc)?;
    quotas.create(&PostParams::default(), &quota).await?;
    // Admission counts against the status the quota controller fills in first.
    wait_for_used(&quotas, GPU_KEY, "0").await?;

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

    wait_for_used(&quotas, GPU_KEY, "2").await?;
    // Deleting a claim gives its devices back: the third GPU fits now.
    claims.delete("two-gpus", &DeleteParams::default()).await?;
    wait_for_used(&quotas, GPU_KEY, "0").await?;
    create(&claims, &claim("third-gpu", "gpu.nvidia.com", 1)?)
        .await?
        .map_err(anyhow::Error::msg)
        .context("a GPU fits again after the claim holding two is deleted")?;
    Ok(())
}

const GPU_KEY: &str = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices";

/// Waits until the quota's `status.used[key]` reads `want` (the quota controller's recount).
async fn wait_for_used(quotas: &Api<ResourceQuota>, key: &str, want: &str) -> Result<()> {
    let mut last = None;
    for _ in 0..120 {
        let q = quotas.get("gpus").await?;
        last = q
            .status
            .and_then(|s| s.used)
            .and_then(|u| u.get(key).cloned());
        if last.as_ref().is_some_and(|q| q.0 == want) {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    bail!("quota usage of {key}: want {want}, have {last:?} after 60 s")
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
