//! Keeps this node's ResourceSlices equal to what the node has: creates, updates (server-side
//! apply, one field manager), deletes obsolete ones, and re-creates them within about a second
//! when something (a restarting kubelet, an operator) deletes or changes them.
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use gpu_dra_api::names::PLUGIN_COMPONENT;
use gpu_dra_api::slices::{SliceContent, SliceOptions, to_resource_slices};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::Error;
use crate::metrics::{Metrics, gauge_count};

/// Re-list our slices this often even when nothing happened. The watch on them already pokes a
/// pass on any change (and on every re-list after a broken watch), so this is only a backstop,
/// and each pass is a LIST of every slice of the node.
const RESYNC: Duration = Duration::from_secs(600);

pub struct Publisher {
    client: kube::Client,
    opts: SliceOptions,
    metrics: Arc<Metrics>,
}

/// Counter slices and device slices live apart from 1.35 on; 1.34 wants them together.
pub async fn cluster_splits_counters(client: &kube::Client) -> bool {
    match client.apiserver_version().await {
        Ok(v) => v
            .minor
            .trim_end_matches('+')
            .parse::<u32>()
            .map(|m| m >= 35)
            .unwrap_or(true),
        Err(e) => {
            warn!(error = %e, "cannot read the API server version; assuming >= 1.35");
            true
        }
    }
}

/// True when every field `want` sets has the same value in `have` (the server adds defaults).
fn covers(have: &serde_json::Value, want: &serde_json::Value) -> bool {
    use serde_json::Value::*;
    match (have, want) {
        (Object(h), Object(w)) => w.iter().all(|(k, wv)| match h.get(k) {
            Some(hv) => covers(hv, wv),
            None => wv.is_null() || wv.as_array().is_some_and(|a| a.is_empty()),
        }),
        (Array(h), Array(w)) => h.len() == w.len() && h.iter().zip(w).all(|(h, w)| covers(h, w)),
        _ => have == want,
    }
}

/// `want` as JSON for [`covers`], with absent taints spelled as an empty list so that a lifted
/// taint counts as a difference (an absent field would match anything).
fn comparable(want: &k8s_openapi::api::resource::v1::ResourceSliceSpec) -> serde_json::Value {
    let mut want = want.clone();
    for d in want.devices.iter_mut().flatten() {
        d.taints.get_or_insert_with(Vec::new);
    }
    serde_json::to_value(&want).unwrap_or_default()
}

impl Publisher {
    pub fn new(client: kube::Client, opts: SliceOptions, metrics: Arc<Metrics>) -> Self {
        Publisher {
            client,
            opts,
            metrics,
        }
    }

    fn api(&self) -> Api<ResourceSlice> {
        Api::all(self.client.clone())
    }

    fn selector(&self) -> String {
        format!(
            "spec.nodeName={},spec.driver={}",
            self.opts.node_name, self.opts.driver
        )
    }

