use super::*;

fn record(state: ClaimState) -> ClaimRecord {
    ClaimRecord {
        state,
        namespace: "ns".into(),
        name: "c".into(),
        devices: vec![PreparedDevice {
            request_names: vec!["gpu".into()],
            pool_name: "n1".into(),
            device_name: "gpu-0".into(),
            cdi_device_ids: vec!["k8s.gpu.nvidia.com/claim=u1-gpu-0".into()],
            share_id: None,
            uuid: None,
        }],
        hardware: vec![],
        unknown: BTreeMap::new(),
    }
}

/// One file of a checkpoint as it is on disk.
fn file_data(p: &Path) -> CheckpointData {
    decode(&std::fs::read(p).unwrap()).unwrap()
}

/// Records `uid` as prepared, through the checkpoint.
async fn add(cp: &Checkpoint, uid: &str) -> Result<(), Error> {
    cp.update(|c| {
        c.insert(uid.to_string(), record(ClaimState::PrepareCompleted));
    })
    .await
}

/// Records `u0`, `u1`, … `u<n-1>` as prepared, one write each.
async fn add_many(cp: &Checkpoint, n: usize) {
    for i in 0..n {
        add(cp, &format!("u{i}")).await.unwrap();
    }
}

#[tokio::test]
async fn survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    let (cp, outcome) = Checkpoint::load(&path, "boot-1").unwrap();
    assert_eq!(outcome, LoadOutcome::Fresh);
    add(&cp, "u1").await.unwrap();
    cp.update(|c| c.insert("u2".into(), record(ClaimState::PrepareStarted)))
        .await
        .unwrap();
    drop(cp);
    let (cp, outcome) = Checkpoint::load(&path, "boot-1").unwrap();
    assert_eq!(outcome, LoadOutcome::Loaded);
    assert_eq!(cp.get("u1").unwrap(), record(ClaimState::PrepareCompleted));
    assert_eq!(
        cp.get("u2").unwrap().state,
        ClaimState::PrepareStarted,
        "a crash between the phases is visible"
    );
}

#[tokio::test]
async fn a_reboot_drops_prepared_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    let (cp, _) = Checkpoint::load(&path, "boot-1").unwrap();
    add(&cp, "u1").await.unwrap();
    drop(cp);
    let (cp, outcome) = Checkpoint::load(&path, "boot-2").unwrap();
    assert_eq!(
        outcome,
        LoadOutcome::Rebooted {
            dropped: vec!["u1".into()]
        }
    );
    assert!(cp.claims().is_empty());
}

#[test]
fn corrupt_files_are_moved_aside_not_fatal() {
    for bad in [
        &b"{not json"[..],
        b"",
        br#"{"version":1,"checksum":"00","data":{"claims":{}}}"#,
        br#"{"version":99,"checksum":"x","data":{}}"#,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.json");
        std::fs::write(&path, bad).unwrap();
        let (cp, outcome) = Checkpoint::load(&path, "boot-1").unwrap();
        let LoadOutcome::Corrupt { moved_to, reason } = outcome else {
            panic!("{outcome:?}")
        };
        assert!(!reason.is_empty());
        assert_eq!(
            std::fs::read(&moved_to).unwrap(),
            bad,
            "the evidence is kept"
        );
        assert!(!path.exists());
        assert!(cp.claims().is_empty());
    }
}

#[tokio::test]
async fn fields_from_a_newer_version_are_tolerated_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    let data = r#"{"nodeBootID":"boot-1","futureTopLevel":{"a":1},"claims":{"u1":{"state":"PrepareCompleted","namespace":"ns","name":"c","devices":[],"futureField":[1,2]}}}"#;
    let file = format!(
        r#"{{"version":1,"checksum":"{}","data":{data}}}"#,
        checksum(data.as_bytes())
    );
    std::fs::write(&path, file).unwrap();
    let (cp, outcome) = Checkpoint::load(&path, "boot-1").unwrap();
    assert_eq!(outcome, LoadOutcome::Loaded);
    assert_eq!(
        cp.get("u1").unwrap().unknown["futureField"],
        serde_json::json!([1, 2])
    );
    cp.update(|c| c.get_mut("u1").unwrap().name = "renamed".into())
        .await
        .unwrap();
    let reread = read_newest(&path).unwrap();
    assert_eq!(
        reread.claims["u1"].unknown["futureField"],
        serde_json::json!([1, 2])
    );
    assert_eq!(
        reread.unknown["futureTopLevel"],
        serde_json::json!({"a": 1})
    );
}

