use clap::Parser;

// `simulate` builds every node's pool from thousands of short strings and small maps; mimalloc's
// per-size-class pages keep them dense, which cut the cold 5,000-node allocation by about a fifth
// on 2 cores (sim-bench). The plugin keeps the system allocator: its target is resident memory.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    dra_controller::cli::Cli::parse().run().await
}
