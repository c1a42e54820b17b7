use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    dra_controller::cli::Cli::parse().run().await
}
