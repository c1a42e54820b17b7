//! Wiring: backend, checkpoint, gRPC servers, publisher, cleanup, metrics, shutdown.
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use dra_plugin_core::backend::DeviceBackend;
use dra_plugin_core::cdi::CdiStore;
use dra_plugin_core::checkpoint::{Checkpoint, ClaimState, LoadOutcome, read_boot_id};
use dra_plugin_core::health::HealthTracker;
use dra_plugin_core::metadata::MetadataWriter;
use dra_plugin_core::state::DeviceState;
use dra_plugin_core::types::ClaimRef;
use gpu_dra_api::gates::{Component, FeatureGates};
use gpu_dra_api::inventory::Inventory;
use gpu_dra_api::slices::{
    SliceContent, SliceOptions, TaintMap, build_pool, enable_consumable_shares, to_resource_slices,
};
use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::backend::build_backend;
use crate::cli::{Output, RunArgs, SlicesArgs};
use crate::grpc::dra::DraService;
use crate::grpc::health::HealthService;
use crate::kube::claims::{ApiClaims, FileClaims};
use crate::kube::events::{ApiNodeEvents, NodeEvents};
use crate::kube::publisher::{Publisher, cluster_splits_counters};
use crate::kube::status::{ApiClaimStatus, ClaimStatus};
use crate::kube::taints::taint_map;
use crate::metrics::Metrics;
use crate::miglayout::Withheld;
use crate::prepare::{ClaimOutputs, ClaimSource, Preparer};

mod health;
mod kubelet;
mod on_demand;
mod passthrough;
mod rolling;
mod shutdown;
use health::{spawn_health, spawn_health_monitor};
use kubelet::serve_kubelet;
use shutdown::{shutdown_signal, wait};

/// `dra-plugin slices`: what this node would publish.
pub fn print_slices(args: SlicesArgs) -> anyhow::Result<()> {
    let gates = FeatureGates::parse(&args.device.feature_gates)?;
    args.device
        .check_mig_mode(&gates)
        .map_err(anyhow::Error::msg)?;
    let minor: u32 = args
        .kubernetes_version
        .trim_start_matches('v')
        .split('.')
        .nth(1)
        .and_then(|m| m.parse().ok())
        .with_context(|| {
            format!(
                "--kubernetes-version {:?} is not like 1.35",
                args.kubernetes_version
            )
        })?;
    let opts = SliceOptions {
        driver: args.device.driver_name.clone(),
        node_name: args.device.node_name.clone(),
        dynamic_mig: gates.dynamic_mig(),
        split_counters: minor >= 35,
    };
    let contents = if args.device.driver_name == gpu_dra_api::names::COMPUTE_DOMAIN_DRIVER {
        // The compute-domain driver publishes its IMEX devices, not the node's GPUs.
        crate::computedomain::pool_contents()
    } else {
        let backend = build_backend(&args.device, None)?;
        let inv = backend.discover()?;
        debug!(backend = backend.kind(), node = %args.device.node_name, gpus = inv.gpus.len(), "discovered devices");
        let mut contents = build_pool(&inv, &opts, &TaintMap::new());
        passthrough::add_unheld(&mut contents, inv, &gates, &args.device.host);
        let shares = args.device.consumable_shares;
        shares.check_gate(&gates).map_err(anyhow::Error::msg)?;
        enable_consumable_shares(&mut contents, shares);
        contents
    };
    let slices = to_resource_slices(contents, &opts, 1, None);
    debug!(
        slices = slices.len(),
        split_counters = opts.split_counters,
        "built ResourceSlices"
    );
    let objects: Vec<serde_json::Value> = slices
        .iter()
        .map(|s| {
            let mut v = serde_json::to_value(s).expect("slice serializes");
            v["apiVersion"] = "resource.k8s.io/v1".into();
            v["kind"] = "ResourceSlice".into();
            v
        })
        .collect();
    match args.output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects})
            )?
        ),
        Output::Yaml => {
            for o in &objects {
                print!("---\n{}", serde_yaml::to_string(o)?);
            }
        }
    }
    Ok(())
}

