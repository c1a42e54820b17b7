//! The cluster controller: GPUCluster (DeviceClasses, kubelet plugin, RBAC, VAP, migration pool) and
//! ComputeDomains, behind leader election, with metrics and health endpoints.
pub mod crd;
pub mod deviceclasses;
pub mod error;
pub mod labels;
pub mod pool;

pub use error::{Error, Result};

#[derive(clap::Args, Debug)]
pub struct RunArgs {}

pub async fn run(_args: RunArgs) -> anyhow::Result<()> {
    anyhow::bail!("the controller is not implemented yet")
}
