//! The kubelet plugin's core: what "prepared" means, independent of Kubernetes and gRPC.
//!
//! [`state`] prepares and unprepares claims (crash-safe, through the [`checkpoint`] and [`cdi`]
//! specs), [`sharing`] runs time slices and MPS daemons, [`health`] turns hardware events into
//! device health. The hardware is reached through the port this crate defines,
//! [`backend::DeviceBackend`]; the `dra-plugin` crate implements it with NVML and wires the core
//! to the kubelet and the API server.
pub mod backend;
pub mod cdi;
pub mod checkpoint;
pub mod configs;
mod error;
pub mod fsutil;
pub mod health;
pub mod metadata;
pub mod miglayout;
pub mod sharing;
pub mod state;
pub mod types;
pub mod vfio;

pub use error::Error;