/// Discovery with retries: a node whose driver is not ready yet must not look GPU-less.
async fn discover(
    backend: &Arc<dyn DeviceBackend>,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<Inventory> {
    let mut delay = Duration::from_secs(1);
    loop {
        let b = backend.clone();
        match tokio::task::spawn_blocking(move || b.discover()).await? {
            Ok(inv) => return Ok(inv),
            Err(e) => {
                warn!(error = %e, retry_in = ?delay, "device discovery failed; publishing nothing until it works")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.changed() => anyhow::bail!("shut down before devices were discovered"),
        }
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

async fn kube_client(path: Option<&Path>) -> anyhow::Result<kube::Client> {
    let config = match path {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .with_context(|| format!("reading kubeconfig {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    Ok(kube::Client::try_from(config)?)
}

/// `dra-plugin run`: serves until SIGTERM or Ctrl-C.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    run_until(args, shutdown_signal()).await
}

/// Serves until `shutdown` turns true (tests drive this directly).
pub async fn run_until(args: RunArgs, shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    let dev = &args.device;
    // NVIDIA's binaries check the gate rules whatever their role.
    if dev.driver_name == gpu_dra_api::names::COMPUTE_DOMAIN_DRIVER {
        crate::gates::load(&dev.feature_gates, Component::ComputeDomainPlugin)?;
        return run_compute_domain(args, shutdown).await;
    }
    let gates = crate::gates::load(&dev.feature_gates, Component::GpuPlugin)?;
    // As NVIDIA's plugin: a sharing mode without its gate stops the start.
    let shares = dev.consumable_shares;
    shares.check_gate(&gates).map_err(anyhow::Error::msg)?;
    dev.check_mig_mode(&gates).map_err(anyhow::Error::msg)?;
    let metrics = Arc::new(Metrics::new());
    let types = crate::metrics::nvidia::GPU_DEVICE_TYPES;
    metrics.nvidia.init(&dev.driver_name, &dev.node_name, types);
    let backend = build_backend(dev, Some(&args.plugin_dir))?;
    info!(backend = backend.kind(), node = %dev.node_name, gates = %gates, "starting");

    let client = match &args.offline_claims_dir {
        Some(_) => None,
        None => Some(kube_client(args.kubeconfig.as_deref()).await?),
    };
    let node_uid = match &client {
        Some(c) => kube::Api::<k8s_openapi::api::core::v1::Node>::all(c.clone())
            .get_opt(&dev.node_name)
            .await
            .ok()
            .flatten()
            .and_then(|n| n.metadata.uid),
        None => None,
    };
    let events = node_events(client.as_ref(), &dev.node_name, node_uid);

    std::fs::create_dir_all(&args.plugin_dir)
        .with_context(|| format!("creating {}", args.plugin_dir.display()))?;
    let boot_id = read_boot_id(&args.boot_id_file)?;
    let cp_path = args.plugin_dir.join("checkpoint.json");
    let uid = rolling::pod_uid(args.rolling_update_uid.as_deref())?;
    let lock = rolling::startup_lock(&cp_path, uid).await?;
    let (checkpoint, outcome) = Checkpoint::load(&cp_path, &boot_id)?;
    // Held through recovery, which rolls back unfinished prepares: none of the other pod's.
    let startup = lock.map(|l| checkpoint.share(l));
    let cdi = CdiStore::new(&args.cdi_root);
    let mut inventory = discover(&backend, shutdown.clone()).await?;
    let pci_bus = passthrough::pci_bus(&gates, &dev.host);
    if let Some(bus) = &pci_bus {
        passthrough::fill_pci(&mut inventory, bus);
    }
    let vfio_on = pci_bus.is_some();
    let state = Arc::new(passthrough::attach(
        DeviceState::new(
            &dev.node_name,
            backend.clone(),
            inventory,
            checkpoint,
            cdi.clone(),
            gates.clone(),
        ),
        pci_bus,
    ));
    match &outcome {
        LoadOutcome::Loaded | LoadOutcome::Fresh => {}
        LoadOutcome::Rebooted { dropped } => {
            info!(
                claims = dropped.len(),
                "node rebooted since the checkpoint was written; prepared state was lost with it"
            );
            for uid in dropped {
                cdi.remove(uid)?;
            }
        }
        LoadOutcome::Corrupt { reason, moved_to } => {
            let adopted = state.adopt_from_cdi().await?;
            let msg = format!(
                "checkpoint was unreadable ({reason}); moved to {} and rebuilt {} prepared claims from CDI specs",
                moved_to.display(),
                adopted.len()
            );
            error!("{msg}");
            if let Some(events) = &events {
                events.warning("CheckpointCorrupt", "Recover", msg);
            }
        }
    }
    let destroyed = state.destroy_unowned_mig().await?;
    if destroyed > 0 {
        info!(
            destroyed,
            "destroyed MIG devices that no prepared claim owns"
        );
    }
    let (rewritten, removed) = state.repair_cdi().await?;
    if rewritten + removed > 0 {
        info!(
            rewritten,
            removed, "reconciled CDI specs with the checkpoint"
        );
    }
    metrics.set_prepared(state.checkpoint());
    drop(startup);

    let claims: Arc<dyn ClaimSource> = match (&args.offline_claims_dir, &client) {
        (Some(dir), _) => Arc::new(FileClaims::new(
            dir.clone(),
            &dev.driver_name,
            &dev.node_name,
        )),
        (None, Some(c)) => Arc::new(ApiClaims::new(c.clone(), &dev.driver_name, &dev.node_name)),
        (None, None) => unreachable!("a client exists whenever there is no offline directory"),
    };

    let outputs = claim_outputs(
        &args,
        &gates,
        state.clone(),
        client.as_ref(),
        &metrics,
        events.clone(),
    );
    let service = DraService::new(outputs.clone(), claims, metrics.clone());
    let health_enabled = gates.enabled("NVMLDeviceHealthCheck");
    let tracker = Arc::new(Mutex::new(HealthTracker::new(Duration::from_secs(
        args.health_hold_down_seconds,
    ))));
    let (health_changed_tx, health_changed) = watch::channel(0u64);
    let health_service = health_enabled
        .then(|| HealthService::new(state.clone(), tracker.clone(), health_changed.clone()));
    let servers = serve_kubelet(
        &args,
        service,
        health_service,
        &metrics,
        events,
        shutdown.clone(),
    )?;
    let reg_path = servers.reg_path.clone();

    serve_probes(&args, &metrics, reg_path.clone(), &shutdown).await?;

    let opts = SliceOptions {
        driver: dev.driver_name.clone(),
        node_name: dev.node_name.clone(),
        dynamic_mig: gates.dynamic_mig(),
        split_counters: match &client {
            Some(c) => cluster_splits_counters(c).await,
            None => true,
        },
    };
    let opts_for_pool = opts.clone();
    let state_for_pool = state.clone();
    let withheld = Withheld::default();
    let withheld_for_pool = withheld.clone();
    // The node's slice contents, with taints from health and, when enabled, consumable capacity;
    // without the devices on-demand MIG is about to change. The GPUs are the state's, which
    // on-demand MIG refreshes.
    let pool = move |taints: &dyn Fn(&[SliceContent]) -> TaintMap| {
        let inventory = state_for_pool.inventory();
        let mut contents = build_pool(&inventory, &opts_for_pool, &TaintMap::new());
        let taints = taints(&contents);
        if !taints.is_empty() {
            contents = build_pool(&inventory, &opts_for_pool, &taints);
        }
        if vfio_on {
            passthrough::add_to_pool(&mut contents, &inventory, &state_for_pool);
        }
        enable_consumable_shares(&mut contents, shares);
        withheld_for_pool.remove_from(&mut contents);
        contents
    };
    let untainted = pool(&|_| TaintMap::new());
    let (contents_tx, contents_rx) = watch::channel(untainted);
    if vfio_on {
        let pool = pool.clone();
        passthrough::spawn_republish(state.clone(), contents_tx.clone(), move || {
            pool(&|_| TaintMap::new())
        });
    }
    if let Some(client) = client.clone() {
        let publisher = Publisher::new(client.clone(), opts.clone(), metrics.clone());
        tokio::spawn(publisher.run(contents_rx, shutdown.clone()));
        tokio::spawn(cleanup_loop(client, outputs, shutdown.clone()));
    }
    if let (true, Some(client)) = (dev.on_demand_mig, client.clone()) {
        let (pool, tx, tracker) = (pool.clone(), contents_tx.clone(), tracker.clone());
        let republish = move || {
            let t = tracker.lock().expect("health tracker");
            let contents = match health_enabled {
                true => pool(&|c| taint_map(&t, c)),
                false => pool(&|_| TaintMap::new()),
            };
            let _ = tx.send(contents);
        };
        let reconciler = on_demand::reconciler(
            client,
            &args,
            (state.clone(), backend.clone()),
            (withheld, Arc::new(republish)),
            metrics.clone(),
        );
        tokio::spawn(reconciler.run(shutdown.clone()));
    }
    if health_enabled {
        let publish = move |t: &HealthTracker| {
            let _ = contents_tx.send(pool(&|c| taint_map(t, c)));
        };
        spawn_health_monitor(
            backend.clone(),
            tracker,
            health_changed_tx,
            publish,
            shutdown.clone(),
        );
    }

    wait(shutdown).await;
    servers.stop(state.checkpoint()).await;
    Ok(())
}

/// `dra-plugin run --driver-name compute-domain.nvidia.com`: the IMEX channel and daemon devices.
async fn run_compute_domain(args: RunArgs, shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    use crate::computedomain::{
        CHANNELS_DIR, ComputeDomainState, KubeNodeLabeler, NodeLabeler, pool_contents,
    };
    let dev = &args.device;
    let metrics = Arc::new(Metrics::new());
    let types = crate::metrics::nvidia::CD_DEVICE_TYPES;
    metrics.nvidia.init(&dev.driver_name, &dev.node_name, types);
    info!(node = %dev.node_name, "starting the compute-domain driver");

    let client = match &args.offline_claims_dir {
        Some(_) => None,
        None => Some(kube_client(args.kubeconfig.as_deref()).await?),
    };
    std::fs::create_dir_all(&args.plugin_dir)
        .with_context(|| format!("creating {}", args.plugin_dir.display()))?;
    let boot_id = read_boot_id(&args.boot_id_file)?;
    let cp_path = args.plugin_dir.join("checkpoint.json");
    let uid = rolling::pod_uid(args.rolling_update_uid.as_deref())?;
    let lock = rolling::startup_lock(&cp_path, uid).await?;
    let (checkpoint, outcome) = Checkpoint::load(&cp_path, &boot_id)?;
    // No recovery to guard here: the lease only makes the checkpoint shared.
    drop(lock.map(|l| checkpoint.share(l)));
    if !matches!(outcome, LoadOutcome::Loaded | LoadOutcome::Fresh) {
        warn!(?outcome, "compute-domain checkpoint started over");
    }
    let labeler: Option<Arc<dyn NodeLabeler>> = client.clone().map(|c| {
        Arc::new(KubeNodeLabeler {
            client: c,
            node: dev.node_name.clone(),
        }) as Arc<dyn NodeLabeler>
    });
    use crate::computedomain::Peers;
    use crate::computedomain::follow::{KubeFollower, PeerFollower};
    let mut state = ComputeDomainState::new(
        checkpoint,
        args.cdi_root.clone(),
        args.plugin_dir.clone(),
        CHANNELS_DIR.into(),
        labeler,
    );
    let peers = if FeatureGates::parse(&dev.feature_gates)?.enabled("IMEXDaemonsWithDNSNames") {
        Peers::DnsNames {
            max_nodes: args.max_nodes_per_imex_domain,
        }
    } else {
        Peers::Ips
    };
    let follower = client.clone().map(|c| {
        Arc::new(KubeFollower::new(c, dev.node_name.clone(), peers)) as Arc<dyn PeerFollower>
    });
    state = state.with_peers(peers, follower);
    state.resume_followers();
    let state = Arc::new(state);
    let claims: Arc<dyn ClaimSource> = match (&args.offline_claims_dir, &client) {
        (Some(dir), _) => Arc::new(FileClaims::new(
            dir.clone(),
            &dev.driver_name,
            &dev.node_name,
        )),
        (None, None) => unreachable!("a client exists whenever there is no offline directory"),
        (None, Some(c)) => Arc::new(ApiClaims::new(c.clone(), &dev.driver_name, &dev.node_name)),
    };
    let service = DraService::new(state.clone(), claims, metrics.clone());
    let events = node_events(client.as_ref(), &dev.node_name, None);
    let servers = serve_kubelet(&args, service, None, &metrics, events, shutdown.clone())?;
    serve_probes(&args, &metrics, servers.reg_path.clone(), &shutdown).await?;
    if let Some(client) = client {
        let opts = SliceOptions {
            driver: dev.driver_name.clone(),
            node_name: dev.node_name.clone(),
            dynamic_mig: false,
            split_counters: true,
        };
        let (_contents_tx, contents_rx) = watch::channel(pool_contents());
        let publisher = Publisher::new(client.clone(), opts, metrics.clone());
        tokio::spawn(publisher.run(contents_rx, shutdown.clone()));
        tokio::spawn(cleanup_loop(client, state.clone(), shutdown.clone()));
        wait(shutdown).await;
    } else {
        wait(shutdown).await;
    }
    servers.stop(state.checkpoint()).await;
    Ok(())
}

/// The metrics server and the gRPC health server, each where the flags put it, if anywhere.
async fn serve_probes(
    args: &RunArgs,
    metrics: &Arc<Metrics>,
    reg_path: std::path::PathBuf,
    shutdown: &watch::Receiver<bool>,
) -> anyhow::Result<()> {
    if let Some((addr, path)) = args.metrics_endpoint().map_err(anyhow::Error::msg)? {
        let bound = crate::metrics::serve(addr, &path, metrics.clone(), wait(shutdown.clone()));
        let bound = bound.await?;
        info!(%bound, %path, "metrics");
    }
    if args.healthcheck_port != 0 {
        spawn_health(args.healthcheck_port, reg_path, shutdown.clone()).await?;
    }
    Ok(())
}

/// The GPU state with its outputs beyond CDI: metadata files behind `DeviceMetadata`, and the
/// claims' `status.devices` whenever there is an API server.
fn claim_outputs(
    args: &RunArgs,
    gates: &FeatureGates,
    state: Arc<DeviceState>,
    client: Option<&kube::Client>,
    metrics: &Arc<Metrics>,
    events: Option<Arc<dyn NodeEvents>>,
) -> Arc<dyn Preparer> {
    let dev = &args.device;
    let metadata = gates
        .enabled("DeviceMetadata")
        .then(|| MetadataWriter::new(&dev.driver_name, &args.plugin_dir, &args.cdi_root));
    let status = client.filter(|_| args.claim_device_status).map(|c| {
        Arc::new(ApiClaimStatus::spawn(
            c.clone(),
            &dev.driver_name,
            &dev.node_name,
            metrics.clone(),
            events,
        )) as Arc<dyn ClaimStatus>
    });
    // A restart loses the writes still queued: apply each prepared claim's entries again.
    if let Some(status) = &status {
        for (uid, r) in state.checkpoint().claims() {
            if r.state == ClaimState::PrepareCompleted {
                let claim = ClaimRef {
                    uid,
                    namespace: r.namespace,
                    name: r.name,
                };
                status.prepared(&claim, &r.devices);
            }
        }
    }
    Arc::new(ClaimOutputs {
        inner: state,
        metadata,
        status,
        metrics: metrics.clone(),
    })
}

/// This node's Warning events; none offline.
fn node_events(
    client: Option<&kube::Client>,
    node: &str,
    node_uid: Option<String>,
) -> Option<Arc<dyn NodeEvents>> {
    client.map(|c| {
        Arc::new(ApiNodeEvents {
            client: c.clone(),
            node: node.to_string(),
            node_uid,
        }) as Arc<dyn NodeEvents>
    })
}

/// Unprepares claims whose ResourceClaim is gone or was re-created: stale `PrepareStarted`
/// records of crashed prepares, and claims adopted after a checkpoint loss. At start and every
/// ten minutes.
async fn cleanup_loop(
    client: kube::Client,
    state: Arc<dyn Preparer>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        for (uid, record) in state.checkpoint().claims() {
            let api: kube::Api<ResourceClaim> =
                kube::Api::namespaced(client.clone(), &record.namespace);
            let gone = match api.get_opt(&record.name).await {
                Ok(None) => true,
                Ok(Some(c)) => c.metadata.uid.as_deref() != Some(uid.as_str()),
                Err(e) => {
                    warn!(error = %e, "cleanup: cannot read ResourceClaims; will retry");
                    break;
                }
            };
            if gone {
                info!(claimUID = %uid, claim = %format!("{}/{}", record.namespace, record.name), state = ?record.state, "cleaning up a claim whose ResourceClaim is gone");
                if let Err(e) = state.unprepare(&uid).await {
                    warn!(claimUID = %uid, error = %e, "cleanup failed");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(600)) => {}
            _ = shutdown.changed() => return,
        }
    }
}
