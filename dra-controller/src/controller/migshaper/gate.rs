//! The shaper runs only while a GPUCluster enables on-demand MIG. Its watches cover every Pod,
//! ResourceClaim, ResourceSlice and MigLayout in the cluster; with the mode off the shaper has
//! nothing to do, so those watches are not opened at all and cost neither memory nor API traffic.
use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tracing::{info, warn};

use super::run::Ctx;
use crate::controller::crd::GPUCluster;

/// Whether any GPUCluster enables on-demand MIG, as a watch of GPUClusters sees them.
#[derive(Default)]
pub struct Enabled {
    by_name: BTreeMap<String, bool>,
    /// Names seen since the last relist began; the rest were deleted while the watch was down.
    relisted: Option<BTreeMap<String, bool>>,
}

impl Enabled {
    /// Fold one watch event in; the result says whether the mode is on afterwards.
    pub fn apply(&mut self, event: watcher::Event<GPUCluster>) -> bool {
        let on = |gc: &GPUCluster| gc.spec.dra_driver.gpus.on_demand_mig().is_some();
        match event {
            watcher::Event::Apply(gc) => {
                self.by_name.insert(gc.name_any(), on(&gc));
            }
            watcher::Event::Delete(gc) => {
                self.by_name.remove(&gc.name_any());
            }
            watcher::Event::Init => self.relisted = Some(BTreeMap::new()),
            watcher::Event::InitApply(gc) => {
                self.relisted
                    .get_or_insert_default()
                    .insert(gc.name_any(), on(&gc));
            }
            watcher::Event::InitDone => {
                if let Some(all) = self.relisted.take() {
                    self.by_name = all;
                }
            }
        }
        self.on()
    }

    pub fn on(&self) -> bool {
        self.by_name.values().any(|&on| on)
    }
}

/// Follow the GPUClusters and run `shaper` (the shaper's controller, stopping when the future it
/// is given resolves) while the mode is on, until `shutdown`.
pub async fn run<S, F>(
    client: Client,
    ctx: Arc<Ctx>,
    shutdown: S,
    shaper: impl Fn(Client, Arc<Ctx>, ModeOff<S>) -> F,
) where
    S: Future<Output = ()> + Clone + Send + Sync + Unpin + 'static,
    F: Future<Output = ()>,
{
    let (tx, mut rx) = watch::channel(false);
    let api = Api::<GPUCluster>::all(client.clone());
    let follow = async move {
        let mut state = Enabled::default();
        let events = watcher(api, watcher::Config::default()).default_backoff();
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => {
                    let on = state.apply(event);
                    tx.send_if_modified(|was| std::mem::replace(was, on) != on);
                }
                Err(e) => warn!(error = %e, "watching GPUClusters for on-demand MIG failed"),
            }
        }
    };
    let supervise = async {
        loop {
            if rx.wait_for(|on| *on).await.is_err() {
                return;
            }
            info!("on-demand MIG is on: starting the MIG shaper");
            shaper(
                client.clone(),
                ctx.clone(),
                ModeOff {
                    rx: rx.clone(),
                    shutdown: shutdown.clone(),
                },
            )
            .await;
            if shutdown.clone().now_or_never().is_some() {
                return;
            }
            info!("on-demand MIG is off: MIG shaper stopped");
        }
    };
    tokio::select! {
        () = follow => {}
        () = supervise => {}
        () = shutdown.clone() => {}
    }
}

/// Resolves when on-demand MIG goes off or the process shuts down: the shaper's graceful
/// shutdown signal.
pub struct ModeOff<S> {
    rx: watch::Receiver<bool>,
    shutdown: S,
}

impl<S: Future<Output = ()> + Send + Sync + Unpin + 'static> ModeOff<S> {
    pub async fn wait(mut self) {
        tokio::select! {
            _ = self.rx.wait_for(|on| !*on) => {}
            () = self.shutdown => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::crd::GPUClusterSpec;

    fn gc(name: &str, on: bool) -> GPUCluster {
        let spec: GPUClusterSpec = serde_json::from_value(serde_json::json!({
            "draDriver": {"gpus": {"onDemandMig": {"enabled": on}}}
        }))
        .unwrap();
        GPUCluster::new(name, spec)
    }

    #[test]
    fn the_mode_follows_applies_deletes_and_relists() {
        let mut e = Enabled::default();
        assert!(!e.apply(watcher::Event::Apply(gc("gpu-cluster", false))));
        assert!(e.apply(watcher::Event::Apply(gc("gpu-cluster", true))));
        assert!(!e.apply(watcher::Event::Delete(gc("gpu-cluster", true))));
        assert!(e.apply(watcher::Event::Apply(gc("gpu-cluster", true))));
        // a relist that no longer holds it: deleted while the watch was down
        e.apply(watcher::Event::Init);
        assert!(e.on(), "the old state holds until the relist is complete");
        assert!(!e.apply(watcher::Event::InitDone));
        e.apply(watcher::Event::Init);
        e.apply(watcher::Event::InitApply(gc("gpu-cluster", true)));
        assert!(e.apply(watcher::Event::InitDone));
    }
}
