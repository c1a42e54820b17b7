//! Names shared by the reconcilers: labels, finalizers, the field manager, driver names.

/// The field manager for every server-side apply this controller makes.
pub const FIELD_MANAGER: &str = "gpu-dra-controller";

/// Set to `false` on pool nodes so the GPU Operator removes the device plugin there.
pub const DEVICE_PLUGIN_LABEL: &str = "nvidia.com/gpu.deploy.device-plugin";
/// Set to `true` on pool nodes that are ready for the DRA kubelet plugin; the DaemonSet selects it.
pub const DRA_DRIVER_LABEL: &str = "nvidia.com/gpu.deploy.dra-driver";
/// GPU nodes as labelled by GPU feature discovery / the operator; the default pool.
pub const GPU_PRESENT_LABEL: &str = "nvidia.com/gpu.present";
/// The device plugin's extended resource.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Holds GPUCluster deletion until claims are unprepared and the plugin is gone.
pub const GPUCLUSTER_FINALIZER: &str = "gpucluster.nvidia.com/dra-resourceclaim";
/// Holds ComputeDomain deletion until its objects and node labels are gone.
pub const COMPUTE_DOMAIN_FINALIZER: &str = "resource.nvidia.com/computeDomain";
/// Node label that binds a node to one ComputeDomain (value: the domain's UID).
pub const COMPUTE_DOMAIN_NODE_LABEL: &str = "resource.nvidia.com/computeDomain";

pub const GPU_DRIVER: &str = "gpu.nvidia.com";
pub const COMPUTE_DOMAIN_DRIVER: &str = "compute-domain.nvidia.com";

/// Recommended labels on everything the controller creates.
pub const PART_OF: (&str, &str) = ("app.kubernetes.io/part-of", "gpu-dra-driver");
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", FIELD_MANAGER);
pub const COMPONENT: &str = "app.kubernetes.io/component";
