//! Real-control-plane end-to-end harness.
//!
//! The control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) is started by
//! `e2e/run.sh`; this crate plays the node side: [`plugin::Plugin`] runs one `dra-plugin` process per
//! node, [`real_kubelet::RealKubelet`] runs the stock kubelet with a fake container runtime for it,
//! [`kubelet::Kubelet`] plays the kubelet's DRA manager itself where a test must inject what the
//! real one never sends, and [`env::Env`] ties them to Node objects for one scenario.

pub mod cdi;
pub mod controller;
pub mod env;
pub mod grpc;
pub mod kubelet;
pub mod manifests;
pub mod mock_nvml;
pub mod node_kubelet;
pub mod plugin;
pub mod real_kubelet;

/// The DRA driver name the plugin serves.
pub use gpu_dra_api::names::GPU_DRIVER as DRIVER;

/// The scenario's [`env::Env`], or an early `Ok(())` (the scenario prints SKIP) when no cluster is
/// configured (`E2E_KUBECONFIG` unset).
#[macro_export]
macro_rules! env_or_skip {
    ($name:expr) => {
        match $crate::env::Env::new($name).await? {
            Some(env) => env,
            None => return Ok(()),
        }
    };
}
