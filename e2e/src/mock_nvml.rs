//! Nodes whose plugin runs the NVML backend against the mock libnvidia-ml (`mock-nvml/`), whose
//! MIG state lives in a file and so outlasts plugin restarts, as a GPU's does.
use std::path::Path;

use anyhow::{Context, Result, ensure};

use crate::env::Env;

/// `dra-plugin mock-nvml-root`: builds the mock and writes its driver root under `dir`.
pub async fn mock_root(env: &Env, node: &str, profile: &str, dir: &Path) -> Result<()> {
    let mut cmd = tokio::process::Command::new(&env.plugin_bin);
    cmd.args(["mock-nvml-root", "--profile", profile, "--node-name", node])
        .arg("--out")
        .arg(dir)
        .arg("--mock-source")
        .arg(env.repo.join("mock-nvml"));
    for v in [
        "SIMULATED_HARDWARE_FILE",
        "SIMULATED_MIG_LAYOUT",
        "MOCK_NVML_LIBRARY",
    ] {
        cmd.env_remove(v);
    }
    let out = cmd.output().await.context("running mock-nvml-root")?;
    ensure!(
        out.status.success(),
        "dra-plugin mock-nvml-root (needs make and gcc) failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    print!("{}", String::from_utf8_lossy(&out.stdout));
    Ok(())
}

/// A node whose plugin runs the NVML backend on the mock driver root `root`, with dynamic MIG.
pub async fn add_dynamic_mig_node(env: &mut Env, node: &str, root: &Path) -> Result<()> {
    env.add_node(
        node,
        &[
            "--backend",
            "nvml",
            "--driver-root",
            root.to_str().context("driver root path")?,
            "--feature-gates",
            "DynamicMIG=true",
        ],
    )
    .await?;
    Ok(())
}

/// The mock's MIG state: `gpu <minor> <current> <pending>`, `gi <minor> <id> <profile> <start>`,
/// `ci ...` lines, up to its `end` line.
pub fn mig_state(dir: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(dir.join("mig-state"))
        .with_context(|| format!("reading {}/mig-state", dir.display()))?;
    Ok(text
        .lines()
        .take_while(|l| *l != "end")
        .map(str::to_string)
        .collect())
}
