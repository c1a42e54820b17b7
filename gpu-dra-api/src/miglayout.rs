//! `MigLayout` (nvidia.com/v1alpha1, cluster-scoped, one per node and named after it): the MIG
//! geometry wanted on a node's GPUs in on-demand MIG mode.
//!
//! The split of work: the node's kubelet plugin creates the object at start with an empty spec and
//! reports its GPUs in `status` (product, MIG capability, the MIG devices that exist); the
//! controller alone writes `spec.gpus` (server-side apply, its own field manager) from the demand
//! it sees; the plugin creates and destroys MIG devices until every listed GPU matches, then
//! republishes its ResourceSlices and reports the outcome in `status`. A GPU not listed in the spec
//! is left as it is. A MIG device that a prepared claim holds is never destroyed.
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Wanted MIG devices, per GPU.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "nvidia.com",
    version = "v1alpha1",
    kind = "MigLayout",
    plural = "miglayouts",
    status = "MigLayoutStatus",
    doc = "MigLayout is the MIG geometry wanted on one node's GPUs (on-demand MIG); named after the node",
    printcolumn(
        name = "Applied",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Applied')].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MigLayoutSpec {
    /// GPUs whose MIG devices the controller manages; others are left alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuLayout>,
}

/// The MIG devices wanted on one GPU. An empty `devices` list means the whole GPU.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuLayout {
    /// The GPU's UUID (its `uuid` attribute).
    pub uuid: String,
    #[serde(default)]
    pub devices: Vec<MigPlacement>,
}

/// One MIG device: a profile at a placement.
#[derive(
    Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct MigPlacement {
    /// The MIG profile as NVIDIA names it, e.g. `3g.40gb`.
    pub profile: String,
    /// The first memory slice of the placement.
    pub start: u32,
}

/// What the node's plugin has found and done.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigLayoutStatus {
    /// The spec generation the plugin last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Every GPU of the node, as it is now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuLayoutStatus>,
    /// `Applied`: True when every listed GPU matches the spec; False with a reason otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One GPU as the plugin sees it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuLayoutStatus {
    pub uuid: String,
    /// The GPU's minor number: its devices are `gpu-<minor>` and `gpu-<minor>-mig-...`.
    pub minor: u32,
    /// The product name as the driver reports it (the `productName` attribute).
    pub product_name: String,
    /// Whether MIG devices can be created on this GPU.
    pub mig_capable: bool,
    /// The MIG devices that exist now.
    #[serde(default)]
    pub devices: Vec<MigPlacement>,
    /// Why this GPU does not match the spec, when it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The type of the status condition the plugin maintains.
pub const APPLIED_CONDITION: &str = "Applied";
