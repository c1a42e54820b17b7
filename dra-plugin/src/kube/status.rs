//! ResourceClaim `status.devices` (KEP-4817): after a prepare, one entry per prepared device
//! (driver, pool, device, share ID; `data.uuid`; a `Ready` condition); after an unprepare, none.
//!
//! Written by server-side apply on the status subresource under the plugin's field manager, so
//! entries of other drivers (and other managers) on the same claim stay as they are; clearing is
//! an apply that names no entries, which drops exactly ours. The kubelet never waits on this: a
//! background worker applies the newest wanted state of each claim and retries failures with
//! backoff, with a log line, a Warning event and a metric for each one.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dra_plugin_core::types::{ClaimRef, PreparedDevice};
use gpu_dra_api::names::DEVICE_READY_CONDITION;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{Instrument, debug, info_span, warn};

use super::events::NodeEvents;
use crate::metrics::Metrics;

/// Attempts before a claim's status is given up (about five minutes of backoff).
const MAX_ATTEMPTS: u32 = 10;
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(60);

/// Where prepares and unprepares report a claim's devices; never blocks the caller.
pub trait ClaimStatus: Send + Sync {
    fn prepared(&self, claim: &ClaimRef, devices: &[PreparedDevice]);
    fn unprepared(&self, claim: &ClaimRef);
}

/// The apply document: `devices` empty releases every entry this field manager owns.
pub fn status_patch(
    driver: &str,
    node: &str,
    claim: &ClaimRef,
    devices: &[PreparedDevice],
    now: &str,
) -> Value {
    let mut doc = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        // The UID makes the API server refuse to write into a re-created claim of the same name.
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
    });
    if devices.is_empty() {
        return doc;
    }
    let entries: Vec<Value> = devices
        .iter()
        .map(|d| {
            let mut e = json!({
                "driver": driver,
                "pool": d.pool_name,
                "device": d.device_name,
                "conditions": [{
                    "type": DEVICE_READY_CONDITION,
                    "status": "True",
                    "reason": "Prepared",
                    "message": format!("prepared on node {node}"),
                    "lastTransitionTime": now,
                }],
            });
            if let Some(share) = &d.share_id {
                e["shareID"] = json!(share);
            }
            if let Some(uuid) = &d.uuid {
                e["data"] = json!({ "uuid": uuid });
            }
            e
        })
        .collect();
    doc["status"] = json!({ "devices": entries });
    doc
}

/// What the worker should make true for one claim.
struct Wanted {
    claim: ClaimRef,
    /// Empty: no entries of ours.
    devices: Vec<PreparedDevice>,
}

impl Wanted {
    fn operation(&self) -> &'static str {
        match self.devices.is_empty() {
            true => "clear",
            false => "apply",
        }
    }
}

/// The API server side of [`ClaimStatus`]: a channel to the worker that [`ApiClaimStatus::spawn`]
/// starts.
pub struct ApiClaimStatus {
    tx: mpsc::UnboundedSender<Wanted>,
}

impl ApiClaimStatus {
    pub fn spawn(
        client: kube::Client,
        driver: &str,
        node: &str,
        metrics: Arc<Metrics>,
        events: Option<Arc<dyn NodeEvents>>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let worker = Worker {
            client,
            driver: driver.to_string(),
            node: node.to_string(),
            metrics,
            events,
        };
        tokio::spawn(worker.run(rx));
        ApiClaimStatus { tx }
    }
}

impl ClaimStatus for ApiClaimStatus {
    fn prepared(&self, claim: &ClaimRef, devices: &[PreparedDevice]) {
        let _ = self.tx.send(Wanted {
            claim: claim.clone(),
            devices: devices.to_vec(),
        });
    }

    fn unprepared(&self, claim: &ClaimRef) {
        let _ = self.tx.send(Wanted {
            claim: claim.clone(),
            devices: Vec::new(),
        });
    }
}

struct Pending {
    wanted: Wanted,
    attempts: u32,
    due: Instant,
}

enum Outcome {
    Done,
    /// Nothing to write any more (the claim is gone, replaced or no longer allocated here).
    Dropped(String),
    Retry(String),
}

struct Worker {
    client: kube::Client,
    driver: String,
    node: String,
    metrics: Arc<Metrics>,
    events: Option<Arc<dyn NodeEvents>>,
}

