//! Every name the driver puts on the API server or the node, defined once: driver names,
//! DeviceClasses, labels, annotations, finalizers, field managers, device taint keys and CDI kinds.
//! The controller, the kubelet plugin, its core and the e2e harness all take them from here.
//!
//! Tests that check what goes over the wire may still spell a value out, on purpose.

// Drivers.

/// The GPU driver's name, and the attribute domain of its unqualified attributes.
pub const GPU_DRIVER: &str = "gpu.nvidia.com";
/// The compute-domain driver's name: IMEX channels and IMEX daemons.
pub const COMPUTE_DOMAIN_DRIVER: &str = "compute-domain.nvidia.com";

// DeviceClasses (`deviceclasses/<name>.yaml`).

/// Whole GPUs.
pub const GPU_CLASS: &str = "gpu.nvidia.com";
/// MIG devices.
pub const MIG_CLASS: &str = "mig.nvidia.com";
/// GPUs for VFIO passthrough.
pub const VFIO_CLASS: &str = "vfio.gpu.nvidia.com";
/// The per-node IMEX daemon device of a ComputeDomain.
pub const COMPUTE_DOMAIN_DAEMON_CLASS: &str = "compute-domain-daemon.nvidia.com";
/// The workload's IMEX channel of a ComputeDomain.
pub const COMPUTE_DOMAIN_CHANNEL_CLASS: &str = "compute-domain-default-channel.nvidia.com";
/// The class that maps `nvidia.com/gpu` onto whole DRA GPUs; optional per GPUCluster.
pub const MIGRATION_CLASS: &str = "migration.gpu.nvidia.com";

// The migration pool: node labels and the device plugin's resource.

/// Set to `false` on pool nodes so the GPU Operator removes the device plugin there.
pub const DEVICE_PLUGIN_LABEL: &str = "nvidia.com/gpu.deploy.device-plugin";
/// Set to `true` on pool nodes that are ready for the DRA kubelet plugin; its DaemonSet selects it.
pub const DRA_DRIVER_LABEL: &str = "nvidia.com/gpu.deploy.dra-driver";
/// GPU nodes as labelled by GPU feature discovery / the operator; the default pool.
pub const GPU_PRESENT_LABEL: &str = "nvidia.com/gpu.present";
/// The device plugin's extended resource.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

// Finalizers.

/// Holds GPUCluster deletion until claims are unprepared and the plugin is gone.
pub const GPUCLUSTER_FINALIZER: &str = "gpucluster.nvidia.com/dra-resourceclaim";
/// Holds ComputeDomain deletion until its objects and node labels are gone.
pub const COMPUTE_DOMAIN_FINALIZER: &str = "resource.nvidia.com/computeDomain";

// GPUCluster annotations.

/// Which controller reconciles the GPUCluster when more than one could: `gpu-dra-controller` (ours)
/// or `gpu-operator` (NVIDIA's GPU Operator, which reconciles the same object from v26.7 on).
pub const GPUCLUSTER_CONTROLLER_ANNOTATION: &str = "gpu.nvidia.com/gpucluster-controller";

// ComputeDomain labels and annotations.

/// Node label that binds a node to one ComputeDomain (value: the domain's UID). The
/// compute-domain plugin sets it while a channel is prepared there; the controller's daemon
/// DaemonSet selects it.
pub const COMPUTE_DOMAIN_NODE_LABEL: &str = "resource.nvidia.com/computeDomain";
/// Label on daemon pods naming the clique (`<clusterUUID>.<cliqueId>`) the daemon joined; set by
/// the daemon side, read into `status.nodes[].cliqueID`.
pub const COMPUTE_DOMAIN_CLIQUE_LABEL: &str = "resource.nvidia.com/computeDomain.cliqueID";
/// Node label with the node's NVLink clique (`<clusterUUID>.<cliqueId>`), as GPU Feature Discovery
/// sets it; the controller groups daemons and the plugin tells the daemon pod by it.
pub const GPU_CLIQUE_NODE_LABEL: &str = "nvidia.com/gpu.clique";
/// Annotations on daemon objects that lead a watch event back to its domain.
pub const COMPUTE_DOMAIN_NAMESPACE_ANNOTATION: &str = "resource.nvidia.com/computeDomain.namespace";
pub const COMPUTE_DOMAIN_NAME_ANNOTATION: &str = "resource.nvidia.com/computeDomain.name";

// Field managers and reporting components.

