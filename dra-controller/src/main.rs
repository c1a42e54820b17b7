use std::process::ExitCode;

use clap::Parser;

// `simulate` builds every node's pool from thousands of short strings and small maps; mimalloc's
// per-size-class pages keep them dense, which cut the cold 5,000-node allocation by about a fifth
// on 2 cores (sim-bench). The plugin keeps the system allocator: its target is resident memory.
// `--features system-alloc` leaves it out, for heap profilers that hook malloc (heaptrack).
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

// The controller waits on the API server almost all the time; two workers keep every thread's stack
// and allocator cache off the large nodes it runs on, where the default is one worker per core.
#[tokio::main(worker_threads = 2)]
async fn main() -> ExitCode {
    let cli = dra_controller::cli::Cli::parse();
    let log = match gpu_dra_log::init(&cli.log) {
        Ok(log) => log,
        Err(e) => {
            eprintln!("Error: {e}");
            return ExitCode::from(2);
        }
    };
    match cli.run().await {
        Ok(()) => ExitCode::SUCCESS,
        // the simulator's errors say where in the input and why; a backtrace adds nothing there
        Err(e) if e.downcast_ref::<dra_sim::Error>().is_some() => {
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
        Err(e) => {
            gpu_dra_log::exit_error(log.format, &e);
            ExitCode::FAILURE
        }
    }
}
