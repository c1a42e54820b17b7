//! The shaper's Kubernetes side: one pass over the whole pool per reconcile of the GPUCluster
//! (read everything, `decide`, server-side apply the changed MigLayout specs, Events, metrics).
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_dra_api::miglayout::{GpuLayout, MigLayout};
use gpu_dra_api::names::MIG_LAYOUT_CONTROLLER_FIELD_MANAGER;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use super::decide::{Change, Decision, State, decide};
use super::model::NodeState;
use super::{Policy, UnmetReason, demand};
use crate::controller::crd::GPUCluster;
use crate::controller::error::{Error, Result};
use crate::controller::metrics::{KindLabel, Metrics, ReasonLabel};

/// A pass at least this often, so missed triggers and clock-driven hold-downs catch up.
const RESYNC: Duration = Duration::from_secs(60);
const CONTROLLER: &str = "migshaper";

pub struct Ctx {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub memory: Mutex<Memory>,
}

/// What passes carry from one to the next (lost on restart, which only delays merges).
#[derive(Default)]
pub struct Memory {
    pub idle_since: BTreeMap<String, Instant>,
    /// The reason last reported per pod, so each pod gets one Event per reason.
    pub reported: BTreeMap<String, UnmetReason>,
    /// When the last pass started: passes are spaced by [`MIN_INTERVAL`].
    pub last_pass: Option<Instant>,
}

/// Events arriving while a pass waits out this interval are folded into that pass. A debounce
/// (delay reset by every event) would never run under a steady stream of events.
const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// Everything a pass reads.
struct Objects {
    layouts: Vec<MigLayout>,
    slices: Vec<ResourceSlice>,
    classes: Vec<DeviceClass>,
    claims: Vec<ResourceClaim>,
    pods: Vec<Pod>,
    node_labels: BTreeMap<String, BTreeMap<String, String>>,
}

async fn load(client: &Client) -> Result<Objects> {
    let all = ListParams::default();
    let pending = ListParams::default().fields("spec.nodeName=,status.phase=Pending");
    Ok(Objects {
        layouts: Api::<MigLayout>::all(client.clone())
            .list(&all)
            .await?
            .items,
        slices: Api::<ResourceSlice>::all(client.clone())
            .list(&all)
            .await?
            .items,
        classes: Api::<DeviceClass>::all(client.clone())
            .list(&all)
            .await?
            .items,
        claims: Api::<ResourceClaim>::all(client.clone())
            .list(&all)
            .await?
            .items,
        pods: Api::<Pod>::all(client.clone()).list(&pending).await?.items,
        // Names and labels only: node selectors are all the shaper checks.
        node_labels: Api::<Node>::all(client.clone())
            .list_metadata(&all)
            .await?
            .items
            .into_iter()
            .map(|n| (n.name_any(), n.metadata.labels.unwrap_or_default()))
            .collect(),
    })
}

pub async fn reconcile(gc: Arc<GPUCluster>, ctx: Arc<Ctx>) -> Result<Action> {
    let Some(spec) = gc.spec.dra_driver.gpus.on_demand_mig() else {
        return Ok(Action::await_change());
    };
    let since_last = lock(&ctx.memory).last_pass.map(|t| t.elapsed());
    if let Some(wait) = since_last.and_then(|e| MIN_INTERVAL.checked_sub(e)) {
        tokio::time::sleep(wait).await;
    }
    lock(&ctx.memory).last_pass = Some(Instant::now());
    let _timer = ctx.metrics.reconcile.measure(CONTROLLER);
    let policy = Policy::from_spec(spec).ok_or_else(|| Error::HoldDown(spec.hold_down.clone()))?;
    let objs = load(&ctx.client).await?;
    let allocated = demand::allocated(&objs.claims);
    let idle_since = lock(&ctx.memory).idle_since.clone();
    let state = State {
        nodes: objs.layouts.iter().map(NodeState::from_layout).collect(),
        slices: &objs.slices,
        classes: &objs.classes,
        allocated: &allocated,
        pending: demand::pending(&objs.pods, &objs.claims, &objs.classes),
        node_labels: objs.node_labels.clone(),
        idle_since,
    };
    let decision = decide(state, &policy, Instant::now());
    write_layouts(&ctx.client, &decision.layouts).await?;
    lock(&ctx.memory).idle_since = decision.idle_since.clone();
    report_changes(&ctx, &objs.layouts, &decision.changes).await;
    report_unmet(&ctx, &objs.pods, &decision).await;
    let next = decision.next_check.map_or(RESYNC, |d| d.min(RESYNC));
    Ok(Action::requeue(next.max(Duration::from_secs(1))))
}

/// Pure: how long to wait after a failure.
pub fn error_policy(_gc: Arc<GPUCluster>, err: &Error, ctx: Arc<Ctx>) -> Action {
    ctx.metrics.reconcile.failure(CONTROLLER, err);
    match err {
        Error::HoldDown(_) => Action::requeue(RESYNC),
        _ => Action::requeue(Duration::from_secs(5)),
    }
}

