//! The metrics server over a real TCP socket, at the path NVIDIA's chart sets: alone, and in an
//! offline plugin whose prepare and unprepare calls NVIDIA's series count.
mod common;

use std::sync::Arc;
use std::time::Duration;

use dra_plugin::grpc::client::{get_info, unix_channel};
use dra_plugin::metrics::{Metrics, nvidia};
use kubelet_proto::dra_v1::{self as v1, dra_plugin_client::DraPluginClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// `GET path` over HTTP/1.0: the status line and the body.
async fn get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.0\r\nHost: test\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).await.unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

#[tokio::test]
async fn serves_nvidia_series_at_the_metrics_path_over_tcp() {
    let metrics = Arc::new(Metrics::new());
    metrics
        .nvidia
        .init("gpu.nvidia.com", "node-1", nvidia::GPU_DEVICE_TYPES);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let addr = "127.0.0.1:0".parse().unwrap();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let bound = dra_plugin::metrics::serve(addr, "/custom/metrics", metrics, shutdown)
        .await
        .unwrap();

    let (status, body) = get(bound, "/custom/metrics").await;
    assert!(status.contains(" 200"), "{status}");
    let zero = r#"nvidia_dra_requests_total{driver="gpu.nvidia.com",operation="prepare"} 0"#;
    assert!(body.contains(zero), "{body}");
    assert!(
        body.contains("# TYPE gpu_dra_prepared_devices gauge"),
        "{body}"
    );
    let (status, _) = get(bound, "/metrics").await;
    assert!(status.contains(" 404"), "{status}");
    let (status, body) = get(bound, "/healthz").await;
    assert!(status.contains(" 200") && body == "ok", "{status} {body}");
    stop.send(()).unwrap();
}

fn put_gpu_claim(dir: &std::path::Path, name: &str, device: &str) -> v1::Claim {
    let result = serde_json::json!({"request": "r", "driver": "gpu.nvidia.com", "pool": "node-1", "device": device});
    common::put_claim(
        dir,
        &serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": [result]}}}
        }),
    );
    v1::Claim {
        namespace: "ns".into(),
        uid: format!("uid-{name}"),
        name: name.into(),
    }
}

#[tokio::test]
async fn a_running_plugin_counts_prepares_in_nvidias_series() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    common::offline_dir(dir);
    // A free port: bound, read, released (a race with another process is unlikely here).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut args = common::offline_args(dir, "h100-80gb:2", "", None);
    args.metrics_port = None;
    args.http_endpoint = Some(format!("127.0.0.1:{port}"));
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(dra_plugin::run::run_until(args, rx));
    let reg = dir.join("registry/gpu.nvidia.com-reg.sock");
    for _ in 0..200 {
        if get_info(&reg).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let channel = unix_channel(&dir.join("plugin/dra.sock")).await.unwrap();
    let mut client = DraPluginClient::new(channel);
    let good = put_gpu_claim(dir, "good", "gpu-0");
    assert_eq!(common::prepare(&mut client, &good).await.error, "");
    let missing = v1::Claim {
        namespace: "ns".into(),
        uid: "uid-x".into(),
        name: "x".into(),
    };
    assert_ne!(common::prepare(&mut client, &missing).await.error, "");
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let (_, body) = get(addr, "/metrics").await;
    for line in [
        r#"nvidia_dra_requests_total{driver="gpu.nvidia.com",operation="prepare"} 1"#,
        r#"nvidia_dra_requests_total{driver="gpu.nvidia.com",operation="unprepare"} 0"#,
        r#"nvidia_dra_node_prepare_errors_total{driver="gpu.nvidia.com",error_type="prepare_devices"} 1"#,
        r#"nvidia_dra_prepared_devices{node="node-1",driver="gpu.nvidia.com",device_type="gpu"} 1"#,
    ] {
        assert!(body.contains(line), "{line}\n{body}");
    }
    assert_eq!(common::unprepare(&mut client, &good).await, "");
    let (_, body) = get(addr, "/metrics").await;
    for line in [
        r#"nvidia_dra_requests_total{driver="gpu.nvidia.com",operation="unprepare"} 1"#,
        r#"nvidia_dra_prepared_devices{node="node-1",driver="gpu.nvidia.com",device_type="gpu"} 0"#,
    ] {
        assert!(body.contains(line), "{line}\n{body}");
    }
    stop.send(true).unwrap();
    task.await.unwrap().unwrap();
}
