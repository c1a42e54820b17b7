//! The GPUCluster reconciler: DeviceClasses, RBAC, the VAP, the kubelet-plugin DaemonSet, the
//! ComputeDomain controller, pool node labels and status; ordered teardown behind a finalizer.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use gpu_dra_api::names::{
    COMPUTE_DOMAIN_DRIVER, CONTROLLER_FIELD_MANAGER, DEVICE_PLUGIN_LABEL, DRA_DRIVER_LABEL,
    GPU_DRIVER, GPU_RESOURCE, GPUCLUSTER_FINALIZER,
};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, CustomResourceExt, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, instrument, warn};

use super::apply::{apply, delete, params, set_finalizer};
use super::conflict::{self, Decision, GPU_OPERATOR};
use super::crd::{GPUCluster, GPUClusterSpec, State};
use super::error::{Error, Result};
use super::labels::COMPONENT;
use super::metrics::Metrics;
use super::pages;
use super::pool::{self, NodeFacts, PoolPlan};
use super::render::{self, CD_CONTROLLER, PLUGIN, Target};
use super::{deviceclasses, status};

/// Label value of `app.kubernetes.io/component` on per-domain IMEX daemon DaemonSets.
pub const CD_DAEMON_COMPONENT: &str = "compute-domain-daemon";

/// Shared by every reconcile.
pub struct Ctx {
    pub client: Client,
    /// Where the driver's namespaced objects live.
    pub namespace: String,
    pub metrics: Arc<Metrics>,
    /// Logging variables for the components this controller deploys ([`render::Target::log_env`]).
    pub log_env: Vec<(&'static str, String)>,
}

/// Requeue while a node or teardown step waits on something no watch announces promptly.
const SHORT_REQUEUE: Duration = Duration::from_secs(5);
const RESYNC: Duration = Duration::from_secs(300);
/// While standing by: look again for the other controller this often (its Deployment is not watched).
const STANDBY_RECHECK: Duration = Duration::from_secs(60);

#[instrument(skip(gc, ctx), fields(name = %gc.name_any()))]
pub async fn reconcile(gc: Arc<GPUCluster>, ctx: Arc<Ctx>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile.measure("gpucluster");
    let api: Api<GPUCluster> = Api::all(ctx.client.clone());
    // Before anything else, the finalizer included: the operator's controller uses the same one.
    let operators = Api::<Deployment>::all(ctx.client.clone())
        .list(&ListParams::default().fields(&format!("metadata.name={GPU_OPERATOR}")))
        .await?;
    let mut facts = conflict::Facts::new(&gc, &operators.items);
    facts.crd_has_pool = installed_crd_has_pool(&ctx.client).await;
    if let Decision::StandBy { reason, message } = conflict::decide(&facts) {
        return stand_by(&api, &gc, &ctx, reason, message).await;
    }
    let has_finalizer = gc.finalizers().iter().any(|f| f == GPUCLUSTER_FINALIZER);
    if gc.meta().deletion_timestamp.is_some() {
        if !has_finalizer {
            return Ok(Action::await_change());
        }
        return match teardown(&ctx).await? {
            Teardown::Waiting(what) => {
                info!(waiting_for = what, "teardown in progress");
                Ok(Action::requeue(SHORT_REQUEUE))
            }
            Teardown::Done => {
                set_finalizer(&api, gc.as_ref(), GPUCLUSTER_FINALIZER, false).await?;
                Ok(Action::await_change())
            }
        };
    }
    if !has_finalizer {
        set_finalizer(&api, gc.as_ref(), GPUCLUSTER_FINALIZER, true).await?;
        return Ok(Action::await_change());
    }
    converge(&gc, &ctx).await
}

/// `None` when the CRD cannot be read (RBAC), which is no reason to stop reconciling.
async fn installed_crd_has_pool(client: &Client) -> Option<bool> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    match crds.get(GPUCluster::crd_name()).await {
        Ok(crd) => Some(conflict::crd_has_pool(&crd)),
        Err(e) => {
            debug!(error = %e, "cannot read the GPUCluster CRD; not checking its schema");
            None
        }
    }
}

