use std::collections::BTreeMap;
use std::sync::Arc;

use super::super::{Checkpoint, ClaimRecord, ClaimState, read_newest};
use super::StartupLock;

fn record() -> ClaimRecord {
    ClaimRecord {
        state: ClaimState::PrepareCompleted,
        namespace: "ns".into(),
        name: "c".into(),
        devices: vec![],
        hardware: vec![],
        unknown: BTreeMap::new(),
    }
}

/// A second "process": its own lock file handle and records, as the new pod of an upgrade has.
/// The lock is taken on the blocking pool, as it may wait for the other one.
async fn open(path: &std::path::Path, id: &str) -> Arc<Checkpoint> {
    let (p, id) = (path.to_path_buf(), id.to_string());
    let lock = tokio::task::spawn_blocking(move || StartupLock::acquire(&p, &id))
        .await
        .unwrap()
        .unwrap();
    let (cp, _) = Checkpoint::load(path, "boot").unwrap();
    drop(cp.share(lock));
    Arc::new(cp)
}

/// Records `uid` under a lease, as prepare does.
async fn add(cp: &Checkpoint, uid: &str) {
    let _lease = cp.lease().await.unwrap();
    cp.update(|c| {
        // Every write starts from the newest records: a lost one would be missing here.
        c.insert(uid.to_string(), record());
    })
    .await
    .unwrap();
}

fn uids(cp: &Checkpoint) -> Vec<String> {
    cp.claims().into_keys().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_process_sees_the_others_writes_before_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    let a = open(&path, "a").await;
    add(&a, "u1").await;
    let b = open(&path, "b").await;
    assert_eq!(uids(&b), ["u1"]);
    add(&b, "u2").await;
    add(&a, "u3").await;
    assert_eq!(uids(&a), ["u1", "u2", "u3"]);
    add(&b, "u4").await;
    assert_eq!(uids(&b), ["u1", "u2", "u3", "u4"]);
    let on_disk: Vec<_> = read_newest(&path).unwrap().claims.into_keys().collect();
    assert_eq!(on_disk, ["u1", "u2", "u3", "u4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_lose_no_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    let a = open(&path, "a").await;
    let b = open(&path, "b").await;
    let mut tasks = Vec::new();
    for i in 0..40 {
        let cp = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(
            async move { add(&cp, &format!("u{i:02}")).await },
        ));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let on_disk = read_newest(&path).unwrap().claims;
    assert_eq!(on_disk.len(), 40, "{:?}", on_disk.keys());
}

#[tokio::test]
async fn an_unshared_checkpoint_takes_no_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    let (cp, _) = Checkpoint::load(&path, "boot").unwrap();
    add(&cp, "u1").await;
    assert!(!super::lock_path(&path).exists());
}
