//! `dra-plugin`: the kubelet DRA plugin for NVIDIA GPUs (driver `gpu.nvidia.com`).
//!
//! The node's logic is the `dra-plugin-core` crate (prepare/unprepare, checkpoint, CDI, sharing,
//! health; no Kubernetes or gRPC types). This crate wires it up: [`backend`] (where GPUs come
//! from: NVML, or the core's simulated backend), [`prepare`] (what the DRA calls drive),
//! [`grpc`] (the kubelet's protocols), [`kube`] (ResourceClaims in, ResourceSlices and taints
//! out), [`computedomain`] (the compute-domain driver) and [`run`] putting it together.

pub mod backend;
pub mod cli;
pub mod computedomain;
mod error;
pub mod gates;
pub mod grpc;
pub mod kube;
pub mod metrics;
pub mod miglayout;
pub mod prepare;
pub mod run;

pub use error::Error;
