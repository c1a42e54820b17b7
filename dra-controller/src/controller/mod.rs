//! The cluster controller: GPUCluster (DeviceClasses, kubelet plugin, RBAC, VAP, migration pool) and
//! ComputeDomains, behind leader election, with metrics and health endpoints.
pub mod apply;
pub mod crd;
pub mod deviceclasses;
pub mod error;
pub mod gpucluster;
pub mod labels;
pub mod leader;
pub mod metrics;
pub mod pool;
pub mod render;
pub mod status;

pub use error::{Error, Result};

#[derive(clap::Args, Debug)]
pub struct RunArgs {}

pub async fn run(_args: RunArgs) -> anyhow::Result<()> {
    anyhow::bail!("the controller is not implemented yet")
}