#[tokio::test]
async fn concurrent_updates_all_reach_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    let (cp, _) = Checkpoint::load(&path, "boot-1").unwrap();
    let cp = std::sync::Arc::new(cp);
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let cp = cp.clone();
            tokio::spawn(async move {
                cp.update(|c| c.insert(format!("u{i}"), record(ClaimState::PrepareCompleted)))
                    .await
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(read_newest(&path).unwrap().claims.len(), 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn side_files_ride_the_group_commit_and_fail_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    let (cp, _) = Checkpoint::load(&path, "boot-1").unwrap();
    let cp = std::sync::Arc::new(cp);
    // A regular file where a directory should be: writes under it cannot succeed.
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, "x").unwrap();
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let cp = cp.clone();
            // The CDI root does not exist yet: the first write creates it.
            let file = match i % 8 {
                7 => blocker.join(format!("spec-{i}.json")),
                _ => dir.path().join("cdi").join(format!("spec-{i}.json")),
            };
            tokio::spawn(async move {
                let r = cp
                    .update_with_file(
                        |c| c.insert(format!("u{i}"), record(ClaimState::PrepareCompleted)),
                        "writing the CDI spec",
                        file.clone(),
                        format!("{{\"claim\":{i}}}").into_bytes(),
                    )
                    .await;
                (i, file, r)
            })
        })
        .collect();
    for t in tasks {
        let (i, file, r) = t.await.unwrap();
        if i % 8 == 7 {
            let e = r
                .expect_err("a file under a regular file cannot be written")
                .to_string();
            assert!(
                e.contains("writing the CDI spec") && e.contains(&format!("spec-{i}.json")),
                "the error names what and which file: {e}"
            );
        } else {
            r.unwrap();
            assert_eq!(
                std::fs::read_to_string(&file).unwrap(),
                format!("{{\"claim\":{i}}}")
            );
        }
    }
    // The records went to disk either way: the caller rolls back a claim whose file failed.
    assert_eq!(read_newest(&path).unwrap().claims.len(), 32);
    assert!(
        std::fs::read_dir(dir.path().join("cdi"))
            .unwrap()
            .all(|e| !e.unwrap().file_name().to_string_lossy().contains(".tmp-")),
        "no temp files left behind"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removals_ride_the_group_commit_and_fail_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    let (cp, _) = Checkpoint::load(&path, "boot-1").unwrap();
    let cp = std::sync::Arc::new(cp);
    let cdi = dir.path().join("cdi");
    std::fs::create_dir(&cdi).unwrap();
    for i in 0..16 {
        cp.update_with_file(
            |c| c.insert(format!("u{i}"), record(ClaimState::PrepareCompleted)),
            "writing the CDI spec",
            cdi.join(format!("spec-{i}.json")),
            b"{}".to_vec(),
        )
        .await
        .unwrap();
    }
    // A non-empty directory where spec 15 should be: unlink fails on it.
    std::fs::remove_file(cdi.join("spec-15.json")).unwrap();
    std::fs::create_dir_all(cdi.join("spec-15.json").join("inside")).unwrap();
    // Spec 14 is already gone: removing it again is no error (unprepare is idempotent).
    std::fs::remove_file(cdi.join("spec-14.json")).unwrap();
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let cp = cp.clone();
            let file = cdi.join(format!("spec-{i}.json"));
            tokio::spawn(async move {
                let r = cp
                    .update_removing_file(
                        |c| {
                            c.remove(&format!("u{i}"));
                        },
                        "removing the CDI spec",
                        file.clone(),
                    )
                    .await;
                (i, file, r)
            })
        })
        .collect();
    for t in tasks {
        let (i, file, r) = t.await.unwrap();
        if i == 15 {
            let e = r.expect_err("a directory is not unlinked").to_string();
            assert!(
                e.contains("removing the CDI spec") && e.contains("spec-15.json"),
                "the error names what and which file: {e}"
            );
        } else {
            r.unwrap();
            assert!(!file.exists(), "spec {i} removed");
        }
    }
    assert!(read_newest(&path).unwrap().claims.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_gone_mid_flush_does_not_stall_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    let (cp, _) = Checkpoint::load(&path, "boot-1").unwrap();
    let cp = std::sync::Arc::new(cp);
    for round in 0..20 {
        let first = tokio::spawn({
            let cp = cp.clone();
            async move {
                cp.update(|c| c.insert(format!("a{round}"), record(ClaimState::PrepareCompleted)))
                    .await
            }
        });
        // Drop the first caller while its flush runs (a kubelet call cancelled mid-prepare).
        for _ in 0..10_000 {
            if cp.shared.flushing.load(Ordering::Acquire) {
                break;
            }
            tokio::task::yield_now().await;
        }
        first.abort();
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            cp.update(|c| c.insert(format!("b{round}"), record(ClaimState::PrepareCompleted))),
        )
        .await
        .expect("the next update does not wait for a flush nobody finishes")
        .unwrap();
    }
    let on_disk = read_newest(&path).unwrap().claims;
    assert!((0..20).all(|r| on_disk.contains_key(&format!("b{r}"))));
}

