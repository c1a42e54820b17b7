//! `ComputeDomain` (resource.nvidia.com/v1beta1): a set of nodes that share IMEX channels over NVLink.
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "resource.nvidia.com",
    version = "v1beta1",
    kind = "ComputeDomain",
    plural = "computedomains",
    namespaced,
    status = "ComputeDomainStatus",
    doc = "ComputeDomain prepares IMEX channels on the nodes its workload pods land on",
    printcolumn(name = "Status", type_ = "string", json_path = ".status.status"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("self == oldSelf").message("a ComputeDomain's spec is immutable"))]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainSpec {
    /// Nodes expected in the domain; 0 means "whichever nodes the workload lands on". Deprecated upstream.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub num_nodes: i32,
    pub channel: ComputeDomainChannelSpec,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainChannelSpec {
    /// The ResourceClaimTemplate the controller creates for workload pods.
    pub resource_claim_template: ResourceClaimTemplateRef,
    /// `Single` (channel 0) or `All` (every channel).
    #[serde(default)]
    pub allocation_mode: AllocationMode,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct ResourceClaimTemplateRef {
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum AllocationMode {
    #[default]
    Single,
    All,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainStatus {
    #[serde(default)]
    pub status: DomainStatus,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<ComputeDomainNode>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DomainStatus {
    Ready,
    #[default]
    NotReady,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainNode {
    pub name: String,
    #[serde(default)]
    pub ip_address: String,
    /// `<fabric clusterUUID>.<cliqueId>`; empty without NVLink fabric.
    #[serde(default, rename = "cliqueID")]
    pub clique_id: String,
    pub index: i32,
    pub status: DomainStatus,
}
