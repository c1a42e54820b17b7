//! `GPUCluster` (nvidia.com/v1alpha1): one cluster-scoped object, `gpu-cluster`, that describes the whole
//! DRA stack. The schema is a superset of the GPU Operator's GPUCluster (v26.7): every object the
//! operator's CRD accepts is accepted here and keeps all its fields, so one object can be handed
//! from the operator's controller to ours and back. `migrationPool` is ours.
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, PodSecurityContext, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The only name a GPUCluster may have; the CRD rejects any other, as the operator's CRD does.
pub const GPU_CLUSTER_NAME: &str = "gpu-cluster";

/// Desired state of the DRA driver stack.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "nvidia.com",
    version = "v1alpha1",
    kind = "GPUCluster",
    plural = "gpuclusters",
    shortname = "gc",
    status = "GPUClusterStatus",
    doc = "GPUCluster deploys the gpu.nvidia.com DRA driver; a singleton named gpu-cluster",
    validation = Rule::new("self.metadata.name == 'gpu-cluster'").message("only one GPUCluster is allowed and it must be named gpu-cluster"),
    printcolumn(name = "Status", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "Pool", type_ = "integer", json_path = ".status.poolNodes"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyNodes"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct GPUClusterSpec {
    /// The DRA driver: image, feature gates and its two kubelet-plugin flavours.
    pub dra_driver: DraDriverSpec,
    /// The GPU Operator's standalone DCGM host engine. Accepted and kept for the operator's
    /// controller; this controller does not deploy DCGM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "operand_schema")]
    pub dcgm: Option<OperandSpec>,
    /// The GPU Operator's DCGM exporter: deployed on the DRA nodes unless `enabled: false`, with
    /// the GPUs of each node through an admin-access claim (`repository`, `image`, `version`,
    /// `imagePullPolicy`, `imagePullSecrets`, `env`, `args`, `resources` are read; the rest is kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "operand_schema")]
    pub dcgm_exporter: Option<OperandSpec>,
    /// Host paths the kubelet plugin mounts.
    #[serde(default)]
    pub host_paths: HostPathsSpec,
    /// Settings shared by every DaemonSet the controller creates.
    #[serde(default)]
    pub daemonsets: DaemonsetsSpec,
    /// Which nodes run DRA instead of the device plugin.
    #[serde(default)]
    pub migration_pool: MigrationPoolSpec,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DraDriverSpec {
    /// Image registry and path, without the image name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    /// Image name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-zA-Z0-9\-]+$"))]
    pub image: Option<String>,
    /// Image tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Pull policy for every container the controller creates: `Always`, `IfNotPresent` or
    /// `Never`. A string, as in the operator's CRD; the API server checks it on the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// Names of Secrets in the driver namespace used to pull the image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,
    /// Driver feature gates, passed as `FEATURE_GATES=Name=true,...`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
    /// The `gpu.nvidia.com` kubelet plugin.
    #[serde(default)]
    pub gpus: GpusSpec,
    /// The `compute-domain.nvidia.com` kubelet plugin and the ComputeDomain controller.
    #[serde(default)]
    pub compute_domains: ComputeDomainsSpec,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpusSpec {
    #[serde(default)]
    pub kubelet_plugin: KubeletPluginSpec,
    /// On-demand MIG: nodes publish the MIG devices that exist and the controller carves new ones
    /// for pending claims (see docs/on-demand-mig.md). Ours; not in the operator's CRD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_demand_mig: Option<OnDemandMigSpec>,
}

impl GpusSpec {
    /// The on-demand MIG settings when the mode is on.
    pub fn on_demand_mig(&self) -> Option<&OnDemandMigSpec> {
        self.on_demand_mig.as_ref().filter(|m| m.enabled)
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OnDemandMigSpec {
    /// Run kubelet plugins with `--on-demand-mig` and let the controller shape MIG geometry.
    #[serde(default)]
    pub enabled: bool,
    /// Where new MIG devices go: `BinPack` fills GPUs and nodes already in use first, `Spread`
    /// the least used first.
    #[serde(default)]
    pub policy: MigPolicy,
    /// How long a GPU's MIG devices must all stay unallocated before it goes back to whole, as a
    /// duration (`30s`, `5m`, `1h30m`).
    #[serde(default = "default_hold_down")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub hold_down: String,
    /// MIG devices kept idle on every pool node, where free GPUs allow.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_carve: Vec<PreCarve>,
}

impl Default for OnDemandMigSpec {
    fn default() -> Self {
        Self {
            enabled: false,
            policy: MigPolicy::default(),
            hold_down: default_hold_down(),
            pre_carve: Vec::new(),
        }
    }
}

fn default_hold_down() -> String {
    "5m".into()
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum MigPolicy {
    #[default]
    BinPack,
    Spread,
}

/// `count` idle MIG devices of `profile` (e.g. `1g.10gb`) per pool node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreCarve {
    pub profile: String,
    #[schemars(range(min = 1, max = 64))]
    pub count: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainsSpec {
    /// Deploy the compute-domain kubelet plugin and controller.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// The ComputeDomain controller Deployment.
    #[serde(default)]
    pub controller: ComponentSpec,
    /// The `compute-domains` container of the kubelet-plugin DaemonSet.
    #[serde(default)]
    pub kubelet_plugin: KubeletPluginSpec,
}

impl Default for ComputeDomainsSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            controller: ComponentSpec::default(),
            kubelet_plugin: KubeletPluginSpec::default(),
        }
    }
}

/// Extra environment and resources for one container.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeletPluginSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// gRPC health endpoint used for the container's liveness probe.
    #[serde(default)]
    pub healthcheck: HealthcheckSpec,
}

impl KubeletPluginSpec {
    pub const GPUS_HEALTH_PORT: i32 = 51516;
    pub const COMPUTE_DOMAINS_HEALTH_PORT: i32 = 51515;

    /// The health server's port, `default_port` unless set; `None` when the check is disabled.
    pub fn health_port(&self, default_port: i32) -> Option<i32> {
        let h = &self.healthcheck;
        h.enabled.then(|| h.port.unwrap_or(default_port))
    }
}

/// Both fields are optional, as in the operator's CRD; the port defaults per container flavour.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthcheckSpec {
    #[serde(default = "default_true")]
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
}

