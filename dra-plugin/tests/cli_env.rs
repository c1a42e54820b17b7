//! NVIDIA's `HTTP_ENDPOINT` / `METRICS_PATH` read from the environment. Alone in its binary:
//! setting variables is safe only while no other thread reads the environment.
use clap::Parser;
use dra_plugin::cli::{Cli, Command};

#[test]
fn reads_nvidias_http_endpoint_and_metrics_path_from_the_environment() {
    // SAFETY: this binary's only test; no other thread reads or writes the environment.
    unsafe {
        std::env::set_var("HTTP_ENDPOINT", "127.0.0.1:0");
        std::env::set_var("METRICS_PATH", "nvidia-metrics");
        std::env::remove_var("METRICS_PORT");
    }
    let cli = Cli::try_parse_from(["dra-plugin", "run", "--node-name", "n1"]).unwrap();
    let Command::Run(args) = cli.command else {
        panic!("not run")
    };
    let (addr, path) = args.metrics_endpoint().unwrap().unwrap();
    assert_eq!(addr.to_string(), "127.0.0.1:0");
    assert_eq!(path, "/nvidia-metrics");
}
