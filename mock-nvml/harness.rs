//! Test harness for the mock libnvidia-ml (included by the plugin's tests with `#[path]`).
//!
//! Builds the mock with the machine's C compiler once per test process and writes fake driver
//! installations for nodes made from our hardware profiles
//! (`gpu_dra_api::simulated::simulate_node`, the simulated backend's source), so the NVML backend
//! and the simulated backend see the same GPUs. The node description (`mock-nvml.conf` next to the
//! library) and the root's layout are generated and documented by
//! `dra_plugin::backend::nvml_mock_root`, which also backs `dra-plugin mock-nvml-root`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use dra_plugin::backend::nvml_mock_root;
use gpu_dra_api::inventory::Inventory;

/// Where the mock's sources are.
pub fn source_dir() -> PathBuf {
    nvml_mock_root::source_dir()
}

/// Whether a C compiler is there to build the mock.
pub fn have_cc() -> bool {
    Command::new("gcc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Builds the mock once per test process; the path of the built library.
pub fn built_library() -> PathBuf {
    static LIB: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    LIB.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("mock-nvml")
            .join(std::process::id().to_string());
        nvml_mock_root::build_library(&source_dir(), &out).expect("building mock-nvml")
    })
    .clone()
}

/// A fake driver installation: `<dir>/root/usr/lib64/libnvidia-ml.so.1` (its own copy, so each
/// test gets its own mock state in-process) with its node description, plus a sysfs tree and the
/// shared state and event files.
pub struct MockNode {
    pub driver_root: PathBuf,
    pub config: PathBuf,
    pub sysfs: PathBuf,
    pub state: PathBuf,
    pub events: PathBuf,
    pub init_gate: PathBuf,
}

impl MockNode {
    pub fn new(dir: &Path, inv: &Inventory) -> Self {
        Self::with_extra(dir, inv, "")
    }

    /// `extra` lines go into the description (e.g. `mig_needs_reset 1` applies to the GPU before it).
    pub fn with_extra(dir: &Path, inv: &Inventory, extra: &str) -> Self {
        let r = nvml_mock_root::write_root(dir, inv, &built_library(), extra)
            .expect("writing the mock driver root");
        MockNode {
            driver_root: r.driver_root,
            config: r.config,
            sysfs: r.sysfs,
            state: r.state,
            events: r.events,
            init_gate: r.init_gate,
        }
    }

    /// Appends an event line (`xid 0 79`, `dbe 1`, `lost 2`).
    pub fn inject(&self, line: &str) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.events)
            .unwrap();
        writeln!(f, "{line}").unwrap();
    }

    /// The mock's MIG state file: `gi <minor> <gi id> <profile id> <start>` lines and more, up to
    /// its `end` line.
    pub fn state_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.state)
            .unwrap_or_default()
            .lines()
            .take_while(|l| *l != "end")
            .map(str::to_string)
            .collect()
    }
}
