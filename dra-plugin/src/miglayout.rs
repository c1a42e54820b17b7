//! On-demand MIG, the node's side: reconciles this node's `MigLayout` (named after the node) by
//! creating and destroying MIG devices until every GPU its spec lists matches, and reports the
//! node's GPUs in its status.
//!
//! A change to a GPU goes: plan against the devices claims hold or are allocated (refuse if one
//! would go), take the affected devices out of the published slices and wait until the API server
//! shows that, check the claims again (the scheduler may have allocated one meanwhile), change the
//! hardware, rediscover and republish. The hardware is the truth: each pass starts from a fresh
//! discovery, so a plugin restarted half-way finishes the job.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dra_plugin_core::backend::DeviceBackend;
use dra_plugin_core::miglayout::{GpuChange, Refusal, WantedMig, check_not_held, plan_gpu};
use dra_plugin_core::state::DeviceState;
use futures::{FutureExt, StreamExt};
use gpu_dra_api::inventory::{Gpu, Inventory};
use gpu_dra_api::miglayout::MigLayout;
use gpu_dra_api::slices::SliceContent;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::Error;
use crate::metrics::{Metrics, MigDeviceOperationLabels, MigLayoutRefusalLabels};

mod api;
mod status;

/// Devices held back from the published slices while on-demand MIG changes them.
#[derive(Clone, Default)]
pub struct Withheld(Arc<Mutex<BTreeSet<String>>>);

impl Withheld {
    fn add(&self, names: &BTreeSet<String>) {
        self.0
            .lock()
            .expect("withheld")
            .extend(names.iter().cloned());
    }

    fn remove(&self, names: &BTreeSet<String>) {
        self.0
            .lock()
            .expect("withheld")
            .retain(|n| !names.contains(n));
    }

    /// Drops the withheld devices from slice contents about to be published.
    pub fn remove_from(&self, contents: &mut [SliceContent]) {
        let names = self.0.lock().expect("withheld");
        if names.is_empty() {
            return;
        }
        for c in contents {
            c.devices.retain(|d| !names.contains(&d.name));
        }
    }
}

/// How often a layout that is not applied yet (a claim holds a device) is tried again, and how
/// often the object is read again anyway (deleted, a missed watch event).
const RETRY: Duration = Duration::from_secs(10);
const RESYNC: Duration = Duration::from_secs(120);

pub struct Reconciler {
    pub client: kube::Client,
    pub node: String,
    pub driver: String,
    pub state: Arc<DeviceState>,
    pub backend: Arc<dyn DeviceBackend>,
    pub withheld: Withheld,
    /// Sends fresh slice contents (from the state's GPUs, without the withheld devices).
    pub republish: Arc<dyn Fn() + Send + Sync>,
    pub metrics: Arc<Metrics>,
}

/// The outcome of one GPU in a pass: `Ok(true)` when its hardware changed.
type GpuOutcome = Result<bool, Refusal>;

impl Reconciler {
    fn api(&self) -> Api<MigLayout> {
        Api::all(self.client.clone())
    }

