//! `examples/quota/gpu-quota.yaml` on the real control plane: a namespace's ResourceQuota on
//! `<class>.deviceclass.resource.k8s.io/devices` refuses the claim that would go past it, per
//! DeviceClass. (Usage going down again after a claim is deleted is the quota controller's
//! recount, which this control plane does not run.)
//!
//! `E2E_TEST_TARGETS="--test quota" bash e2e/run.sh`; without `E2E_KUBECONFIG` it prints SKIP.
use std::path::Path;

use anyhow::{Context, Result, bail};
use e2e::env::{client_from_env, yaml_docs};
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
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
    // Admission counts against the quota's status. The test's control plane runs no quota
    // controller, so the test fills the status in as that controller would for an empty namespace;
    // admission then adds each admitted claim to `used` itself.
    let hard = quota.spec.and_then(|s| s.hard).context("spec.hard")?;
    let used: serde_json::Map<String, serde_json::Value> =
        hard.keys().map(|k| (k.clone(), json!("0"))).collect();
    let status = json!({"status": {"hard": hard, "used": used}});
    quotas
        .patch_status("gpus", &PatchParams::default(), &Patch::Merge(&status))
        .await?;

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

    let q = quotas.get("gpus").await?;
    let used = q.status.and_then(|s| s.used).context("status.used")?;
    let gpus = used.get("gpu.nvidia.com.deviceclass.resource.k8s.io/devices");
    assert_eq!(gpus.map(|q| q.0.as_str()), Some("2"), "{used:?}");
    Ok(())
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