/// Leave the object to the other controller: touch nothing but our `ControllerConflict` condition,
/// written (with a Warning Event) only when it changes, so two controllers never trade writes.
async fn stand_by(
    api: &Api<GPUCluster>,
    gc: &GPUCluster,
    ctx: &Ctx,
    reason: &'static str,
    message: String,
) -> Result<Action> {
    let previous = gc
        .status
        .as_ref()
        .map_or(&[][..], |s| s.conditions.as_slice());
    let Some(conditions) = conflict::conditions(
        previous,
        gc.metadata.generation,
        reason,
        &message,
        Timestamp::now(),
    ) else {
        return Ok(Action::requeue(STANDBY_RECHECK));
    };
    warn!(
        reason,
        message, "another GPUCluster controller is active; standing by"
    );
    // A merge patch guarded by resourceVersion: the list is replaced whole, so it must not
    // overwrite conditions the other controller wrote meanwhile.
    let mut body = json!({ "metadata": { "resourceVersion": gc.resource_version() }, "status": { "conditions": conditions } });
    // The operator's CRD requires status.state; the other controller's value stays when there is one.
    if gc.status.as_ref().is_none_or(|s| s.state.is_none()) {
        body["status"]["state"] = json!(State::NotReady);
    }
    let params = PatchParams {
        field_manager: Some(CONTROLLER_FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    api.patch_status(&gc.name_any(), &params, &Patch::Merge(body))
        .await?;
    let reporter = Reporter {
        controller: CONTROLLER_FIELD_MANAGER.into(),
        instance: None,
    };
    let event = Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(message),
        action: "StandBy".into(),
        secondary: None,
    };
    let recorder = Recorder::new(ctx.client.clone(), reporter);
    if let Err(e) = recorder.publish(&event, &gc.object_ref(&())).await {
        warn!(error = %e, "publishing the stand-by Event failed");
    }
    Ok(Action::requeue(STANDBY_RECHECK))
}

/// Pure: how long to wait after a failure. Bad input waits longer than API trouble.
pub fn error_policy(_gc: Arc<GPUCluster>, err: &Error, ctx: Arc<Ctx>) -> Action {
    ctx.metrics.reconcile.failure("gpucluster", err);
    match err {
        Error::Selector(_) | Error::Manifest { .. } => Action::requeue(RESYNC),
        _ => Action::requeue(Duration::from_secs(15)),
    }
}

async fn converge(gc: &GPUCluster, ctx: &Ctx) -> Result<Action> {
    let client = &ctx.client;
    let ns = ctx.namespace.as_str();
    let owner = gc
        .controller_owner_ref(&())
        .ok_or(Error::MissingField("metadata.uid"))?;
    let spec: &GPUClusterSpec = &gc.spec;
    let target = Target {
        namespace: ns,
        owner,
        spec,
        log_env: &ctx.log_env,
    };

    let plan = observe_pool(ctx, spec).await?;

    let classes: Api<DeviceClass> = Api::all(client.clone());
    let (keep, drop) = deviceclasses::desired(
        spec.migration_pool
            .map_extended_resource
            .then_some(spec.migration_pool.extended_resource_class),
    )?;
    for mut class in keep {
        class.metadata.owner_references = Some(vec![target.owner.clone()]);
        apply(&classes, &class).await?;
    }
    for name in drop {
        delete(&classes, &name).await?;
    }

    let plugin_rbac = render::plugin_rbac(&target)?;
    apply(
        &Api::<ServiceAccount>::namespaced(client.clone(), ns),
        &plugin_rbac.service_account,
    )
    .await?;
    apply(&Api::<ClusterRole>::all(client.clone()), &plugin_rbac.role).await?;
    apply(
        &Api::<ClusterRoleBinding>::all(client.clone()),
        &plugin_rbac.binding,
    )
    .await?;
    apply(
        &Api::<ValidatingAdmissionPolicy>::all(client.clone()),
        &render::slice_policy(&target)?,
    )
    .await?;
    let vapb = render::slice_policy_binding(&target)?;
    apply(
        &Api::<ValidatingAdmissionPolicyBinding>::all(client.clone()),
        &vapb,
    )
    .await?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    let ds = apply(&daemonsets, &render::plugin_daemonset(&target)?).await?;

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    if spec.dra_driver.compute_domains.enabled {
        let rbac = render::cd_controller_rbac(&target)?;
        apply(
            &Api::<ServiceAccount>::namespaced(client.clone(), ns),
            &rbac.service_account,
        )
        .await?;
        apply(&Api::<ClusterRole>::all(client.clone()), &rbac.role).await?;
        apply(
            &Api::<ClusterRoleBinding>::all(client.clone()),
            &rbac.binding,
        )
        .await?;
        apply(&deployments, &render::cd_controller_deployment(&target)?).await?;
    } else {
        delete(&deployments, CD_CONTROLLER).await?;
    }
    super::dcgm::converge(client, &target).await?;

    label_nodes(client, &plan).await?;

    let st = status::compute(&status::Inputs {
        plan: &plan,
        daemonset: ds.status.as_ref(),
        namespace: ns,
        generation: gc.metadata.generation,
        previous: gc.status.as_ref().map_or(&[], |s| s.conditions.as_slice()),
        now: Timestamp::now(),
    });
    ctx.metrics.pool.set(&plan);
    let api: Api<GPUCluster> = Api::all(client.clone());
    let body = json!({ "apiVersion": GPUCluster::api_version(&()), "kind": GPUCluster::kind(&()), "status": st });
    api.patch_status(&gc.name_any(), &params(), &Patch::Apply(body))
        .await?;

    Ok(Action::requeue(if plan.in_transition() {
        SHORT_REQUEUE
    } else {
        RESYNC
    }))
}

/// Read nodes, allocated claims and plugin pods, and plan the pool. Each list is read page by page
/// and reduced to [`NodeFacts`] as it arrives: the plan needs a few fields of each object, and a
/// whole cluster's Nodes and claims decoded at once would be the controller's largest allocation.
async fn observe_pool(ctx: &Ctx, spec: &GPUClusterSpec) -> Result<PoolPlan> {
    let client = &ctx.client;
    let selector = pool::pool_selector(spec.migration_pool.node_selector.as_ref())?;
    let mut facts: Vec<NodeFacts> = Vec::new();
    pages::for_each(
        &Api::<Node>::all(client.clone()),
        ListParams::default(),
        |n| {
            facts.push(NodeFacts {
                advertises_gpu: advertises_gpu(&n),
                owned_labels: pool::owned_label_keys(n.managed_fields(), CONTROLLER_FIELD_MANAGER),
                name: n.metadata.name.unwrap_or_default(),
                labels: n.metadata.labels.unwrap_or_default(),
                ..NodeFacts::default()
            })
        },
    )
    .await?;
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    pages::for_each(
        &Api::<ResourceClaim>::all(client.clone()),
        ListParams::default(),
        |claim| {
            for node in claim_nodes(&claim) {
                *per_node.entry(node).or_default() += 1;
            }
        },
    )
    .await?;
    let mut plugin_nodes: BTreeSet<String> = BTreeSet::new();
    pages::for_each(
        &Api::<Pod>::namespaced(client.clone(), &ctx.namespace),
        ListParams::default().labels(&format!("app.kubernetes.io/name={PLUGIN}")),
        |p| plugin_nodes.extend(p.spec.and_then(|s| s.node_name)),
    )
    .await?;
    for f in &mut facts {
        f.prepared_claims = per_node.get(&f.name).copied().unwrap_or(0);
        f.plugin_pod = plugin_nodes.contains(&f.name);
    }
    Ok(pool::plan(&selector, &facts))
}

/// Nodes (pools) on which a claim holds devices of our drivers. Our plugins name pools after nodes.
pub fn claim_nodes(claim: &ResourceClaim) -> Vec<String> {
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default();
    let mut nodes: Vec<String> = results
        .iter()
        .filter(|r| r.driver == GPU_DRIVER || r.driver == COMPUTE_DOMAIN_DRIVER)
        .map(|r| r.pool.clone())
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// `nvidia.com/gpu` in allocatable with a non-zero quantity.
pub fn advertises_gpu(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(GPU_RESOURCE))
        .is_some_and(|q| {
            q.0.chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .any(|c| ('1'..='9').contains(&c))
        })
}

async fn label_nodes(client: &Client, plan: &PoolPlan) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for node in plan.updates() {
        info!(node = %node.name, role = ?node.role, labels = ?node.labels, "writing pool labels");
        let body = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": node.name, "labels": node.labels },
        });
        nodes
            .patch(&node.name, &params(), &Patch::Apply(body))
            .await?;
    }
    Ok(())
}