    /// Reconciles until `shutdown`: on every spec change of the object, and again after
    /// [`RETRY`] while a layout is not applied. Status-only events (this plugin's own writes)
    /// do not start a pass: answering them with a stale object made two writes chase each other.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let cfg = watcher::Config::default().fields(&format!("metadata.name={}", self.node));
        let mut events = watcher(self.api(), cfg)
            .default_backoff()
            .applied_objects()
            .boxed();
        let mut deadline = tokio::time::Instant::now();
        // The object (UID, generation) whose last pass applied everything.
        let mut settled: Option<(Option<String>, Option<i64>)> = None;
        loop {
            let latest = tokio::select! {
                ev = events.next() => match ev {
                    Some(Ok(obj)) => newest(obj, &mut events),
                    Some(Err(e)) => { debug!(error = %e, "MigLayout watch interrupted"); continue }
                    None => return,
                },
                _ = tokio::time::sleep_until(deadline) => {
                    settled = None;
                    match self.fetch_or_create().await {
                        Some(l) => l,
                        None => { deadline = tokio::time::Instant::now() + RETRY; continue }
                    }
                }
                _ = shutdown.changed() => return,
            };
            let key = (latest.metadata.uid.clone(), latest.metadata.generation);
            if settled.as_ref() == Some(&key) {
                continue;
            }
            let (next, done) = match self.reconcile(&latest).await {
                Ok(true) => (RESYNC, Some(key)),
                Ok(false) => (RETRY, None),
                Err(e) => {
                    warn!(error = %e, "MigLayout reconcile failed; will retry");
                    (RETRY, None)
                }
            };
            settled = done;
            deadline = tokio::time::Instant::now() + next;
        }
    }

    /// The node's MigLayout, created (empty spec, owned by the Node) when absent.
    async fn fetch_or_create(&self) -> Option<MigLayout> {
        let got = match self.api().get_opt(&self.node).await {
            Ok(Some(l)) => return Some(l),
            Ok(None) => self.create().await,
            Err(e) => Err(e.into()),
        };
        got.inspect_err(|e| warn!(error = %e, "cannot read or create this node's MigLayout"))
            .ok()
    }

    /// One pass over the spec. Returns whether every listed GPU matches it now.
    async fn reconcile(&self, layout: &MigLayout) -> Result<bool, Error> {
        let generation = layout.metadata.generation.unwrap_or_default();
        let span = info_span!("miglayout_reconcile", node = %self.node, generation);
        async {
            let live = self.discover().await?;
            // MIG devices changed behind the plugin's back (or by a run that crashed): publish them.
            if self.state.refresh_mig(&live) {
                (self.republish)();
            }
            let mut outcomes: BTreeMap<String, GpuOutcome> = BTreeMap::new();
            for want in &layout.spec.gpus {
                let outcome = match live.gpus.iter().find(|g| g.uuid == want.uuid) {
                    Some(gpu) => {
                        let wanted: Vec<WantedMig> = want
                            .devices
                            .iter()
                            .map(|d| WantedMig {
                                profile: d.profile.clone(),
                                start: d.start,
                            })
                            .collect();
                        self.apply_gpu(gpu, &wanted).await
                    }
                    None => Err(Refusal {
                        reason: "Invalid",
                        message: format!("no GPU with UUID {} on node {}", want.uuid, self.node),
                    }),
                };
                outcomes.insert(want.uuid.clone(), outcome);
            }
            let live = match outcomes.values().any(|o| *o == Ok(true)) {
                true => self.discover().await?,
                false => live,
            };
            self.report(layout, &live, &outcomes).await?;
            Ok(outcomes.values().all(Result::is_ok))
        }
        .instrument(span)
        .await
    }

    async fn discover(&self) -> Result<Inventory, Error> {
        let backend = self.backend.clone();
        Ok(tokio::task::spawn_blocking(move || backend.discover())
            .await
            .map_err(|e| dra_plugin_core::Error::Device(format!("discovery task: {e}")))??)
    }

    /// Brings one GPU to `wanted`; the affected devices are out of the slices meanwhile.
    async fn apply_gpu(&self, gpu: &Gpu, wanted: &[WantedMig]) -> GpuOutcome {
        // Most passes find nothing to do: list the claims only when something would change.
        let change = plan_gpu(gpu, wanted, &BTreeSet::new())?;
        if change.is_empty() {
            return Ok(false);
        }
        check_not_held(&change, &self.held().await?)?;
        let span = info_span!("miglayout_gpu", gpu = %format!("gpu-{}", gpu.minor));
        async {
            info!(withdrawn = ?change.withdrawn, destroy = change.destroy.len(), create = change.create.len(), "changing MIG devices");
            self.withheld.add(&change.withdrawn);
            (self.republish)();
            let result = self.change_hardware(&change).await;
            // Whatever happened, publish what the hardware has now.
            match self.discover().await {
                Ok(live) => {
                    self.state.refresh_mig(&live);
                }
                Err(e) => warn!(error = %e, "rediscovery after a MIG change failed"),
            }
            self.withheld.remove(&change.withdrawn);
            (self.republish)();
            result.map(|()| true)
        }
        .instrument(span)
        .await
    }

    /// Waits until the withdrawn devices are gone from the API, checks the claims again, then
    /// destroys and creates.
    async fn change_hardware(&self, change: &GpuChange) -> Result<(), Refusal> {
        self.wait_unpublished(&change.withdrawn).await?;
        check_not_held(change, &self.held().await?)?;
        for d in &change.destroy {
            let (b, minor, id, start) = (
                self.backend.clone(),
                change.minor,
                d.gi_profile_id,
                d.placement_start,
            );
            let r = tokio::task::spawn_blocking(move || b.destroy_mig(minor, id, start)).await;
            self.count("destroy", &r);
            flatten(r).map_err(|e| {
                failed(format!(
                    "destroying {} at {start} on gpu-{minor}: {e}",
                    d.profile
                ))
            })?;
        }
        for n in &change.create {
            let (b, minor, id, start) =
                (self.backend.clone(), change.minor, n.gi_profile_id, n.start);
            let r =
                tokio::task::spawn_blocking(move || b.create_mig(minor, id, start).map(drop)).await;
            self.count("create", &r);
            flatten(r).map_err(|e| {
                failed(format!(
                    "creating {} at {start} on gpu-{minor}: {e}",
                    n.profile
                ))
            })?;
        }
        Ok(())
    }

    fn count<T>(
        &self,
        op: &'static str,
        r: &Result<Result<T, dra_plugin_core::Error>, tokio::task::JoinError>,
    ) {
        let result = match r {
            Ok(Ok(_)) => "ok",
            _ => "error",
        };
        self.metrics
            .mig_device_operations
            .get_or_create(&MigDeviceOperationLabels { op, result })
            .inc();
    }

    fn refused(&self, r: &Refusal) {
        self.metrics
            .mig_layout_refusals
            .get_or_create(&MigLayoutRefusalLabels { reason: r.reason })
            .inc();
    }
}

