//! The plugin killed (-9) at random moments while real pods prepare and unprepare claims through
//! the stock kubelet, on a node whose MIG instances live in (mock) hardware that outlasts the
//! plugin. Afterwards nothing may have leaked and no device may ever have served two claims.
//!
//! `E2E_CHAOS_CYCLES` (default 1000) sets the number of pods (one prepare/unprepare each).
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use e2e::env::{PodClaim, WAIT, wait_until};
use e2e::env_or_skip;
use e2e::mock_nvml::{add_dynamic_mig_node, mig_state, mock_root};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};

/// Pods in flight at once.
const PARALLEL: usize = 24;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_plugin_kill9_during_pod_churn() -> Result<()> {
    let mut env = env_or_skip!("k7_plugin_kill9_during_pod_churn");
    let cycles: usize = std::env::var("E2E_CHAOS_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let node = "k7-h100";
    let mock = env.work.join("nodes").join(node).join("mock-nvml");
    mock_root(&env, node, "h100-80gb:4", &mock).await?;
    add_dynamic_mig_node(&mut env, node, &mock.join("root")).await?;
    env.create_from_file("examples/claims/mig-1g-10gb.yaml")
        .await?;
    env.create_from_file("examples/claims/inference-gpu.yaml")
        .await?;
    // Every fourth pod asks for "3g.40gb, else a whole GPU", the others for a 1g.10gb slice.
    let manifests: Vec<Pod> = (0..cycles)
        .map(|i| {
            let template = if i % 4 == 0 {
                "inference-gpu"
            } else {
                "mig-1g-10gb"
            };
            let claim = [PodClaim {
                name: "gpu",
                template,
            }];
            env.pod_manifest(&format!("c{i:04}"), Some(node), &claim, None)
        })
        .collect::<Result<_>>()?;
    let manifests = Arc::new(manifests);
    let cdi_dir = env.node(node).dirs.cdi.clone();

    let done = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..PARALLEL {
        let (pods, manifests, next) = (env.pods(), manifests.clone(), next.clone());
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(pod) = manifests.get(i) else {
                    return Ok::<(), anyhow::Error>(());
                };
                cycle(&pods, pod).await?;
            }
        });
    }
    let watcher = tokio::spawn(watch_double_use(cdi_dir.clone(), done.clone()));

    let mut rng = XorShift::seeded();
    println!(
        "k7: {cycles} pods, {PARALLEL} at a time, kill seed {}",
        rng.0
    );
    let mut kills = 0;
    while !workers.is_empty() {
        let pause = Duration::from_millis(rng.between(1500, 5000));
        tokio::select! {
            joined = workers.join_next() => {
                if let Some(r) = joined
                    && let Err(e) = r?
                {
                    done.store(true, Ordering::Relaxed);
                    return Err(e.context(format!("after {kills} plugin kills")));
                }
            }
            () = tokio::time::sleep(pause) => {
                let plugin = &mut env.node_mut(node).plugin;
                plugin.kill9().await?;
                tokio::time::sleep(Duration::from_millis(rng.between(0, 500))).await;
                plugin.restart()?;
                kills += 1;
            }
        }
    }
    done.store(true, Ordering::Relaxed);
    let double_use = watcher.await??;
    println!(
        "k7: {cycles} pods prepared and unprepared with {kills} plugin kills in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    ensure!(
        double_use.is_empty(),
        "devices held by two claims at once: {double_use:?}"
    );

    // Nothing leaked: no CDI spec, no claim in the kubelet's checkpoint, no MIG instance.
    wait_until("no CDI spec and no MIG instance left", WAIT, || async {
        let specs = e2e::cdi::spec_files(&cdi_dir)?;
        let instances: Vec<String> = mig_state(&mock)?
            .into_iter()
            .filter(|l| l.starts_with("gi "))
            .collect();
        if !specs.is_empty() || !instances.is_empty() {
            bail!("CDI specs {specs:?}, MIG instances {instances:?}");
        }
        Ok(Some(()))
    })
    .await?;
    let prepared = env.node(node).kubelet.prepared()?;
    ensure!(
        prepared.is_empty(),
        "the kubelet still holds {:?}",
        prepared.keys()
    );
    env.check_violations()?;
    env.teardown().await
}

/// One pod: created, Running (its claim prepared through the kubelet), deleted, gone.
async fn cycle(pods: &Api<Pod>, pod: &Pod) -> Result<()> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    pods.create(&PostParams::default(), pod).await?;
    wait_until(&format!("pod {name} Running"), WAIT, || async {
        let p = pods.get(&name).await?;
        let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
        if phase == "Failed" || phase == "Succeeded" {
            bail!("pod {name} ended {phase}");
        }
        Ok((phase == "Running").then_some(()))
    })
    .await?;
    pods.delete(&name, &DeleteParams::default()).await?;
    wait_until(&format!("pod {name} gone"), WAIT, || async {
        Ok(pods.get_opt(&name).await?.is_none().then_some(()))
    })
    .await
}

/// Samples the node's CDI specs until `done`: a device named by the specs of two claims at once
/// would be a device prepared for two claims.
async fn watch_double_use(
    cdi_dir: std::path::PathBuf,
    done: Arc<AtomicBool>,
) -> Result<Vec<String>> {
    let mut found = BTreeSet::new();
    while !done.load(Ordering::Relaxed) {
        for (device, claims) in holders(&cdi_dir)? {
            if claims.len() > 1 {
                found.insert(format!("{device}: {claims:?}"));
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(found.into_iter().collect())
}

/// Device name -> claim UIDs whose CDI spec defines it (`<claim uid>-<device>` device names).
fn holders(cdi_dir: &Path) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let mut by_device: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    // A spec can vanish between listing and reading it (an unprepare); the next sample sees it.
    let Ok(specs) = e2e::cdi::load(cdi_dir) else {
        return Ok(by_device);
    };
    for id in specs.keys() {
        let name = id.rsplit('=').next().context("CDI id without a name")?;
        if name.len() > 37 {
            let (uid, device) = name.split_at(36);
            by_device
                .entry(device[1..].to_string())
                .or_default()
                .insert(uid.to_string());
        }
    }
    Ok(by_device)
}

/// A small random source for the kill times; its seed is printed so a failing run can be read
/// against its schedule.
struct XorShift(u64);

impl XorShift {
    fn seeded() -> Self {
        #[allow(
            clippy::cast_possible_truncation,
            reason = "the low 64 bits of the clock are seed enough"
        )]
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        XorShift(nanos | 1)
    }

    fn between(&mut self, low: u64, high: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        low + self.0 % (high - low)
    }
}