enum Teardown {
    Waiting(&'static str),
    Done,
}

/// Claim consumers first, the kubelet plugin last, then our node labels.
async fn teardown(ctx: &Ctx) -> Result<Teardown> {
    let client = &ctx.client;
    let ns = ctx.namespace.as_str();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    let mut consumers_left = delete(&deployments, CD_CONTROLLER).await?;
    let lp = ListParams::default().labels(&format!("{COMPONENT}={CD_DAEMON_COMPONENT}"));
    for ds in daemonsets.list(&lp).await?.items {
        consumers_left |= delete(&daemonsets, &ds.name_any()).await?;
    }
    // The DCGM exporter holds admin-access claims on the plugin's devices.
    consumers_left |= super::dcgm::prune(client, ns).await?;
    if consumers_left {
        return Ok(Teardown::Waiting("claim consumers"));
    }
    if delete(&daemonsets, PLUGIN).await? {
        return Ok(Teardown::Waiting("kubelet plugin"));
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let mut labelled: Vec<String> = Vec::new();
    pages::for_each(&nodes, ListParams::default(), |node| {
        let owned = pool::owned_label_keys(node.managed_fields(), CONTROLLER_FIELD_MANAGER);
        if owned
            .iter()
            .any(|k| k == DEVICE_PLUGIN_LABEL || k == DRA_DRIVER_LABEL)
        {
            labelled.push(node.name_any());
        }
    })
    .await?;
    for name in labelled {
        let body = json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": name, "labels": {} } });
        if let Err(e) = nodes.patch(&name, &params(), &Patch::Apply(body)).await {
            warn!(node = %name, error = %e, "releasing pool labels failed");
            return Err(e.into());
        }
    }
    Ok(Teardown::Done)
}
