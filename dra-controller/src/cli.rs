//! Command-line entry: one subcommand per job; each module owns its own argument struct.
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "dra-controller",
    version,
    about = "gpu.nvidia.com DRA controller and local simulator"
)]
pub struct Cli {
    #[command(flatten)]
    pub log: gpu_dra_log::LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the cluster controller (DeviceClasses, GPUCluster, migration pool, ComputeDomains).
    Run(crate::controller::RunArgs),
    /// Serve only the admission webhook that checks ResourceClaims' opaque configs.
    Webhook(crate::webhook::WebhookArgs),
    /// Evaluate a CEL device selector against devices, exactly as the scheduler would.
    Eval(dra_sim::EvalArgs),
    /// Show which devices the scheduler would allocate to claims, or why it cannot.
    Simulate(dra_sim::SimulateArgs),
    /// Plan a move off the device plugin: claims and changed workloads, placed on a node pool.
    Plan(dra_sim::PlanArgs),
    /// Print the CRDs (GPUCluster, ComputeDomain) generated from the Rust types, as YAML.
    Crdgen,
}

impl Cli {
    pub async fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Run(args) => crate::controller::run(args).await,
            Command::Webhook(args) => crate::webhook::run(args).await,
            Command::Eval(args) => Ok(dra_sim::eval(args).await?),
            Command::Simulate(args) => Ok(dra_sim::simulate(args).await?),
            Command::Plan(args) => Ok(dra_sim::plan(args).await?),
            Command::Crdgen => crate::controller::crdgen(),
        }
    }
}