impl Default for HealthcheckSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            port: None,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostPathsSpec {
    /// Where the NVIDIA driver is installed on the host; `/` (host driver) when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_install_dir: Option<String>,
    /// The kubelet's root directory; `/var/lib/kubelet` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_root_dir: Option<String>,
}

impl HostPathsSpec {
    pub fn driver_root(&self) -> &str {
        self.driver_install_dir.as_deref().unwrap_or("/")
    }

    pub fn kubelet_root(&self) -> &str {
        self.kubelet_root_dir
            .as_deref()
            .unwrap_or("/var/lib/kubelet")
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DaemonsetsSpec {
    /// Extra labels on every DaemonSet and its pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Extra annotations on every DaemonSet and its pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Tolerations for the DaemonSet pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Pod security context of every DaemonSet's pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security_context: Option<PodSecurityContext>,
    /// `RollingUpdate` (default) or `OnDelete`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdateSpec>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum UpdateStrategy {
    RollingUpdate,
    OnDelete,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdateSpec {
    /// A count (`1`) or a percentage (`10%`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationPoolSpec {
    /// Nodes that use DRA; all nodes labelled `nvidia.com/gpu.present=true` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// Serve `nvidia.com/gpu` requests through DRA on pool nodes (a DeviceClass with
    /// `extendedResourceName: nvidia.com/gpu`).
    #[serde(default = "default_true")]
    pub map_extended_resource: bool,
    /// Which DeviceClass carries that mapping: `gpu.nvidia.com` (NVIDIA's placement) or a separate
    /// `migration.gpu.nvidia.com`.
    #[serde(default)]
    pub extended_resource_class: ExtendedResourceClass,
}

impl Default for MigrationPoolSpec {
    fn default() -> Self {
        Self {
            node_selector: None,
            map_extended_resource: true,
            extended_resource_class: ExtendedResourceClass::default(),
        }
    }
}

/// The DeviceClass that maps `nvidia.com/gpu` to DRA.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ExtendedResourceClass {
    #[default]
    #[serde(rename = "gpu.nvidia.com")]
    Gpu,
    #[serde(rename = "migration.gpu.nvidia.com")]
    Migration,
}

fn default_true() -> bool {
    true
}

/// An operand of the GPU Operator (`dcgm`, `dcgmExporter`): `enabled` is typed, everything else is
/// kept as written (`render::dcgm` reads the exporter's image, env and args from it).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct OperandSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(flatten)]
    pub rest: BTreeMap<String, serde_json::Value>,
}

/// An object whose unknown fields the API server keeps (`x-kubernetes-preserve-unknown-fields`), so
/// that every field of the operator's DCGM specs survives, now and in later operator versions.
fn operand_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "properties": { "enabled": { "type": "boolean" } },
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Observed state, written by the controller only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GPUClusterStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<State>,
    /// The namespace the driver runs in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Nodes that match the pool selector.
    #[serde(default)]
    pub pool_nodes: i32,
    /// Pool nodes placed for the kubelet plugin.
    #[serde(default)]
    pub ready_nodes: i32,
    /// Pool nodes that still advertise `nvidia.com/gpu` and so get no plugin.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicting_nodes: Vec<String>,
    /// Nodes that left the pool but still hold prepared claims or a plugin pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub draining_nodes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum State {
    Ready,
    NotReady,
    Disabled,
}
