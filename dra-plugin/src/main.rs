use std::process::ExitCode;

use clap::Parser;
use dra_plugin::cli::{Cli, Command};

fn main() -> ExitCode {
    limit_malloc_arenas();
    let cli = Cli::parse();
    let log = match gpu_dra_log::init(&cli.log) {
        Ok(log) => log,
        Err(e) => {
            eprintln!("Error: {e}");
            return ExitCode::from(2);
        }
    };
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            gpu_dra_log::exit_error(log.format, &e);
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Slices(args) => dra_plugin::run::print_slices(args),
        Command::MockNvmlRoot(args) => dra_plugin::backend::nvml_mock_root::run(args),
        Command::ImexDaemon(args) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(dra_plugin::computedomain::imexd::main(args)),
        // Two workers by default (`--worker-threads`): under concurrent prepares they lower p99
        // against one for a fraction of a MiB. The blocking pool (checkpoint writes, hardware
        // calls) is bounded, as each thread costs memory.
        Command::Run(args) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.worker_threads.into())
            .max_blocking_threads(8)
            .enable_all()
            .build()?
            .block_on(dra_plugin::run::run(args)),
    }
}

/// glibc gives each thread that allocates its own arena (up to 8 per core), and each arena keeps
/// freed memory of its own: two are enough for the worker(s) and a few blocking threads, and hold
/// peak RSS down by about 0.5-0.8 MiB under a burst of dynamic-MIG prepares, at no measurable
/// CPU cost. `MALLOC_ARENA_MAX` / `GLIBC_TUNABLES` still take precedence when set.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none()
        && std::env::var_os("GLIBC_TUNABLES").is_none()
    {
        // SAFETY: mallopt only adjusts allocator parameters; called before any other thread exists.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}
