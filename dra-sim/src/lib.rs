//! The local simulator: the Kubernetes DRA CEL environment (`cel`), the scheduler's structured
//! allocator (`alloc`), input loading (`input`), workloads and their pods (`workloads`), a
//! whole-cluster run of many pods (`cluster`), the migration planner (`plan`) and the `eval` /
//! `simulate` / `plan` commands (`cli`), which the `dra-controller` binary exposes as its
//! subcommands of the same names.
pub mod alloc;
pub mod cel;
pub mod cli;
pub mod cluster;
mod error;
pub mod input;
pub mod plan;
pub mod workloads;

pub use cli::{EvalArgs, PlanArgs, SimulateArgs};
pub use error::{Error, Result};

pub async fn eval(args: EvalArgs) -> Result<()> {
    cli::eval(args).await
}

pub async fn simulate(args: SimulateArgs) -> Result<()> {
    cli::simulate(args).await
}

pub async fn plan(args: PlanArgs) -> Result<()> {
    cli::plan(args).await
}
