//! The cluster controller. Filled in by the controller issue.

#[derive(clap::Args, Debug)]
pub struct RunArgs {}

pub async fn run(_args: RunArgs) -> anyhow::Result<()> {
    anyhow::bail!("the controller is not implemented yet")
}