impl Worker {
    /// Keeps the newest wanted state per claim UID; applies what is due, one at a time (so the
    /// writes of one claim stay in order), earliest first. Everything queued is taken in before
    /// each write: a burst of prepares then leaves one entry per claim here instead of a backlog
    /// of stale states in the channel, and a claim unprepared meanwhile gets only the clear.
    async fn run(self, mut rx: mpsc::UnboundedReceiver<Wanted>) {
        let mut pending: HashMap<String, Pending> = HashMap::new();
        loop {
            loop {
                match rx.try_recv() {
                    Ok(w) => want(&mut pending, w),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => return,
                }
            }
            let next = pending
                .iter()
                .min_by_key(|(_, p)| p.due)
                .map(|(uid, p)| (uid.clone(), p.due));
            match next {
                Some((uid, due)) if due <= Instant::now() => {
                    let mut p = pending.remove(&uid).expect("the entry just found");
                    if self.attempt(&mut p).await {
                        pending.entry(uid).or_insert(p);
                    }
                }
                next => tokio::select! {
                    wanted = rx.recv() => match wanted {
                        Some(w) => want(&mut pending, w),
                        None => return,
                    },
                    _ = sleep_until(next.map(|(_, due)| due)) => {}
                },
            }
        }
    }

    /// One write; true when it should be tried again.
    async fn attempt(&self, p: &mut Pending) -> bool {
        let op = p.wanted.operation();
        let span = info_span!("claim_status", claimUID = %p.wanted.claim.uid, claim = %p.wanted.claim.key(), op);
        let outcome = self.write(&p.wanted).instrument(span.clone()).await;
        let _enter = span.enter();
        p.attempts += 1;
        match outcome {
            Outcome::Done => {
                debug!(devices = p.wanted.devices.len(), "claim status written");
                self.metrics.claim_status(op, "ok");
                false
            }
            Outcome::Dropped(why) => {
                debug!(why, "claim status not written");
                self.metrics.claim_status(op, "dropped");
                false
            }
            Outcome::Retry(error) if p.attempts < MAX_ATTEMPTS => {
                let delay = backoff(p.attempts);
                warn!(%error, attempt = p.attempts, retry_in = ?delay, "could not write the claim's status.devices; will retry");
                self.metrics.claim_status(op, "retry");
                if p.attempts == 1 {
                    self.event(&p.wanted, &error, "will retry");
                }
                p.due = Instant::now() + delay;
                true
            }
            Outcome::Retry(error) => {
                warn!(%error, attempts = p.attempts, "giving up on the claim's status.devices");
                self.metrics.claim_status(op, "dropped");
                self.event(&p.wanted, &error, "gave up");
                false
            }
        }
    }

    async fn write(&self, w: &Wanted) -> Outcome {
        let now = k8s_openapi::jiff::Timestamp::now()
            .round(k8s_openapi::jiff::Unit::Second)
            .map(|t| t.to_string())
            .unwrap_or_default();
        let doc = status_patch(&self.driver, &self.node, &w.claim, &w.devices, &now);
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &w.claim.namespace);
        let params = PatchParams::apply(gpu_dra_api::names::PLUGIN_COMPONENT).force();
        // The reply is the whole claim, managed fields included, and nothing reads it: taking it
        // as text skips decoding it into a ResourceClaim (API errors still come back as such).
        let req = kube::core::Request::new(api.resource_url()).patch_subresource(
            "status",
            &w.claim.name,
            &params,
            &Patch::Apply(&doc),
        );
        let req = match req {
            Ok(r) => r,
            Err(e) => return Outcome::Dropped(e.to_string()),
        };
        match self.client.request_text(req).await {
            Ok(_) => Outcome::Done,
            Err(e) => classify(e),
        }
    }

    fn event(&self, w: &Wanted, error: &str, what: &str) {
        if let Some(events) = &self.events {
            events.warning(
                "ClaimStatusFailed",
                "UpdateClaimStatus",
                format!(
                    "ResourceClaim {} (UID {}): writing status.devices failed ({what}): {error}",
                    w.claim.key(),
                    w.claim.uid
                ),
            );
        }
    }
}

/// Replaces what was wanted for `w`'s claim (a retry in backoff included) by `w`, due now.
fn want(pending: &mut HashMap<String, Pending>, w: Wanted) {
    let uid = w.claim.uid.clone();
    let due = Instant::now();
    pending.insert(
        uid,
        Pending {
            wanted: w,
            attempts: 0,
            due,
        },
    );
}

/// 404: the claim is gone; 409: another claim of the same name (UID mismatch); 422: the API
/// server refuses the entries (the claim was deallocated meanwhile). Anything else may pass
/// later.
fn classify(e: kube::Error) -> Outcome {
    match &e {
        kube::Error::Api(s) if [404, 409, 422].contains(&s.code) => Outcome::Dropped(e.to_string()),
        _ => Outcome::Retry(e.to_string()),
    }
}

fn backoff(attempts: u32) -> Duration {
    FIRST_RETRY
        .saturating_mul(1 << attempts.saturating_sub(1).min(10))
        .min(MAX_RETRY)
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
