//! The plugin over its real Unix sockets, with a client built from our own protos: registration,
//! prepare/unprepare on v1 and v1beta1, per-claim errors, concurrency, restarts and a corrupt
//! checkpoint. Claims come from files (offline mode), so no API server is needed here.
mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use dra_plugin::grpc::client::{get_info, unix_channel};
use kubelet_proto::dra_v1::{self as v1, dra_plugin_client::DraPluginClient};
use kubelet_proto::dra_v1beta1::{
    self as v1beta1, dra_plugin_client::DraPluginClient as BetaClient,
};
use kubelet_proto::registration::{RegistrationStatus, registration_client::RegistrationClient};
use tokio::sync::watch;

struct Plugin {
    dir: PathBuf,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn start(dir: &Path) -> Plugin {
    start_with(dir, "", None).await
}

async fn start_with(dir: &Path, gates: &str, layout: Option<&str>) -> Plugin {
    common::offline_dir(dir);
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(dra_plugin::run::run_until(
        common::offline_args(dir, "h100-80gb:8", gates, layout),
        rx,
    ));
    let reg = dir.join("registry/gpu.nvidia.com-reg.sock");
    for _ in 0..200 {
        if get_info(&reg).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Plugin {
        dir: dir.to_path_buf(),
        stop,
        task,
    }
}

impl Plugin {
    async fn stop(self) {
        self.stop.send(true).unwrap();
        self.task.await.unwrap().unwrap();
    }

    async fn v1(&self) -> DraPluginClient<tonic::transport::Channel> {
        DraPluginClient::new(
            unix_channel(&self.dir.join("plugin/dra.sock"))
                .await
                .unwrap(),
        )
    }
}

/// Writes an allocated ResourceClaim for the offline claim source.
fn claim(dir: &Path, name: &str, uid: &str, results: &[(&str, &str)]) -> v1::Claim {
    let results: Vec<_> = results
        .iter()
        .map(|(req, dev)| serde_json::json!({"request": req, "driver": "gpu.nvidia.com", "pool": "node-1", "device": dev}))
        .collect();
    let obj = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": results}}}
    });
    common::put_claim(dir, &obj);
    v1::Claim {
        namespace: "ns".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

#[tokio::test]
async fn registers_with_v1_first_and_an_absolute_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    // A stale socket file from a crashed predecessor must not stop us.
    std::fs::create_dir_all(dir.path().join("registry")).unwrap();
    std::fs::write(dir.path().join("registry/gpu.nvidia.com-reg.sock"), "stale").unwrap();
    let p = start(dir.path()).await;
    let reg = dir.path().join("registry/gpu.nvidia.com-reg.sock");
    let info = get_info(&reg).await.unwrap();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.nvidia.com");
    assert_eq!(
        info.endpoint,
        dir.path().join("plugin/dra.sock").to_string_lossy()
    );
    assert!(Path::new(&info.endpoint).is_absolute());
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    let mut rc = RegistrationClient::new(unix_channel(&reg).await.unwrap());
    rc.notify_registration_status(RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .unwrap();
    let refused = rc
        .notify_registration_status(RegistrationStatus {
            plugin_registered: false,
            error: "no".into(),
        })
        .await;
    assert!(
        refused.is_err(),
        "a refused registration is reported back as an error"
    );
    p.stop().await;
    assert!(!reg.exists(), "sockets are removed on shutdown");
    assert!(!dir.path().join("plugin/dra.sock").exists());
}

#[tokio::test]
async fn prepare_and_unprepare_over_v1() {
    let dir = tempfile::tempdir().unwrap();
    let p = start(dir.path()).await;
    let c = claim(
        dir.path(),
        "train",
        "uid-1",
        &[("gpus", "gpu-0"), ("gpus", "gpu-1")],
    );
    let mut client = p.v1().await;
    let r = common::prepare(&mut client, &c).await;
    assert_eq!(r.error, "");
    assert_eq!(r.devices.len(), 2);
    assert_eq!(r.devices[0].pool_name, "node-1");
    assert_eq!(r.devices[0].request_names, ["gpus"]);
    assert_eq!(
        r.devices[1].cdi_device_ids,
        ["k8s.gpu.nvidia.com/claim=uid-1-gpu-1"]
    );
    let spec = dir.path().join("cdi/k8s.gpu.nvidia.com-claim_uid-1.json");
    let text = std::fs::read_to_string(&spec).unwrap();
    assert!(
        text.contains("\"name\":\"uid-1-gpu-1\"")
            && text.contains("/dev/nvidia1")
            && text.contains("NVIDIA_VISIBLE_DEVICES=GPU-"),
        "{text}"
    );
    // Idempotent.
    assert_eq!(common::prepare(&mut client, &c).await, r);
    assert_eq!(common::unprepare(&mut client, &c).await, "");
    assert!(!spec.exists());
    assert_eq!(
        common::unprepare(&mut client, &c).await,
        "",
        "unknown claims unprepare fine"
    );
    p.stop().await;
}

#[tokio::test]
async fn v1beta1_serves_the_same_claims() {
    let dir = tempfile::tempdir().unwrap();
    let p = start_with(dir.path(), "", Some("all-3g.40gb")).await;
    let c = claim(
        dir.path(),
        "mig",
        "uid-b",
        &[("gpu/mig-slice", "gpu-3-mig-3g40gb-9-4")],
    );
    let mut client = BetaClient::new(
        unix_channel(&dir.path().join("plugin/dra.sock"))
            .await
            .unwrap(),
    );
    let beta = v1beta1::Claim {
        namespace: c.namespace,
        uid: c.uid,
        name: c.name,
    };
    let resp = client
        .node_prepare_resources(v1beta1::NodePrepareResourcesRequest {
            claims: vec![beta.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    let r = &resp.claims["uid-b"];
    assert_eq!(r.error, "");
    assert_eq!(r.devices[0].device_name, "gpu-3-mig-3g40gb-9-4");
    assert_eq!(
        r.devices[0].request_names,
        ["gpu"],
        "subrequest names are stripped"
    );
    let un = client
        .node_unprepare_resources(v1beta1::NodeUnprepareResourcesRequest { claims: vec![beta] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(un.claims["uid-b"].error, "");
    p.stop().await;
}

#[tokio::test]
async fn one_bad_claim_never_fails_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let p = start(dir.path()).await;
    let good = claim(dir.path(), "good", "uid-g", &[("gpu", "gpu-2")]);
    let bad = claim(dir.path(), "bad", "uid-x", &[("gpu", "gpu-42")]);
    let missing = v1::Claim {
        namespace: "ns".into(),
        uid: "uid-m".into(),
        name: "missing".into(),
    };
    let replaced = v1::Claim {
        namespace: "ns".into(),
        uid: "uid-old".into(),
        name: "good".into(),
    };
    let resp = p
        .v1()
        .await
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![good, bad, missing, replaced],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.claims.len(), 4, "every claim gets an entry");
    assert_eq!(resp.claims["uid-g"].error, "");
    assert!(
        resp.claims["uid-x"].error.contains("no such GPU"),
        "{}",
        resp.claims["uid-x"].error
    );
    assert!(resp.claims["uid-m"].error.contains("not found"));
    assert!(resp.claims["uid-old"].error.contains("re-created"));
    p.stop().await;
}

/// The codec's buffers start small (`kubelet_proto::codec::BUFFER_SIZE`); a pod with many
/// claims sends a request many times that size and gets back an answer larger than tonic's
/// default 8 KiB.
#[tokio::test]
async fn one_call_with_many_claims_outgrows_the_codec_buffers() {
    use prost::Message;
    let dir = tempfile::tempdir().unwrap();
    let p = start_with(dir.path(), "", Some("all-1g.10gb")).await;
    let claims: Vec<v1::Claim> = (0..8)
        .flat_map(|gpu| (0..7).map(move |start| (gpu, start)))
        .map(|(gpu, start)| {
            claim(
                dir.path(),
                &format!("many-{gpu}-{start}"),
                &format!("uid-many-{gpu}-{start}-{}", "x".repeat(40)),
                &[("mig", &format!("gpu-{gpu}-mig-1g10gb-19-{start}"))],
            )
        })
        .collect();
    let req = v1::NodePrepareResourcesRequest {
        claims: claims.clone(),
    };
    assert!(req.encoded_len() > 4 * kubelet_proto::codec::BUFFER_SIZE);
    let mut client = p.v1().await;
    let resp = client
        .node_prepare_resources(req)
        .await
        .unwrap()
        .into_inner();
    assert!(resp.encoded_len() > 8 * 1024, "{}", resp.encoded_len());
    assert_eq!(resp.claims.len(), 56);
    for c in &claims {
        let r = &resp.claims[&c.uid];
        assert_eq!(r.error, "");
        assert_eq!(
            r.devices[0].cdi_device_ids,
            [format!(
                "k8s.gpu.nvidia.com/claim={}-{}",
                c.uid, r.devices[0].device_name
            )]
        );
    }
    let resp = client
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner();
    assert!(resp.claims.values().all(|r| r.error.is_empty()));
    assert_eq!(resp.claims.len(), 56);
    p.stop().await;
}

#[tokio::test]
async fn concurrent_calls_for_different_claims() {
    let dir = tempfile::tempdir().unwrap();
    let p = start_with(dir.path(), "", Some("all-1g.10gb")).await;
    let mut tasks = Vec::new();
    for gpu in 0..8 {
        for start in 0..7 {
            let c = claim(
                dir.path(),
                &format!("c-{gpu}-{start}"),
                &format!("uid-{gpu}-{start}"),
                &[("mig", &format!("gpu-{gpu}-mig-1g10gb-19-{start}"))],
            );
            let mut client = p.v1().await;
            tasks.push(tokio::spawn(async move {
                assert_eq!(common::prepare(&mut client, &c).await.error, "");
                assert_eq!(common::unprepare(&mut client, &c).await, "");
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        std::fs::read_dir(dir.path().join("cdi")).unwrap().count(),
        0
    );
    p.stop().await;
}

#[tokio::test]
async fn a_clean_stop_leaves_the_newest_checkpoint_in_the_first_file() {
    use dra_plugin_core::checkpoint::{decode, read_newest};
    let dir = tempfile::tempdir().unwrap();
    let p = start(dir.path()).await;
    for (name, uid, dev) in [("a", "uid-a", "gpu-1"), ("b", "uid-b", "gpu-2")] {
        let c = claim(dir.path(), name, uid, &[("gpu", dev)]);
        assert_eq!(common::prepare(&mut p.v1().await, &c).await.error, "");
    }
    p.stop().await;
    // Two writes: the second went to checkpoint.json.alt, so stopping wrote the first file again,
    // which is all a version from before the alternate file reads.
    let cp = dir.path().join("plugin/checkpoint.json");
    let first = decode(&std::fs::read(&cp).unwrap()).unwrap();
    assert_eq!(first.seq, 3);
    assert_eq!(first, read_newest(&cp).unwrap());
    assert_eq!(first.claims.keys().collect::<Vec<_>>(), ["uid-a", "uid-b"]);
}

#[tokio::test]
async fn prepared_claims_survive_a_restart_and_a_corrupt_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let p = start(dir.path()).await;
    let c = claim(dir.path(), "keep", "uid-k", &[("gpu", "gpu-5")]);
    let first = p
        .v1()
        .await
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![c.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    p.stop().await;

    let p = start(dir.path()).await;
    let again = p
        .v1()
        .await
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![c.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again, first);
    // Another claim may not take the same GPU while it is prepared.
    let thief = claim(dir.path(), "thief", "uid-t", &[("gpu", "gpu-5")]);
    let r = p
        .v1()
        .await
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![thief],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        r.claims["uid-t"].error.contains("already prepared"),
        "{}",
        r.claims["uid-t"].error
    );
    p.stop().await;

    // Both files of the checkpoint unreadable (one alone would leave the other's state to load).
    for f in ["checkpoint.json", "checkpoint.json.alt"] {
        std::fs::write(dir.path().join("plugin").join(f), "{garbage").unwrap();
    }
    let p = start(dir.path()).await;
    let after = p
        .v1()
        .await
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![c.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(after, first, "rebuilt from the CDI spec; still prepared");
    let aside: Vec<_> = std::fs::read_dir(dir.path().join("plugin"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.contains("corrupt"))
        .collect();
    assert_eq!(aside.len(), 2, "the corrupt files are kept for inspection");
    p.stop().await;

    // A reboot (new boot ID) drops prepared state: the kubelet prepares again.
    std::fs::write(dir.path().join("boot_id"), "boot-b\n").unwrap();
    let p = start(dir.path()).await;
    assert!(
        !dir.path()
            .join("cdi/k8s.gpu.nvidia.com-claim_uid-k.json")
            .exists()
    );
    p.stop().await;
}

#[tokio::test]
async fn each_socket_answers_unimplemented_for_services_it_does_not_serve() {
    let dir = tempfile::tempdir().unwrap();
    let p = start(dir.path()).await;
    let dra = unix_channel(&dir.path().join("plugin/dra.sock"))
        .await
        .unwrap();
    let err = RegistrationClient::new(dra.clone())
        .get_info(kubelet_proto::registration::InfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented, "{err}");
    // The health service is off unless asked for, so neither of its versions answers here.
    let err = kubelet_proto::health_v1::dra_resource_health_client::DraResourceHealthClient::new(
        dra.clone(),
    )
    .node_watch_resources(kubelet_proto::health_v1::NodeWatchResourcesRequest {})
    .await
    .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented, "{err}");
    let reg = unix_channel(&dir.path().join("registry/gpu.nvidia.com-reg.sock"))
        .await
        .unwrap();
    let err = DraPluginClient::new(reg)
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![] })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented, "{err}");
    // The DRA socket still serves its own services on the same connection.
    let r = DraPluginClient::new(dra)
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![] })
        .await
        .unwrap()
        .into_inner();
    assert!(r.claims.is_empty());
    p.stop().await;
}

#[tokio::test]
async fn stopping_closes_connections_the_kubelet_holds_open() {
    let dir = tempfile::tempdir().unwrap();
    let p = start(dir.path()).await;
    let mut client = p.v1().await;
    let c = claim(dir.path(), "held", "uid-held", &[("gpu", "gpu-1")]);
    assert_eq!(common::prepare(&mut client, &c).await.error, "");
    p.stop().await;
    // Had the idle connection outlived the server, this call would still be answered.
    let gone = client
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: vec![c] })
        .await;
    assert!(gone.is_err(), "{gone:?}");
}