#[tokio::test]
async fn writes_alternate_between_two_files_and_loading_takes_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    let (cp, _) = Checkpoint::load(&path, "boot-1").unwrap();
    add_many(&cp, 5).await;
    drop(cp);
    let a = file_data(&path);
    let b = file_data(&alternate(&path));
    assert_eq!(
        (a.seq, b.seq),
        (5, 4),
        "odd writes to the first file, even to the second"
    );
    assert_eq!((a.claims.len(), b.claims.len()), (5, 4));
    let (cp, outcome) = Checkpoint::load(&path, "boot-1").unwrap();
    assert_eq!(outcome, LoadOutcome::Loaded);
    assert_eq!(cp.claims().len(), 5);
    // The next write goes to the older file, keeping the newest as it is.
    cp.update(|c| c.remove("u0")).await.unwrap();
    let b = file_data(&alternate(&path));
    assert_eq!((b.seq, b.claims.len()), (6, 4));
    assert_eq!(file_data(&path).seq, 5);
}

#[tokio::test]
async fn a_write_torn_by_a_crash_falls_back_to_the_write_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    let (cp, _) = Checkpoint::load(&path, "boot-1").unwrap();
    add_many(&cp, 3).await;
    drop(cp);
    // The third write went to the first file; tear it half-way through the records (the rest of
    // the file as a power loss may leave it: zeros).
    let mut bytes = std::fs::read(&path).unwrap();
    let json = bytes.iter().rposition(|&b| b == b'}').unwrap();
    bytes[json / 2..].fill(0);
    std::fs::write(&path, &bytes).unwrap();
    let (cp, outcome) = Checkpoint::load(&path, "boot-1").unwrap();
    assert_eq!(outcome, LoadOutcome::Loaded);
    assert_eq!(
        cp.claims().keys().cloned().collect::<Vec<_>>(),
        ["u0", "u1"],
        "the second write, from the other file"
    );
    // The torn file is the one overwritten next, and then it is the newest.
    add(&cp, "u9").await.unwrap();
    let a = file_data(&path);
    assert_eq!((a.seq, a.claims.len()), (3, 3));
}

#[tokio::test]
async fn files_grow_with_the_records_and_shrink_only_when_large() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    let (cp, _) = Checkpoint::load(&path, "boot-1").unwrap();
    let len = |p: &Path| std::fs::metadata(p).unwrap().len();
    // Records with long names, so that a few dozen outgrow the size files keep.
    let add_big = |i: usize| {
        cp.update(move |c| {
            let mut r = record(ClaimState::PrepareCompleted);
            r.name = format!("{i}-{}", "n".repeat(8 * 1024));
            c.insert(format!("u{i}"), r);
        })
    };
    let check = |limit: usize| {
        for p in [path.clone(), alternate(&path)] {
            if p.exists() {
                assert!(len(&p).is_power_of_two() && len(&p) >= 4096);
                assert!(file_data(&p).claims.len() <= limit);
            }
        }
    };
    for i in 0..8 {
        add_big(i).await.unwrap();
        check(i + 1);
    }
    let small = len(&path);
    assert!((64 * 1024..=KEEP_SIZE_UP_TO).contains(&small), "{small}");
    for i in (0..8).rev() {
        cp.update(|c| c.remove(&format!("u{i}"))).await.unwrap();
        check(i + 1);
    }
    assert_eq!(
        len(&path),
        small,
        "a file no larger than KEEP_SIZE_UP_TO keeps its size when the records go"
    );
    for i in 0..80 {
        add_big(i).await.unwrap();
    }
    let big = len(&path);
    assert!(big >= 4 * KEEP_SIZE_UP_TO, "{big}");
    for i in (0..80).rev() {
        cp.update(|c| c.remove(&format!("u{i}"))).await.unwrap();
        check(i + 1);
    }
    assert_eq!(
        len(&path),
        KEEP_SIZE_UP_TO,
        "a large file shrinks once the records fit a quarter, down to KEEP_SIZE_UP_TO"
    );
    drop(cp);
    let (cp, _) = Checkpoint::load(&path, "boot-1").unwrap();
    assert!(cp.claims().is_empty());
}

