//! Inputs and outputs of the prepare core, free of Kubernetes and gRPC types.
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClaimRef {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

impl ClaimRef {
    /// `namespace/name`, for messages and annotations.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// One allocation result of this driver in this node's pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatedDevice {
    /// `<request>` or `<request>/<subrequest>`.
    pub request: String,
    pub pool: String,
    pub device: String,
    pub admin_access: bool,
    pub share_id: Option<String>,
}

impl AllocatedDevice {
    /// The request name without subrequest: what the kubelet matches containers against.
    pub fn base_request(&self) -> &str {
        self.request.split('/').next().unwrap_or(&self.request)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigSource {
    Class,
    Claim,
}

/// An opaque config entry of this driver, in allocation order (class configs first).
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigEntry {
    pub source: ConfigSource,
    /// Empty means every request.
    pub requests: Vec<String>,
    pub parameters: serde_json::Value,
    /// Where it came from, for error messages: `status.allocation.devices.config[2].opaque.parameters`.
    pub path: String,
}

/// Everything the core needs to prepare one claim.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimAllocation {
    pub claim: ClaimRef,
    /// The pod's name for a claim made from a template (`resource.kubernetes.io/pod-claim-name`):
    /// where containers find the claim's device metadata.
    pub pod_claim_name: Option<String>,
    pub devices: Vec<AllocatedDevice>,
    pub configs: Vec<ConfigEntry>,
}

/// What the kubelet gets back per device (and what the checkpoint remembers).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    pub cdi_device_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// The GPU or MIG device UUID, for the claim's `status.devices`; unset in records written
    /// before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}
