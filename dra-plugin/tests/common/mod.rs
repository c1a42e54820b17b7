//! Shared by the socket-level tests: the plugin's arguments for an offline, simulated node whose
//! directories all live under one temp dir.
use std::path::Path;

use dra_plugin::cli::{Backend, DeviceArgs, RunArgs};

pub fn offline_args(dir: &Path, profile: &str, gates: &str, layout: Option<&str>) -> RunArgs {
    RunArgs {
        device: DeviceArgs {
            node_name: "node-1".into(),
            driver_name: "gpu.nvidia.com".into(),
            feature_gates: gates.into(),
            backend: Backend::Simulated,
            profiles: vec![profile.into()],
            hardware_file: None,
            mig_layout: layout.map(str::to_string),
            driver_root: None,
        },
        kubeconfig: None,
        registrar_dir: dir.join("registry"),
        plugin_dir: dir.join("plugin"),
        cdi_root: dir.join("cdi"),
        metrics_port: 0,
        healthcheck_port: 0,
        offline_claims_dir: Some(dir.join("claims")),
        boot_id_file: dir.join("boot_id"),
        health_hold_down_seconds: 1,
    }
}