    async fn owner(&self) -> Result<OwnerReference, Error> {
        let node = Api::<Node>::all(self.client.clone())
            .get(&self.opts.node_name)
            .await?;
        Ok(OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: self.opts.node_name.clone(),
            uid: node.metadata.uid.unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: None,
        })
    }

    /// One reconcile pass. Returns whether anything was written.
    pub async fn sync(&self, contents: &[SliceContent]) -> Result<bool, Error> {
        let api = self.api();
        let existing = api
            .list(&ListParams::default().fields(&self.selector()))
            .await?
            .items;
        let max_gen = existing
            .iter()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(0);
        let current = to_resource_slices(contents.to_vec(), &self.opts, max_gen.max(1), None);
        let up_to_date = existing.len() == current.len()
            && current.iter().all(|want| {
                existing.iter().any(|have| {
                    have.metadata.name == want.metadata.name
                        && have.spec.pool.generation == max_gen
                        && covers(
                            &serde_json::to_value(&have.spec).unwrap_or_default(),
                            &comparable(&want.spec),
                        )
                })
            });
        let devices: usize = contents.iter().map(|c| c.devices.len()).sum();
        self.metrics.published_devices.set(gauge_count(devices));
        if up_to_date {
            return Ok(false);
        }
        let generation = max_gen + 1;
        let desired = to_resource_slices(
            contents.to_vec(),
            &self.opts,
            generation,
            Some(self.owner().await?),
        );
        let params = PatchParams::apply(PLUGIN_COMPONENT).force();
        for slice in &desired {
            let name = slice.metadata.name.clone().expect("slices are named");
            let mut body = serde_json::to_value(slice).expect("slice serializes");
            body["apiVersion"] = "resource.k8s.io/v1".into();
            body["kind"] = "ResourceSlice".into();
            api.patch(&name, &params, &Patch::Apply(body)).await?;
        }
        for old in existing
            .iter()
            .filter(|s| !desired.iter().any(|d| d.metadata.name == s.metadata.name))
        {
            let name = old.metadata.name.clone().unwrap_or_default();
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: old.metadata.uid.clone(),
                    resource_version: old.metadata.resource_version.clone(),
                }),
                ..Default::default()
            };
            match api.delete(&name, &dp).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        info!(
            slices = desired.len(),
            devices, generation, "published ResourceSlices"
        );
        Ok(true)
    }

    /// Publishes until `shutdown`, retrying with backoff while the API server is away and
    /// republishing on any change to our slices or to the node's devices.
    pub async fn run(
        self,
        mut contents: watch::Receiver<Vec<SliceContent>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let (poke_tx, mut poke) = tokio::sync::mpsc::channel::<()>(1);
        let watch_api = self.api();
        let cfg = watcher::Config::default().fields(&self.selector());
        let watch_task = tokio::spawn(async move {
            let mut events = watcher(watch_api, cfg).default_backoff().boxed();
            while let Some(ev) = events.next().await {
                match ev {
                    Ok(watcher::Event::Delete(s)) => {
                        debug!(slice = ?s.metadata.name, "slice deleted")
                    }
                    Ok(watcher::Event::Apply(_)) | Ok(watcher::Event::InitDone) => {}
                    Ok(_) => continue,
                    Err(e) => {
                        debug!(error = %e, "slice watch interrupted");
                        continue;
                    }
                }
                let _ = poke_tx.try_send(());
            }
        });
        let mut backoff = Duration::from_millis(200);
        loop {
            // The copy goes before the wait: at idle, only the channel holds the node's devices.
            let synced = {
                let snapshot = contents.borrow_and_update().clone();
                self.sync(&snapshot).await
            };
            release_free_memory();
            let wait = match synced {
                Ok(_) => {
                    backoff = Duration::from_millis(200);
                    RESYNC
                }
                Err(e) => {
                    self.metrics.publish_errors.inc();
                    warn!(error = %e, retry_in = ?backoff, "publishing ResourceSlices failed");
                    let w = backoff;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    w
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = poke.recv() => {
                    // Coalesce bursts (our own writes echo back as events).
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    while poke.try_recv().is_ok() {}
                }
                r = contents.changed() => if r.is_err() { break },
                _ = shutdown.changed() => break,
            }
            if *shutdown.borrow() {
                break;
            }
        }
        watch_task.abort();
    }
}

/// Every pass decodes the listed slices and builds the wanted ones, then frees them; glibc keeps
/// such freed pages in the process until told otherwise, and they would stay in the idle RSS
/// (10 MiB with 248 devices). Passes are rare at idle, so the trim costs nothing there.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the kernel; it is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::covers;

    #[test]
    fn server_defaults_do_not_count_as_drift() {
        let want = json!({"driver": "d", "devices": [{"name": "gpu-0", "attributes": {"a": {"int": 1}}}], "sharedCounters": null});
        let have = json!({"driver": "d", "devices": [{"name": "gpu-0", "attributes": {"a": {"int": 1}}, "allowMultipleAllocations": false}], "perDeviceNodeSelection": null});
        assert!(covers(&have, &want));
        let changed =
            json!({"driver": "d", "devices": [{"name": "gpu-0", "attributes": {"a": {"int": 2}}}]});
        assert!(!covers(&changed, &want));
        let fewer = json!({"driver": "d", "devices": []});
        assert!(!covers(&fewer, &want));
    }

    #[test]
    fn a_lifted_taint_is_a_difference() {
        use k8s_openapi::api::resource::v1::{Device, DeviceTaint, ResourceSliceSpec};
        let mut spec = ResourceSliceSpec {
            driver: "d".into(),
            devices: Some(vec![Device {
                name: "gpu-0".into(),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let untainted = serde_json::to_value(&spec).unwrap();
        assert!(
            covers(&untainted, &super::comparable(&spec)),
            "a server dropping the empty list is no drift"
        );
        spec.devices.as_mut().unwrap()[0].taints = Some(vec![DeviceTaint {
            key: "k".into(),
            value: None,
            effect: "NoSchedule".into(),
            time_added: None,
        }]);
        let tainted = serde_json::to_value(&spec).unwrap();
        spec.devices.as_mut().unwrap()[0].taints = None;
        assert!(
            !covers(&tainted, &super::comparable(&spec)),
            "the published taint must go"
        );
    }
}
