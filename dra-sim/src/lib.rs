//! The local simulator: the Kubernetes DRA CEL environment (`cel`), the scheduler's structured
//! allocator (`alloc`), input loading (`input`) and the `eval` / `simulate` commands (`cli`).
pub mod alloc;
pub mod cel;
pub mod cli;
pub mod input;

pub use cli::{EvalArgs, SimulateArgs};

pub async fn eval(args: EvalArgs) -> anyhow::Result<()> {
    cli::eval(args).await
}

pub async fn simulate(args: SimulateArgs) -> anyhow::Result<()> {
    cli::simulate(args).await
}
