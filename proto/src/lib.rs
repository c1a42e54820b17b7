//! Generated gRPC bindings for the kubelet protocols a DRA driver speaks.
//!
//! `registration`: plugin discovery (`pluginregistration.Registration`).
//! `dra_v1` / `dra_v1beta1`: `DRAPlugin` NodePrepareResources / NodeUnprepareResources.
//! `health_v1alpha1` / `health_v1`: `DRAResourceHealth.NodeWatchResources`.

pub mod codec;

pub mod registration {
    tonic::include_proto!("pluginregistration");
}

pub mod dra_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

pub mod dra_v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

pub mod health_v1alpha1 {
    tonic::include_proto!("v1alpha1");
}

pub mod health_v1 {
    tonic::include_proto!("v1");
}

/// Strings advertised in `PluginInfo.supported_versions` (not the gRPC service names).
pub mod services {
    pub const DRA_V1: &str = "v1.DRAPlugin";
    pub const DRA_V1BETA1: &str = "v1beta1.DRAPlugin";
    pub const HEALTH_V1: &str = "v1.DRAResourceHealth";
    pub const HEALTH_V1ALPHA1: &str = "v1alpha1.DRAResourceHealth";
    /// `PluginInfo.type` for DRA drivers.
    pub const PLUGIN_TYPE_DRA: &str = "DRAPlugin";
}