fn lock(m: &Mutex<Memory>) -> std::sync::MutexGuard<'_, Memory> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Server-side applies each changed node's whole `spec.gpus` under the shaper's field manager.
async fn write_layouts(client: &Client, layouts: &BTreeMap<String, Vec<GpuLayout>>) -> Result<()> {
    let api = Api::<MigLayout>::all(client.clone());
    let params = PatchParams::apply(MIG_LAYOUT_CONTROLLER_FIELD_MANAGER).force();
    for (node, gpus) in layouts {
        let body = json!({
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "MigLayout",
            "metadata": { "name": node },
            "spec": { "gpus": gpus },
        });
        api.patch(node, &params, &Patch::Apply(&body)).await?;
        info!(node, gpus = gpus.len(), "MigLayout spec applied");
    }
    Ok(())
}

fn recorder(client: &Client) -> Recorder {
    Recorder::new(
        client.clone(),
        Reporter {
            controller: MIG_LAYOUT_CONTROLLER_FIELD_MANAGER.into(),
            instance: None,
        },
    )
}

/// One Normal Event per change on the node's MigLayout, and the changes metric.
async fn report_changes(ctx: &Ctx, layouts: &[MigLayout], changes: &[Change]) {
    let rec = recorder(&ctx.client);
    for c in changes {
        ctx.metrics
            .mig
            .changes
            .get_or_create(&KindLabel {
                kind: c.kind.as_str(),
            })
            .inc();
        let Some(ml) = layouts.iter().find(|l| l.name_any() == c.node) else {
            continue;
        };
        let event = Event {
            type_: EventType::Normal,
            reason: reason_of(c).into(),
            note: Some(describe(c)),
            action: "ShapeMig".into(),
            secondary: None,
        };
        if let Err(e) = rec.publish(&event, &ml.object_ref(&())).await {
            warn!(error = %e, node = c.node, "publishing a MigLayout Event failed");
        }
    }
}

fn reason_of(c: &Change) -> &'static str {
    use super::ChangeKind::*;
    match c.kind {
        Carve => "MigDeviceWanted",
        PreCarve => "MigDevicePreCarved",
        Merge => "MigGpuMerged",
        Restore => "MigDeviceRestored",
    }
}

/// The Event's note for a change.
pub fn describe(c: &Change) -> String {
    let what = c
        .placement
        .as_ref()
        .map(|p| format!("{} at memory slice {}", p.profile, p.start));
    match (c.kind, what) {
        (super::ChangeKind::Merge, _) => format!(
            "GPU {}: every MIG device idle for the hold-down; back to whole",
            c.gpu
        ),
        (kind, Some(what)) => format!(
            "GPU {}: {} {what}{}",
            c.gpu,
            kind.as_str(),
            c.claim
                .as_ref()
                .map(|k| format!(" for claim {k}"))
                .unwrap_or_default()
        ),
        (super::ChangeKind::Restore, None) => format!(
            "GPU {}: allocated whole before it was carved; it stays whole",
            c.gpu
        ),
        (kind, None) => format!("GPU {}: {}", c.gpu, kind.as_str()),
    }
}

/// A Warning Event on each pod whose claim no change can serve, once per pod and reason; the
/// unmet gauge by reason.
async fn report_unmet(ctx: &Ctx, pods: &[Pod], decision: &Decision) {
    let mut counts: BTreeMap<UnmetReason, i64> = BTreeMap::new();
    let mut fresh = Vec::new();
    {
        let mut mem = lock(&ctx.memory);
        let mut reported = BTreeMap::new();
        for u in &decision.unmet {
            *counts.entry(u.reason).or_default() += 1;
            if mem.reported.get(&u.pod) != Some(&u.reason) {
                fresh.push(u.clone());
            }
            reported.insert(u.pod.clone(), u.reason);
        }
        mem.reported = reported;
    }
    for reason in [
        UnmetReason::NoMatchingProfile,
        UnmetReason::AllCandidatesBusy,
    ] {
        let n = counts.get(&reason).copied().unwrap_or(0);
        ctx.metrics
            .mig
            .unmet
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .set(n);
    }
    let rec = recorder(&ctx.client);
    for u in fresh {
        let Some(pod) = pods.iter().find(|p| pod_key(p) == u.pod) else {
            continue;
        };
        let event = Event {
            type_: EventType::Warning,
            reason: u.reason.as_str().into(),
            note: Some(u.reason.message(&u.claim)),
            action: "ShapeMig".into(),
            secondary: None,
        };
        if let Err(e) = rec.publish(&event, &pod.object_ref(&())).await {
            warn!(error = %e, pod = u.pod, "publishing the unmet-demand Event failed");
        }
    }
}

fn pod_key(p: &Pod) -> String {
    format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())
}
