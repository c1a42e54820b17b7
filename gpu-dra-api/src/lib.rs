//! Shared model of the `gpu.nvidia.com` DRA driver, used by the kubelet plugin and the controller.
//!
//! Knows GPUs, MIG geometry, the driver's opaque config API and feature gates; the only Kubernetes
//! types it touches are the ResourceSlice shapes in [`slices`], so the simulator and the plugin
//! publish from the very same builder.

#[cfg(feature = "crd")]
pub mod cdclique;
pub mod config;
pub mod gates;
pub mod inventory;
#[cfg(feature = "crd")]
pub mod miglayout;
pub mod names;
pub mod passthrough;
pub mod profiles;
pub mod quantity;
pub mod simulated;
#[cfg(feature = "slices")]
pub mod slices;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown GPU profile {name:?}; known profiles: {known}")]
    UnknownProfile { name: String, known: String },
    #[error("invalid hardware spec {spec:?}: {reason}")]
    InvalidHardwareSpec { spec: String, reason: String },
    #[error("invalid MIG layout {layout:?} for {gpu}: {reason}")]
    InvalidMigLayout {
        layout: String,
        gpu: String,
        reason: String,
    },
    #[error("invalid feature gates: {0}")]
    FeatureGates(String),
    #[error("invalid opaque config at {path}: {reason}")]
    Config { path: String, reason: String },
    #[error("invalid quantity {0:?}")]
    Quantity(String),
    #[error("reading {path}: {reason}")]
    File { path: String, reason: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
