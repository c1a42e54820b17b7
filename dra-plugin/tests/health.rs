//! The kubelet health stream over the real DRA socket, driven by injected simulated faults.
mod common;

use std::time::Duration;

use dra_plugin::grpc::client::{get_info, unix_channel};
use kubelet_proto::dra_v1::{self as v1, dra_plugin_client::DraPluginClient};
use kubelet_proto::health_v1::{self as h1, dra_resource_health_client::DraResourceHealthClient};
use kubelet_proto::health_v1alpha1::{
    self as h1a, dra_resource_health_client::DraResourceHealthClient as AlphaClient,
};
use tokio::sync::watch;

async fn next<T>(s: &mut tonic::Streaming<T>) -> T {
    tokio::time::timeout(Duration::from_secs(15), s.message())
        .await
        .expect("a message within the heartbeat")
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn prepared_devices_turn_unhealthy_and_recover() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    common::offline_dir(dir);
    let claim = serde_json::json!({
        "metadata": {"name": "c", "namespace": "ns", "uid": "uid-h"},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-2"}]}}}
    });
    common::put_claim(dir, &claim);
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(dra_plugin::run::run_until(
        common::offline_args(dir, "h100-80gb:4", "NVMLDeviceHealthCheck=true", None),
        rx,
    ));
    let reg = dir.join("registry/gpu.nvidia.com-reg.sock");
    let mut info = None;
    for _ in 0..200 {
        if let Ok(i) = get_info(&reg).await {
            info = Some(i);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        info.unwrap().supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth"
        ]
    );

    let channel = unix_channel(&dir.join("plugin/dra.sock")).await.unwrap();
    let c = v1::Claim {
        namespace: "ns".into(),
        uid: "uid-h".into(),
        name: "c".into(),
    };
    let r = common::prepare(&mut DraPluginClient::new(channel.clone()), &c).await;
    assert_eq!(r.error, "");

    let mut stream = DraResourceHealthClient::new(channel.clone())
        .node_watch_resources(h1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = next(&mut stream).await;
    assert_eq!(first.devices.len(), 1);
    let d = &first.devices[0];
    assert_eq!(d.device.as_ref().unwrap().device_name, "gpu-2");
    assert_eq!(d.health, h1::HealthStatus::Healthy as i32);
    assert!(d.health_check_timeout_seconds > 0 && d.last_updated_time > 0);

    let inject = |line: &str| {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("plugin/simulated-health-events"))
            .unwrap();
        writeln!(f, "{line}").unwrap();
    };
    inject("gpu-3 xid 79"); // another GPU: the prepared device stays healthy
    inject("gpu-2 xid 79");
    let mut seen = next(&mut stream).await;
    while seen.devices[0].health != h1::HealthStatus::Unhealthy as i32 {
        seen = next(&mut stream).await;
    }
    assert_eq!(seen.devices[0].message, "XID 79");

    // v1alpha1 (kubelets 1.34-1.36) sees the same.
    let mut alpha = AlphaClient::new(channel.clone())
        .node_watch_resources(h1a::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        next(&mut alpha).await.devices[0].health,
        h1a::HealthStatus::Unhealthy as i32
    );

    inject("gpu-2 healthy");
    let mut seen = next(&mut stream).await;
    while seen.devices[0].health != h1::HealthStatus::Healthy as i32 {
        seen = next(&mut stream).await;
    }
    stop.send(true).unwrap();
    task.await.unwrap().unwrap();
}
