//! Server-side apply and delete helpers, all under the one field manager.
use std::fmt::Debug;

use kube::api::{Api, DeleteParams, Patch, PatchParams, PropagationPolicy};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::{Error, Result};
use gpu_dra_api::names::CONTROLLER_FIELD_MANAGER;

pub fn params() -> PatchParams {
    PatchParams::apply(CONTROLLER_FIELD_MANAGER).force()
}

/// Apply `obj` as the whole of what we want of it; fields we applied before and omit now are removed.
pub async fn apply<K>(api: &Api<K>, obj: &K) -> Result<K>
where
    K: Resource + Serialize + DeserializeOwned + Clone + Debug,
{
    let name = obj
        .meta()
        .name
        .clone()
        .ok_or(Error::MissingField("metadata.name"))?;
    Ok(api.patch(&name, &params(), &Patch::Apply(obj)).await?)
}

/// Adds (`present`) or removes our `finalizer` on `obj` with a merge patch guarded by its
/// resourceVersion, so a concurrent change makes the patch fail rather than drop a finalizer.
pub async fn set_finalizer<K>(api: &Api<K>, obj: &K, finalizer: &str, present: bool) -> Result<()>
where
    K: Resource + DeserializeOwned + Clone + Debug,
{
    let mut fins: Vec<String> = obj
        .finalizers()
        .iter()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect();
    if present {
        fins.push(finalizer.to_owned());
    }
    let patch = serde_json::json!({ "metadata": { "finalizers": fins, "resourceVersion": obj.resource_version() } });
    api.patch(
        &obj.name_any(),
        &PatchParams::default(),
        &Patch::Merge(patch),
    )
    .await?;
    Ok(())
}

/// Delete in the foreground. `true` while the object (or its dependents) still exists.
pub async fn delete<K>(api: &Api<K>, name: &str) -> Result<bool>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        ..Default::default()
    };
    match api.delete(name, &dp).await {
        Ok(either) => Ok(either.is_left()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Names of the objects a list returned, for logs.
pub fn names<K: Resource>(objs: &[K]) -> Vec<String> {
    objs.iter().map(|o| o.name_any()).collect()
}

/// Delete with background propagation, for objects nothing depends on. `true` while it still exists
/// (someone else's finalizer holds it).
pub async fn delete_background<K>(api: &Api<K>, name: &str) -> Result<bool>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..Default::default()
    };
    match api.delete(name, &dp).await {
        Ok(either) => Ok(either.is_left()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}
