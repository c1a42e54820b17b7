//! Shared by the socket-level tests: an offline, simulated node whose directories all live under
//! one temp dir, its arguments, and the claims its offline claim source reads.
// Each test file uses a part of this.
#![allow(dead_code)]
use std::path::Path;

use dra_plugin::cli::{Backend, DeviceArgs, HardwareArgs, RunArgs};
use dra_plugin::kube::claims::FileClaims;
use kubelet_proto::dra_v1::{self as v1, dra_plugin_client::DraPluginClient};
use tonic::transport::Channel;

/// Makes `dir` an offline node's root: its claims directory, and a boot ID unless one is there
/// (a test may have written another to play a reboot).
pub fn offline_dir(dir: &Path) {
    std::fs::create_dir_all(dir.join("claims")).unwrap();
    if !dir.join("boot_id").exists() {
        std::fs::write(dir.join("boot_id"), "boot-a\n").unwrap();
    }
}

/// Puts a ResourceClaim object where the offline claim source looks for it.
pub fn put_claim(dir: &Path, claim: &serde_json::Value) {
    let meta = &claim["metadata"];
    let path = FileClaims::path_for(
        &dir.join("claims"),
        meta["namespace"].as_str().expect("claim namespace"),
        meta["name"].as_str().expect("claim name"),
    );
    std::fs::write(path, claim.to_string()).unwrap();
}

pub fn offline_args(dir: &Path, profile: &str, gates: &str, layout: Option<&str>) -> RunArgs {
    RunArgs {
        device: DeviceArgs {
            node_name: "node-1".into(),
            driver_name: "gpu.nvidia.com".into(),
            feature_gates: gates.into(),
            backend: Backend::Simulated,
            hardware: HardwareArgs {
                profiles: vec![profile.into()],
                hardware_file: None,
            },
            mig_layout: layout.map(str::to_string),
            driver_root: None,
            host: Default::default(),
            consumable_shares: Default::default(),
            on_demand_mig: false,
        },
        kubeconfig: None,
        registrar_dir: dir.join("registry"),
        plugin_dir: dir.join("plugin"),
        cdi_root: dir.join("cdi"),
        metrics_port: Some(0),
        http_endpoint: None,
        metrics_path: "/metrics".into(),
        healthcheck_port: 0,
        offline_claims_dir: Some(dir.join("claims")),
        boot_id_file: dir.join("boot_id"),
        health_hold_down_seconds: 1,
        worker_threads: 1,
        claim_device_status: true,
        rolling_update_uid: None,
        max_nodes_per_imex_domain: 18,
    }
}

/// Prepares `c` alone over v1: its entry in the response.
pub async fn prepare(
    client: &mut DraPluginClient<Channel>,
    c: &v1::Claim,
) -> v1::NodePrepareResourceResponse {
    client
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![c.clone()],
        })
        .await
        .unwrap()
        .into_inner()
        .claims
        .remove(&c.uid)
        .unwrap()
}

/// Unprepares `c` alone over v1: its error, empty on success.
pub async fn unprepare(client: &mut DraPluginClient<Channel>, c: &v1::Claim) -> String {
    client
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: vec![c.clone()],
        })
        .await
        .unwrap()
        .into_inner()
        .claims
        .remove(&c.uid)
        .unwrap()
        .error
}
