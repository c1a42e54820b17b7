//! The local simulator: the Kubernetes DRA CEL environment, the scheduler's structured allocator,
//! and the `eval` / `simulate` commands.
pub mod cel;

#[derive(clap::Args, Debug)]
pub struct EvalArgs {}

#[derive(clap::Args, Debug)]
pub struct SimulateArgs {}

pub async fn eval(_args: EvalArgs) -> anyhow::Result<()> {
    anyhow::bail!("eval is not implemented yet")
}

pub async fn simulate(_args: SimulateArgs) -> anyhow::Result<()> {
    anyhow::bail!("simulate is not implemented yet")
}
