//! A rolling upgrade of the plugin through the stock kubelet (docs/upgrades.md): plugin A serves
//! with pod UID `old`, plugin B starts beside it with `new` (as `maxSurge: 1` does), pods come and
//! go while both serve, A stops, more pods come and go. No prepare may fail, every claim is
//! prepared exactly once (by whichever plugin the kubelet chose) and unprepared, B serves alone at
//! the end and the checkpoint holds exactly the running pods' claims.
//!
//! u2 is the rollback: B goes first and the kubelet falls back to A, which must carry on from the
//! records B wrote. Run them with `bash e2e/run.sh u1` and `u2`.
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use e2e::env::{Env, PodClaim, WAIT};
use e2e::env_or_skip;
use e2e::plugin::{NodeDirs, Plugin};
use k8s_openapi::api::core::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

const CLAIM: [PodClaim; 1] = [PodClaim {
    name: "gpu",
    template: "inference-gpu",
}];

/// Starts plugin B on the node's directories with its own log (`<node>/new/plugin.log`) and waits
/// until the kubelet has registered it beside A; it is the node's first `more_plugins`.
async fn start_new_plugin(env: &mut Env, name: &str) -> Result<()> {
    let node = env.node(name);
    let dirs = NodeDirs {
        root: node.dirs.root.join("new"),
        ..node.dirs.clone()
    };
    std::fs::create_dir_all(&dirs.root)?;
    let args = ["--profile", "h100-80gb:8", "--rolling-update-uid", "new"];
    let mut b = Plugin::start(&env.plugin_bin, name, &env.kubeconfig, &dirs, &args)?;
    let log = dirs.root.join("plugin.log");
    let deadline = Instant::now() + WAIT;
    while !read(&log).contains("registered with the kubelet") {
        b.check_alive()?;
        ensure!(
            Instant::now() < deadline,
            "B not registered within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    env.node_mut(name).more_plugins.push(b);
    Ok(())
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Lines of `log` that report `what` (`prepared devices=` or `unprepared`) for claim `uid`.
fn count(log: &str, uid: &str, what: &str) -> usize {
    let span = format!("claimUID={uid} ");
    log.lines()
        .filter(|l| l.contains(&span) && l.contains(&format!(": {what}")))
        .count()
}

/// Creates `names`, waits for them to run, returns their claims' UIDs.
async fn run_pods(env: &Env, node: &str, names: &[&str]) -> Result<Vec<String>> {
    for name in names {
        env.create_pod(&env.pod_manifest(name, Some(node), &CLAIM, None)?)
            .await?;
    }
    let mut uids = Vec::new();
    for name in names {
        env.wait_running(name).await?;
        uids.push(env.pod_claim(name, "gpu").await?.uid().unwrap_or_default());
    }
    Ok(uids)
}

async fn delete_pods(env: &Env, names: &[&str]) -> Result<()> {
    for name in names {
        env.delete_pod(name).await?;
    }
    for name in names {
        env.wait_pod_gone(name).await?;
    }
    Ok(())
}

/// The claims in the newest checkpoint file, with their states (the file layout of
/// dra-plugin-core's checkpoint: the higher `data.seq` of the two files wins).
fn checkpoint_claims(plugin_dir: &Path) -> Result<BTreeMap<String, String>> {
    let mut newest: Option<(u64, serde_json::Value)> = None;
    for name in ["checkpoint.json", "checkpoint.json.alt"] {
        let Ok(text) = std::fs::read_to_string(plugin_dir.join(name)) else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(&text).context(name)?;
        let seq = v["data"]["seq"].as_u64().unwrap_or(0);
        if newest.as_ref().is_none_or(|(s, _)| seq > *s) {
            newest = Some((seq, v));
        }
    }
    let (_, v) = newest.context("no checkpoint")?;
    let claims = v["data"]["claims"].as_object().cloned().unwrap_or_default();
    Ok(claims
        .into_iter()
        .map(|(uid, r)| (uid, r["state"].as_str().unwrap_or("").to_string()))
        .collect())
}

/// Events of the scenario that report a failed prepare or unprepare.
async fn failed_dra_events(env: &Env) -> Result<Vec<String>> {
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.ns);
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.reason
                .as_deref()
                .is_some_and(|r| r.contains("DynamicResources"))
        })
        .map(|e| format!("{:?}: {:?}", e.reason, e.message))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn u1_rolling_upgrade_drops_no_claim() -> Result<()> {
    let mut env = env_or_skip!("u1_rolling_upgrade_drops_no_claim");
    const NODE: &str = "u1-h100";
    let args = ["--profile", "h100-80gb:8", "--rolling-update-uid", "old"];
    env.add_node(NODE, &args).await?;
    env.create_from_file("examples/claims/inference-gpu.yaml")
        .await?;
    let before = run_pods(&env, NODE, &["p0", "p1", "p2"]).await?;

    // The surge: B registers beside A; pods come and go while both serve.
    start_new_plugin(&mut env, NODE).await?;
    let overlap = run_pods(&env, NODE, &["p3", "p4", "p5", "p6"]).await?;
    delete_pods(&env, &["p0", "p1"]).await?;

    // The old pod goes; B serves alone, including the claims A prepared.
    env.node_mut(NODE).plugin.stop().await?;
    let dirs = env.node(NODE).dirs.clone();
    ensure!(
        !dirs.registrar.join("gpu.nvidia.com-old-reg.sock").exists()
            && dirs.registrar.join("gpu.nvidia.com-new-reg.sock").exists(),
        "A must remove its own sockets and only those"
    );
    let after = run_pods(&env, NODE, &["p7", "p8"]).await?;
    delete_pods(&env, &["p2", "p3"]).await?;

    let failed = failed_dra_events(&env).await?;
    ensure!(failed.is_empty(), "failed prepares/unprepares: {failed:?}");
    let (log_a, log_b) = (
        read(&dirs.root.join("plugin.log")),
        read(&dirs.root.join("new/plugin.log")),
    );
    let all: Vec<&String> = before.iter().chain(&overlap).chain(&after).collect();
    for uid in &all {
        let n = count(&log_a, uid, "prepared devices=") + count(&log_b, uid, "prepared devices=");
        ensure!(n == 1, "claim {uid} prepared {n} times");
    }
    for uid in after.iter() {
        ensure!(
            count(&log_b, uid, "prepared devices=") == 1,
            "B did not prepare {uid}"
        );
    }
    let gone = [&before[0], &before[1], &before[2], &overlap[0]];
    for uid in gone {
        let n = count(&log_a, uid, "unprepared") + count(&log_b, uid, "unprepared");
        ensure!(n >= 1, "claim {uid} of a deleted pod never unprepared");
    }
    // p2's claim was prepared by A and unprepared by B, from the checkpoint A wrote.
    ensure!(
        count(&log_b, &before[2], "unprepared") >= 1,
        "B did not unprepare A's claim"
    );

    let recorded = checkpoint_claims(&dirs.plugin)?;
    let mut running: Vec<&String> = overlap[1..].iter().chain(&after).collect();
    running.sort();
    ensure!(
        recorded.keys().collect::<Vec<_>>() == running,
        "checkpoint {recorded:?}, running pods' claims {running:?}"
    );
    if let Some((uid, state)) = recorded.iter().find(|(_, s)| *s != "PrepareCompleted") {
        bail!("claim {uid} recorded as {state}");
    }
    println!(
        "u1: {} claims across the upgrade, none failed or prepared twice",
        all.len()
    );
    env.check_violations()?;
    env.teardown().await
}

/// The rollback of a failed upgrade: the new pod goes while the old one stays. The kubelet falls
/// back to A, which must unprepare the claims B prepared and record new ones without losing B's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn u2_rollback_falls_back_to_the_old_plugin() -> Result<()> {
    let mut env = env_or_skip!("u2_rollback_falls_back_to_the_old_plugin");
    const NODE: &str = "u2-h100";
    let args = ["--profile", "h100-80gb:8", "--rolling-update-uid", "old"];
    env.add_node(NODE, &args).await?;
    env.create_from_file("examples/claims/inference-gpu.yaml")
        .await?;
    let first = run_pods(&env, NODE, &["p0"]).await?;
    start_new_plugin(&mut env, NODE).await?;
    let by_new = run_pods(&env, NODE, &["p1", "p2"]).await?;
    env.node_mut(NODE).more_plugins[0].stop().await?;
    delete_pods(&env, &["p1"]).await?;
    let by_old = run_pods(&env, NODE, &["p3"]).await?;

    let failed = failed_dra_events(&env).await?;
    ensure!(failed.is_empty(), "failed prepares/unprepares: {failed:?}");
    let dirs = env.node(NODE).dirs.clone();
    let log_a = read(&dirs.root.join("plugin.log"));
    ensure!(
        count(&log_a, &by_new[0], "unprepared") == 1,
        "A did not unprepare B's claim"
    );
    ensure!(
        count(&log_a, &by_old[0], "prepared devices=") == 1,
        "A did not prepare p3"
    );
    let recorded = checkpoint_claims(&dirs.plugin)?;
    let mut running = vec![&first[0], &by_new[1], &by_old[0]];
    running.sort();
    ensure!(
        recorded.keys().collect::<Vec<_>>() == running,
        "checkpoint {recorded:?}, running pods' claims {running:?}"
    );
    env.check_violations()?;
    env.teardown().await
}
