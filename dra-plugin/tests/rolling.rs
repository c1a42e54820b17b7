//! Rolling upgrades: two plugin processes (here two `run_until`s, each with its own sockets,
//! lock handle and records) on one plugin directory, as the old and new pod of a DaemonSet with
//! `maxSurge`. The kubelet may call either; every claim must be prepared once, seen by both, and
//! unpreparable by the one that did not prepare it.
mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use dra_plugin::grpc::client::{get_info, unix_channel};
use dra_plugin_core::checkpoint::read_newest;
use kubelet_proto::dra_v1::{self as v1, dra_plugin_client::DraPluginClient};
use tokio::sync::watch;

struct Plugin {
    uid: &'static str,
    dir: PathBuf,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

fn reg_socket(dir: &Path, uid: &str) -> PathBuf {
    dir.join(format!("registry/gpu.nvidia.com-{uid}-reg.sock"))
}

async fn start(dir: &Path, uid: &'static str) -> Plugin {
    common::offline_dir(dir);
    let mut args = common::offline_args(dir, "h100-80gb:8", "", None);
    args.rolling_update_uid = Some(uid.into());
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(dra_plugin::run::run_until(args, rx));
    // Polls until registration answers: no timing is asserted.
    while get_info(&reg_socket(dir, uid)).await.is_err() {
        assert!(!task.is_finished(), "plugin {uid} stopped");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Plugin {
        uid,
        dir: dir.to_path_buf(),
        stop,
        task,
    }
}

impl Plugin {
    async fn client(&self) -> DraPluginClient<tonic::transport::Channel> {
        let sock = self.dir.join(format!("plugin/dra-{}.sock", self.uid));
        DraPluginClient::new(unix_channel(&sock).await.unwrap())
    }

    async fn stop(self) {
        self.stop.send(true).unwrap();
        self.task.await.unwrap().unwrap();
    }
}

fn claim(dir: &Path, i: usize) -> v1::Claim {
    let (name, uid) = (format!("c{i}"), format!("uid-{i}"));
    let result = serde_json::json!({"request": "gpu", "driver": "gpu.nvidia.com",
        "pool": "node-1", "device": format!("gpu-{i}")});
    let obj = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": [result]}}}
    });
    common::put_claim(dir, &obj);
    v1::Claim {
        namespace: "ns".into(),
        uid,
        name,
    }
}

fn recorded(dir: &Path) -> Vec<String> {
    let data = read_newest(&dir.join("plugin/checkpoint.json")).unwrap();
    data.claims.into_keys().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_and_new_plugin_serve_side_by_side_and_hand_over() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = start(d, "aaaa").await;
    let first = claim(d, 0);
    let r0 = common::prepare(&mut a.client().await, &first).await;
    assert_eq!(r0.error, "");

    let b = start(d, "bbbb").await;
    let info = get_info(&reg_socket(d, "bbbb")).await.unwrap();
    assert!(info.endpoint.ends_with("plugin/dra-bbbb.sock"), "{info:?}");
    assert!(reg_socket(d, "aaaa").exists(), "B's start kept A's socket");
    // Both serve at once: claims 1-7 alternate between them, concurrently.
    let calls = (1..8).map(|i| {
        let c = claim(d, i);
        let p = if i % 2 == 0 { &a } else { &b };
        async move { (c.clone(), common::prepare(&mut p.client().await, &c).await) }
    });
    let prepared = futures::future::join_all(calls).await;
    for (c, r) in &prepared {
        assert_eq!(r.error, "", "{}", c.uid);
    }
    // On disk, both plugins' claims: neither wrote from records missing the other's.
    assert_eq!(recorded(d).len(), 8, "{:?}", recorded(d));
    // The other plugin knows each claim as prepared: same answer, nothing prepared twice.
    for (i, (c, r)) in prepared.iter().enumerate() {
        let other = if i % 2 == 0 { &a } else { &b };
        assert_eq!(&common::prepare(&mut other.client().await, c).await, r);
    }
    assert_eq!(common::prepare(&mut b.client().await, &first).await, r0);

    // A goes (the DaemonSet deletes the old pod): only its own sockets with it.
    a.stop().await;
    assert!(!reg_socket(d, "aaaa").exists() && !d.join("plugin/dra-aaaa.sock").exists());
    assert!(reg_socket(d, "bbbb").exists() && d.join("plugin/dra-bbbb.sock").exists());
    let mut client = b.client().await;
    assert_eq!(common::unprepare(&mut client, &first).await, "");
    for (c, _) in &prepared {
        assert_eq!(common::unprepare(&mut client, c).await, "");
    }
    assert!(recorded(d).is_empty(), "{:?}", recorded(d));
    let specs: Vec<_> = std::fs::read_dir(d.join("cdi")).unwrap().collect();
    assert!(specs.is_empty(), "{specs:?}");
    b.stop().await;
}
