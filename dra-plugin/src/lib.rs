//! `dra-plugin`: the kubelet DRA plugin for NVIDIA GPUs (driver `gpu.nvidia.com`).
//!
//! Layers, cheapest to test first: [`core`] (prepare/unprepare, checkpoint, CDI; no Kubernetes or
//! gRPC types), [`backend`] (where GPUs come from), [`grpc`] (the kubelet's protocols), [`kube`]
//! (ResourceClaims in, ResourceSlices out), and [`run`] wiring it together.

pub mod backend;
pub mod cli;
pub mod computedomain;
pub mod core;
mod error;
pub mod gates;
pub mod grpc;
pub mod kube;
pub mod metrics;
pub mod run;

pub use error::Error;
