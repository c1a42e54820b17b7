//! The compute-domain driver mode over its real sockets (offline claims, no API server).
mod common;
use std::time::Duration;

use dra_plugin::cli::Cli;
use dra_plugin::grpc::client::{get_info, unix_channel};
use kubelet_proto::dra_v1::{self as v1, dra_plugin_client::DraPluginClient};
use tokio::sync::watch;

#[tokio::test]
async fn a_channel_claim_is_prepared_under_the_compute_domain_driver() {
    use clap::Parser;
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    common::offline_dir(d);
    let claim = serde_json::json!({
        "metadata": {"name": "ch", "namespace": "ns", "uid": "uid-ch"},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {
            "results": [{"request": "channel", "driver": "compute-domain.nvidia.com", "pool": "node-1", "device": "channel-0"}],
            "config": [{"source": "FromClaim", "opaque": {"driver": "compute-domain.nvidia.com", "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig", "domainID": "dom-1"}}}]
        }}}
    });
    common::put_claim(d, &claim);
    let p = |s: &str| d.join(s).display().to_string();
    let cli = Cli::parse_from([
        "dra-plugin",
        "run",
        "--node-name",
        "node-1",
        "--driver-name",
        "compute-domain.nvidia.com",
        "--registrar-dir",
        &p("registry"),
        "--plugin-dir",
        &p("plugin"),
        "--cdi-root",
        &p("cdi"),
        "--metrics-port",
        "0",
        "--healthcheck-port",
        "0",
        "--offline-claims-dir",
        &p("claims"),
        "--boot-id-file",
        &p("boot_id"),
    ]);
    let dra_plugin::cli::Command::Run(args) = cli.command else {
        panic!("run")
    };
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(dra_plugin::run::run_until(args, rx));
    let reg = d.join("registry/compute-domain.nvidia.com-reg.sock");
    let mut info = None;
    for _ in 0..200 {
        if let Ok(i) = get_info(&reg).await {
            info = Some(i);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(info.expect("registered").name, "compute-domain.nvidia.com");
    let mut client = DraPluginClient::new(unix_channel(&d.join("plugin/dra.sock")).await.unwrap());
    let c = v1::Claim {
        namespace: "ns".into(),
        uid: "uid-ch".into(),
        name: "ch".into(),
    };
    let r = common::prepare(&mut client, &c).await;
    assert_eq!(r.error, "");
    assert_eq!(
        r.devices[0].cdi_device_ids,
        ["k8s.compute-domain.nvidia.com/claim=uid-ch-channel-0"]
    );
    let spec =
        std::fs::read_to_string(d.join("cdi/k8s.compute-domain.nvidia.com-claim_uid-ch.json"))
            .unwrap();
    assert!(
        spec.contains("/dev/nvidia-caps-imex-channels/channel0"),
        "{spec}"
    );
    assert_eq!(common::unprepare(&mut client, &c).await, "");
    assert!(
        !d.join("cdi/k8s.compute-domain.nvidia.com-claim_uid-ch.json")
            .exists()
    );
    stop.send(true).unwrap();
    task.await.unwrap().unwrap();
}

/// `slices --driver-name compute-domain.nvidia.com` prints what that driver publishes: channel 0
/// and daemon 0 (NVIDIA's compute-domain plugin advertises no other channel and no GPU).
#[test]
fn slices_of_the_compute_domain_driver_are_its_channel_and_daemon() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dra-plugin"))
        .args([
            "slices",
            "--backend",
            "simulated",
            "--profile",
            "h100-80gb:8",
        ])
        .args([
            "--node-name",
            "n1",
            "--driver-name",
            "compute-domain.nvidia.com",
        ])
        .args(["-o", "json"])
        .output()
        .expect("run dra-plugin");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{list:#}");
    let spec = &items[0]["spec"];
    assert_eq!(spec["driver"], "compute-domain.nvidia.com");
    assert_eq!(spec["nodeName"], "n1");
    let devices: Vec<(String, String, i64)> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let a = &d["attributes"];
            let kind = a["type"]["string"].as_str().unwrap().to_string();
            (
                d["name"].as_str().unwrap().to_string(),
                kind,
                a["id"]["int"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        devices,
        [
            ("channel-0".to_string(), "channel".to_string(), 0),
            ("daemon-0".to_string(), "daemon".to_string(), 0)
        ]
    );
}
