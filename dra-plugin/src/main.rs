use clap::Parser;
use dra_plugin::cli::{Cli, Command};

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Slices(args) => dra_plugin::run::print_slices(args),
        Command::MockNvmlRoot(args) => dra_plugin::backend::nvml_mock_root::run(args),
        // Two workers are plenty for a node agent and keep its memory small; so is a bounded
        // blocking pool (checkpoint writes, hardware calls), as each thread costs memory.
        Command::Run(args) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(8)
            .enable_all()
            .build()?
            .block_on(dra_plugin::run::run(args)),
    }
}