/// The newest object among `first` and the events already queued behind it.
fn newest(
    mut first: MigLayout,
    events: &mut (impl futures::Stream<Item = Result<MigLayout, watcher::Error>> + Unpin),
) -> MigLayout {
    while let Some(Some(Ok(obj))) = events.next().now_or_never() {
        first = obj;
    }
    first
}

fn failed(message: String) -> Refusal {
    Refusal {
        reason: "Failed",
        message,
    }
}

fn flatten<T>(
    r: Result<Result<T, dra_plugin_core::Error>, tokio::task::JoinError>,
) -> Result<T, String> {
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(format!("task: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::Device;

    #[test]
    fn withheld_devices_leave_the_pool_until_released() {
        let device = |name: &str| Device {
            name: name.into(),
            ..Default::default()
        };
        let pool = || {
            vec![SliceContent {
                devices: vec![device("gpu-0"), device("gpu-1-mig-3g40gb-9-4")],
                shared_counters: Vec::new(),
            }]
        };
        let names = |c: &[SliceContent]| -> Vec<String> {
            c.iter()
                .flat_map(|s| s.devices.iter().map(|d| d.name.clone()))
                .collect()
        };
        let w = Withheld::default();
        let gpu0: BTreeSet<String> = ["gpu-0".to_string()].into();
        w.add(&gpu0);
        let mut c = pool();
        w.remove_from(&mut c);
        assert_eq!(names(&c), ["gpu-1-mig-3g40gb-9-4"]);
        w.remove(&gpu0);
        let mut c = pool();
        w.remove_from(&mut c);
        assert_eq!(names(&c), ["gpu-0", "gpu-1-mig-3g40gb-9-4"]);
    }
}