/// The controller's field manager for every server-side apply it makes.
pub const CONTROLLER_FIELD_MANAGER: &str = "gpu-dra-controller";
/// The kubelet plugin: field manager of its ResourceSlices and of its entries in a
/// ResourceClaim's `status.devices`, component of its Events.
pub const PLUGIN_COMPONENT: &str = "gpu.nvidia.com/dra-plugin";
/// The compute-domain plugin's field manager for the node label it sets.
pub const COMPUTE_DOMAIN_PLUGIN_FIELD_MANAGER: &str = "compute-domain.nvidia.com/dra-plugin";

// Device taints.

/// A GPU reported an Xid (value: the Xid).
pub const TAINT_XID: &str = "gpu.nvidia.com/xid";
/// A GPU reported an uncorrectable ECC error.
pub const TAINT_ECC: &str = "gpu.nvidia.com/ecc";
/// A GPU fell off the bus.
pub const TAINT_GPU_LOST: &str = "gpu.nvidia.com/gpu-lost";
/// A GPU's health cannot be watched.
pub const TAINT_UNMONITORED: &str = "gpu.nvidia.com/unmonitored";

// CDI.

/// CDI vendor of the GPU driver's claim specs (`k8s.gpu.nvidia.com/claim=<uid>-<device>`).
pub const GPU_CDI_VENDOR: &str = "k8s.gpu.nvidia.com";
/// CDI vendor of the compute-domain driver's claim specs.
pub const COMPUTE_DOMAIN_CDI_VENDOR: &str = "k8s.compute-domain.nvidia.com";
/// CDI class of both drivers' claim specs.
pub const CDI_CLASS: &str = "claim";
/// Annotations on a GPU claim's CDI spec that let a lost checkpoint be rebuilt from the CDI
/// files alone: the claim, and its prepared devices.
pub const CDI_CLAIM_ANNOTATION: &str = "gpu.nvidia.com/claim";
pub const CDI_DEVICES_ANNOTATION: &str = "gpu.nvidia.com/prepared-devices";
/// CDI class of the device-metadata specs (KEP-5304): `<driver>/metadata=<claimUID>_<request>`,
/// the kind the upstream kubeletplugin helper writes.
pub const CDI_METADATA_CLASS: &str = "metadata";

// Device metadata (KEP-5304), the layout of k8s.io/dynamic-resource-allocation's helper.

/// Under the plugin directory: `<ns>_<claim>/<request>/metadata.json` per request.
pub const METADATA_DIR: &str = "dra-device-metadata";
/// In containers: `resourceclaims/<claim>/...` or `resourceclaimtemplates/<pod claim>/...`,
/// then `<request>/<driver>-metadata.json`.
pub const METADATA_CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";
/// The API group of the metadata files' objects (`DeviceMetadata`).
pub const METADATA_API_GROUP: &str = "metadata.resource.k8s.io";
/// The ResourceClaim annotation naming the pod's claim entry, on claims made from a template.
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

// ResourceClaim status (KEP-4817).

/// The condition the plugin sets on each of its `status.devices` entries once prepared.
pub const DEVICE_READY_CONDITION: &str = "Ready";

// On-demand MIG.

/// The plugin's field manager on its node's MigLayout (creation and `status`).
pub const MIG_LAYOUT_PLUGIN_FIELD_MANAGER: &str = "gpu.nvidia.com/dra-plugin-miglayout";
/// The controller's field manager on `MigLayout.spec` (on-demand MIG shaper).
pub const MIG_LAYOUT_CONTROLLER_FIELD_MANAGER: &str = "gpu-dra-controller/mig-shaper";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_names_follow_the_driver_names() {
        assert_eq!(GPU_CDI_VENDOR, format!("k8s.{GPU_DRIVER}"));
        assert_eq!(
            COMPUTE_DOMAIN_CDI_VENDOR,
            format!("k8s.{COMPUTE_DOMAIN_DRIVER}")
        );
        assert_eq!(PLUGIN_COMPONENT, format!("{GPU_DRIVER}/dra-plugin"));
        assert_eq!(
            COMPUTE_DOMAIN_PLUGIN_FIELD_MANAGER,
            format!("{COMPUTE_DOMAIN_DRIVER}/dra-plugin")
        );
        for key in [
            TAINT_XID,
            TAINT_ECC,
            TAINT_GPU_LOST,
            TAINT_UNMONITORED,
            CDI_CLAIM_ANNOTATION,
            CDI_DEVICES_ANNOTATION,
        ] {
            assert!(key.starts_with(&format!("{GPU_DRIVER}/")), "{key}");
        }
        for key in [
            COMPUTE_DOMAIN_CLIQUE_LABEL,
            COMPUTE_DOMAIN_NAMESPACE_ANNOTATION,
            COMPUTE_DOMAIN_NAME_ANNOTATION,
        ] {
            assert!(key.starts_with(COMPUTE_DOMAIN_NODE_LABEL), "{key}");
        }
    }
}