#[tokio::test]
async fn a_checkpoint_from_before_the_second_file_loads_and_moves_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    // As versions before the second file wrote it: no `seq`, no padding, no alternate.
    let data = r#"{"nodeBootID":"boot-1","claims":{"u1":{"state":"PrepareCompleted","namespace":"ns","name":"c","devices":[]}}}"#;
    let file = format!(
        r#"{{"version":1,"checksum":"{}","data":{data}}}"#,
        checksum(data.as_bytes())
    );
    std::fs::write(&path, file).unwrap();
    let (cp, outcome) = Checkpoint::load(&path, "boot-1").unwrap();
    assert_eq!(outcome, LoadOutcome::Loaded);
    add(&cp, "u2").await.unwrap();
    drop(cp);
    assert_eq!(
        file_data(&path).claims.len(),
        1,
        "the old file is kept until the next write"
    );
    let (cp, _) = Checkpoint::load(&path, "boot-1").unwrap();
    assert_eq!(cp.claims().len(), 2);
}

#[tokio::test]
async fn a_failed_write_never_overwrites_the_newest_good_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    let (cp, _) = Checkpoint::load(&path, "boot-1").unwrap();
    add(&cp, "u1").await.unwrap();
    // The second file cannot be opened for writing.
    std::fs::create_dir(alternate(&path)).unwrap();
    add(&cp, "u2")
        .await
        .expect_err("the alternate file is a directory");
    assert_eq!(
        file_data(&path).claims.len(),
        1,
        "the newest good file is untouched"
    );
    std::fs::remove_dir(alternate(&path)).unwrap();
    add(&cp, "u3").await.unwrap();
    let b = file_data(&alternate(&path));
    assert_eq!(b.claims.len(), 3);
    assert_eq!(file_data(&path).claims.len(), 1);
}

#[tokio::test]
async fn settling_leaves_the_newest_state_in_the_first_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    let (cp, _) = Checkpoint::load(&path, "boot-1").unwrap();
    cp.settle().await.unwrap();
    assert!(!path.exists(), "nothing written, nothing to settle");
    add_many(&cp, 2).await;
    // The second write went to the alternate file: settling writes the first one again.
    cp.settle().await.unwrap();
    let a = file_data(&path);
    assert_eq!((a.seq, a.claims.len()), (3, 2));
    // Now the first file is the newest: nothing more to write.
    cp.settle().await.unwrap();
    assert_eq!(file_data(&path).seq, 3);
    drop(cp);
    // The same after a restart that loaded from the alternate file.
    let (cp, _) = Checkpoint::load(&path, "boot-1").unwrap();
    cp.update(|c| c.remove("u0")).await.unwrap();
    cp.settle().await.unwrap();
    let a = file_data(&path);
    assert_eq!((a.seq, a.claims.len()), (5, 1));
}

/// Queues a side file (and a record `late<n>`) on the checkpoint's pending state, as a prepare
/// arriving in the middle of a flush would.
fn queue_late(state: &Mutex<Pending>, dir: &Path, n: usize) {
    state.lock().unwrap().stage(
        |c| c.insert(format!("late{n}"), record(ClaimState::PrepareCompleted)),
        Some((dir.join(format!("late{n}.json")), Some(b"late".to_vec()))),
    );
}

#[tokio::test]
async fn side_files_queued_during_a_flush_join_it_up_to_a_bound() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    let (cp, _) = Checkpoint::load(&path, "boot-1").unwrap();
    // Every pass queues one more file, as a steady stream of prepares would.
    let d = dir.path().to_path_buf();
    let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = queued.clone();
    *cp.shared.after_pass.lock().unwrap() = Some(Box::new(move |state| {
        queue_late(state, &d, count.fetch_add(1, Ordering::SeqCst));
    }));
    cp.update_with_file(
        |c| c.insert("first".into(), record(ClaimState::PrepareCompleted)),
        "writing",
        dir.path().join("first.json"),
        b"first".to_vec(),
    )
    .await
    .unwrap();
    // One checkpoint write carried the first file and the files queued while it was being written,
    // each before the checkpoint; after FILE_PASSES passes the stream no longer holds it back.
    assert_eq!(FILE_PASSES, 3);
    assert_eq!(queued.load(Ordering::SeqCst), 2, "passes before the last");
    let data = read_newest(&path).unwrap();
    assert_eq!(data.seq, 1, "one checkpoint write");
    let carried: Vec<_> = data.claims.keys().cloned().collect();
    assert_eq!(carried, ["first", "late0", "late1"]);
    for f in ["first.json", "late0.json", "late1.json"] {
        assert!(
            dir.path().join(f).exists(),
            "{f} written before the checkpoint"
        );
    }
    assert_eq!(
        *cp.shared.flushed.borrow(),
        3,
        "generations 1-3 are on disk"
    );
}
