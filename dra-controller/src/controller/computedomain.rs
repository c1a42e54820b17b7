//! The ComputeDomain reconciler: for each domain, the workload ResourceClaimTemplate in its namespace,
//! a per-domain IMEX daemon DaemonSet and that DaemonSet's ResourceClaimTemplate in the driver
//! namespace, and the domain's status; on deletion everything goes in order, then the finalizer.
//!
//! With `ComputeDomainCliques` on, the daemons also go into ComputeDomainClique objects
//! ([`super::cdclique`]) and the status is built from those, as NVIDIA does.
//!
//! The daemon objects live in the driver namespace, where a namespaced ComputeDomain cannot own them
//! (owner references never cross namespaces), so they carry the domain's UID as a label and the
//! finalizer is what removes them.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gpu_dra_api::config::OpaqueConfig;
use gpu_dra_api::config::v1beta1::{ComputeDomainChannelConfig, ComputeDomainDaemonConfig};
use gpu_dra_api::names::{
    COMPUTE_DOMAIN_CHANNEL_CLASS, COMPUTE_DOMAIN_DAEMON_CLASS, COMPUTE_DOMAIN_DRIVER,
    COMPUTE_DOMAIN_FINALIZER, COMPUTE_DOMAIN_NAME_ANNOTATION, COMPUTE_DOMAIN_NAMESPACE_ANNOTATION,
    COMPUTE_DOMAIN_NODE_LABEL,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::{info, instrument};

use super::apply::{apply, delete, delete_background, params, set_finalizer};
use super::cdclique;
use super::crd::{
    AllocationMode, ComputeDomain, ComputeDomainNode, ComputeDomainStatus, DomainStatus,
};
use super::error::{Error, Result};
use super::gpucluster::CD_DAEMON_COMPONENT;
use super::labels::{COMPONENT, MANAGED_BY, PART_OF};
use super::metrics::Metrics;

/// Request name in the workload template; pods refer to it in `resources.claims[].request`.
pub const CHANNEL_REQUEST: &str = "channel";
/// Request name in the daemon template.
pub const DAEMON_REQUEST: &str = "daemon";

const CONTROLLER: &str = "computedomain";
const SHORT_REQUEUE: Duration = Duration::from_secs(5);
/// Templates, daemon DaemonSets and daemon pods are all watched, so a change reaches us without
/// polling; this resync only bounds drift from a missed event, and keeps an idle cluster quiet.
const RESYNC: Duration = Duration::from_secs(3600);
/// How long a domain that cannot be built waits before the next try.
const INVALID_RETRY: Duration = Duration::from_secs(300);

/// Shared by every reconcile.
pub struct Ctx {
    pub client: Client,
    /// The driver namespace, home of the daemon DaemonSets and their templates.
    pub namespace: String,
    /// Image and command of the IMEX daemon container.
    pub daemon: DaemonImage,
    pub metrics: Arc<Metrics>,
    /// `ComputeDomainCliques`: daemons go into ComputeDomainClique objects, and status from there.
    pub cliques: bool,
}

/// What the per-domain daemon pods run.
#[derive(Clone, Debug)]
pub struct DaemonImage {
    pub image: String,
    pub command: Vec<String>,
    /// The startup, readiness and liveness probe's command; none when empty. A daemon pod is
    /// `Ready` in the domain's status only once it passes.
    pub check: Vec<String>,
}

/// Name of a domain's daemon DaemonSet and of its ResourceClaimTemplate (`compute-domain-daemon-<uid>`,
/// 58 characters: within the 63 a label value, and so a DaemonSet's pods, allows).
pub fn daemon_name(uid: &str) -> String {
    format!("{CD_DAEMON_COMPONENT}-{uid}")
}

fn domain_uid(cd: &ComputeDomain) -> Result<String> {
    cd.uid().ok_or(Error::MissingField("metadata.uid"))
}

fn domain_namespace(cd: &ComputeDomain) -> Result<String> {
    cd.namespace()
        .ok_or(Error::MissingField("metadata.namespace"))
}

fn labels(uid: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), CD_DAEMON_COMPONENT.into()),
        (COMPONENT.into(), CD_DAEMON_COMPONENT.into()),
        (PART_OF.0.into(), PART_OF.1.into()),
        (MANAGED_BY.0.into(), MANAGED_BY.1.into()),
        (COMPUTE_DOMAIN_NODE_LABEL.into(), uid.into()),
    ])
}

fn typed<T: serde::de::DeserializeOwned>(v: Value) -> Result<T> {
    serde_json::from_value(v).map_err(Error::Serialize)
}

/// An opaque config as `opaque.parameters`, through the types the compute-domain plugin decodes.
fn opaque_parameters(config: OpaqueConfig) -> Result<Value> {
    serde_json::to_value(config).map_err(Error::Serialize)
}

/// The workload template (`spec.channel.resourceClaimTemplate.name` in the domain's namespace, owned by
/// the domain): one `channel` device with the opaque `ComputeDomainChannelConfig`.
pub fn channel_template(cd: &ComputeDomain) -> Result<ResourceClaimTemplate> {
    let uid = domain_uid(cd)?;
    let owner = cd
        .controller_owner_ref(&())
        .ok_or(Error::MissingField("metadata.uid"))?;
    let mode = match cd.spec.channel.allocation_mode {
        AllocationMode::Single => "Single",
        AllocationMode::All => "All",
    };
    let parameters = opaque_parameters(OpaqueConfig::ComputeDomainChannel(
        ComputeDomainChannelConfig {
            domain_id: uid.clone(),
            allocation_mode: mode.into(),
        },
    ))?;
    let mut l = labels(&uid);
    l.insert(
        "app.kubernetes.io/name".into(),
        "compute-domain-channel".into(),
    );
    l.insert(COMPONENT.into(), "compute-domain-channel".into());
    typed(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": cd.spec.channel.resource_claim_template.name,
            "namespace": domain_namespace(cd)?,
            "labels": l,
            "ownerReferences": [owner],
        },
        "spec": { "spec": { "devices": {
            "requests": [{ "name": CHANNEL_REQUEST, "exactly": { "deviceClassName": COMPUTE_DOMAIN_CHANNEL_CLASS } }],
            "config": [{ "requests": [CHANNEL_REQUEST], "opaque": {
                "driver": COMPUTE_DOMAIN_DRIVER,
                "parameters": parameters,
            }}],
        }}},
    }))
}

fn domain_annotations(cd: &ComputeDomain) -> Result<Value> {
    Ok(json!({
        COMPUTE_DOMAIN_NAMESPACE_ANNOTATION: domain_namespace(cd)?,
        COMPUTE_DOMAIN_NAME_ANNOTATION: cd.name_any(),
    }))
}

/// The daemon template (driver namespace): one `daemon` device with `ComputeDomainDaemonConfig`.
pub fn daemon_template(cd: &ComputeDomain, driver_ns: &str) -> Result<ResourceClaimTemplate> {
    let uid = domain_uid(cd)?;
    let parameters = opaque_parameters(OpaqueConfig::ComputeDomainDaemon(
        ComputeDomainDaemonConfig {
            domain_id: uid.clone(),
        },
    ))?;
    typed(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": daemon_name(&uid),
            "namespace": driver_ns,
            "labels": labels(&uid),
            "annotations": domain_annotations(cd)?,
        },
        "spec": { "spec": { "devices": {
            "requests": [{ "name": DAEMON_REQUEST, "exactly": { "deviceClassName": COMPUTE_DOMAIN_DAEMON_CLASS } }],
            "config": [{ "requests": [DAEMON_REQUEST], "opaque": {
                "driver": COMPUTE_DOMAIN_DRIVER,
                "parameters": parameters,
            }}],
        }}},
    }))
}

/// The daemon DaemonSet (driver namespace): one pod on every node the compute-domain plugin labelled
/// `resource.nvidia.com/computeDomain=<uid>` while preparing a channel there.
pub fn daemon_daemonset(
    cd: &ComputeDomain,
    driver_ns: &str,
    daemon: &DaemonImage,
) -> Result<DaemonSet> {
    let uid = domain_uid(cd)?;
    let name = daemon_name(&uid);
    let field = |path: &str| json!({ "fieldRef": { "fieldPath": path } });
    typed(json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": name,
            "namespace": driver_ns,
            "labels": labels(&uid),
            "annotations": domain_annotations(cd)?,
        },
        "spec": {
            "selector": { "matchLabels": { COMPUTE_DOMAIN_NODE_LABEL: uid, COMPONENT: CD_DAEMON_COMPONENT } },
            "template": {
                "metadata": { "labels": labels(&uid), "annotations": domain_annotations(cd)? },
                "spec": {
                    "nodeSelector": { COMPUTE_DOMAIN_NODE_LABEL: uid },
                    "priorityClassName": "system-node-critical",
                    "resourceClaims": [{ "name": DAEMON_REQUEST, "resourceClaimTemplateName": name }],
                    "containers": [{
                        "name": "imex-daemon",
                        "image": daemon.image,
                        "command": daemon.command,
                        "env": [
                            { "name": "NODE_NAME", "valueFrom": field("spec.nodeName") },
                            { "name": "POD_IP", "valueFrom": field("status.podIP") },
                            { "name": "COMPUTE_DOMAIN_UUID", "value": uid },
                            { "name": "COMPUTE_DOMAIN_NAME", "value": cd.name_any() },
                            { "name": "COMPUTE_DOMAIN_NAMESPACE", "value": domain_namespace(cd)? },
                        ],
                        "resources": { "claims": [{ "name": DAEMON_REQUEST }] },
                        // Root, as in NVIDIA's image: the daemon writes its pod IP into the
                        // plugin's root-owned config and opens the IMEX channel devices.
                        "securityContext": { "runAsUser": 0, "runAsGroup": 0 },
                        "startupProbe": probe(&daemon.check, 1, 1200),
                        "readinessProbe": probe(&daemon.check, 10, 1),
                        "livenessProbe": probe(&daemon.check, 60, 20),
                    }],
                    // As NVIDIA's: the daemon serves workloads on GPU nodes whatever their taints.
                    "tolerations": tolerate_all(),
                },
            },
        },
    }))
}

fn tolerate_all() -> Value {
    ["NoSchedule", "NoExecute", "PreferNoSchedule"]
        .map(|effect| json!({ "operator": "Exists", "effect": effect }))
        .into()
}

/// An exec probe (10 s timeout) as NVIDIA's daemon pod has: 20 minutes to start at one try a second,
/// ready on every 10 s success, restarted after 20 minutes of failing checks.
fn probe(command: &[String], period_secs: u32, failures: u32) -> Value {
    if command.iter().all(String::is_empty) {
        return Value::Null;
    }
    json!({
        "exec": { "command": command },
        "periodSeconds": period_secs,
        "timeoutSeconds": 10,
        "failureThreshold": failures,
    })
}

/// Pure: the domain's status from its daemon pods. Nodes keep the index they had; a new node takes the
/// smallest free one. A node is `Ready` when its daemon pod is. The domain is `Ready` when `numNodes`
/// nodes are ready, or, with `numNodes: 0`, when no daemon that exists is still starting.
pub fn aggregate(
    previous: &[ComputeDomainNode],
    pods: &[Pod],
    node_cliques: &BTreeMap<String, String>,
    num_nodes: i32,
) -> ComputeDomainStatus {
    let before: BTreeMap<&str, i32> = previous
        .iter()
        .map(|n| (n.name.as_str(), n.index))
        .collect();
    // A node's clique is in its status as NVIDIA's daemon reports it: the daemon pod's label, else
    // the node's `nvidia.com/gpu.clique` (the CLIQUE_ID the plugin gives the daemon).
    let daemons = cdclique::daemons(pods, node_cliques);
    let names: Vec<&str> = daemons.iter().map(|d| d.node.as_str()).collect();
    let mut nodes: Vec<ComputeDomainNode> = daemons
        .iter()
        .zip(cdclique::stable_indices(&names, &before))
        .map(|(d, index)| ComputeDomainNode {
            name: d.node.clone(),
            ip_address: d.ip.clone(),
            clique_id: d.clique_id.clone(),
            index,
            status: cdclique::domain_status(d.ready),
        })
        .collect();
    let ready = nodes
        .iter()
        .filter(|n| n.status == DomainStatus::Ready)
        .count();
    let domain_ready = if let Ok(want) = usize::try_from(num_nodes)
        && want > 0
    {
        ready >= want
    } else {
        ready == nodes.len()
    };
    nodes.sort_by_key(|n| n.index);
    ComputeDomainStatus {
        status: cdclique::domain_status(domain_ready),
        nodes,
    }
}

#[instrument(skip(cd, ctx), fields(namespace = cd.namespace().unwrap_or_default(), name = %cd.name_any()))]
pub async fn reconcile(cd: Arc<ComputeDomain>, ctx: Arc<Ctx>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile.measure(CONTROLLER);
    let ns = domain_namespace(&cd)?;
    let api: Api<ComputeDomain> = Api::namespaced(ctx.client.clone(), &ns);
    let has_finalizer = cd
        .finalizers()
        .iter()
        .any(|f| f == COMPUTE_DOMAIN_FINALIZER);
    if cd.meta().deletion_timestamp.is_some() {
        if !has_finalizer {
            return Ok(Action::await_change());
        }
        if let Some(what) = teardown(&cd, &ctx).await? {
            info!(waiting_for = what, "teardown in progress");
            return Ok(Action::requeue(SHORT_REQUEUE));
        }
        set_finalizer(&api, cd.as_ref(), COMPUTE_DOMAIN_FINALIZER, false).await?;
        return Ok(Action::await_change());
    }
    if !has_finalizer {
        set_finalizer(&api, cd.as_ref(), COMPUTE_DOMAIN_FINALIZER, true).await?;
        return Ok(Action::await_change());
    }

    let client = &ctx.client;
    let driver_ns = ctx.namespace.as_str();
    let uid = domain_uid(&cd)?;
    apply(
        &Api::<ResourceClaimTemplate>::namespaced(client.clone(), &ns),
        &channel_template(&cd)?,
    )
    .await?;
    apply(
        &Api::<ResourceClaimTemplate>::namespaced(client.clone(), driver_ns),
        &daemon_template(&cd, driver_ns)?,
    )
    .await?;
    apply(
        &Api::<DaemonSet>::namespaced(client.clone(), driver_ns),
        &daemon_daemonset(&cd, driver_ns, &ctx.daemon)?,
    )
    .await?;

    let pods = Api::<Pod>::namespaced(client.clone(), driver_ns)
        .list(&ListParams::default().labels(&format!("{COMPUTE_DOMAIN_NODE_LABEL}={uid}")))
        .await?;
    let status = if ctx.cliques {
        cdclique::sync(client, driver_ns, &uid, &pods.items, cd.spec.num_nodes).await?
    } else {
        let previous = cd.status.as_ref().map_or(&[][..], |s| s.nodes.as_slice());
        let node_cliques = cdclique::node_cliques(client, &uid).await?;
        aggregate(previous, &pods.items, &node_cliques, cd.spec.num_nodes)
    };
    // An unchanged status is not written again: each write would wake every watcher of the object.
    if cd.status.as_ref() != Some(&status) {
        let body = json!({
            "apiVersion": ComputeDomain::api_version(&()),
            "kind": ComputeDomain::kind(&()),
            "status": status,
        });
        api.patch_status(&cd.name_any(), &params(), &Patch::Apply(body))
            .await?;
    }
    Ok(Action::requeue(RESYNC))
}

/// Pure: how long to wait after a failure. Objects that cannot be built wait longer than API trouble.
pub fn error_policy(_cd: Arc<ComputeDomain>, err: &Error, ctx: Arc<Ctx>) -> Action {
    ctx.metrics.reconcile.failure(CONTROLLER, err);
    match err {
        Error::MissingField(_) | Error::Serialize(_) => Action::requeue(INVALID_RETRY),
        _ => Action::requeue(Duration::from_secs(15)),
    }
}

/// Workload template first (no new channel claims), then the daemons (foreground, so their claims are
/// unprepared while the plugin still runs), their template, and the node labels. `Some(what)` while a
/// step is still in progress.
async fn teardown(cd: &ComputeDomain, ctx: &Ctx) -> Result<Option<&'static str>> {
    let client = &ctx.client;
    let driver_ns = ctx.namespace.as_str();
    let uid = domain_uid(cd)?;
    let name = daemon_name(&uid);
    let workload: Api<ResourceClaimTemplate> =
        Api::namespaced(client.clone(), &domain_namespace(cd)?);
    if delete_background(&workload, &cd.spec.channel.resource_claim_template.name).await? {
        return Ok(Some("workload ResourceClaimTemplate"));
    }
    if delete(
        &Api::<DaemonSet>::namespaced(client.clone(), driver_ns),
        &name,
    )
    .await?
    {
        return Ok(Some("daemon DaemonSet"));
    }
    if delete_background(
        &Api::<ResourceClaimTemplate>::namespaced(client.clone(), driver_ns),
        &name,
    )
    .await?
    {
        return Ok(Some("daemon ResourceClaimTemplate"));
    }
    // Cliques are deleted whatever the gate says now: it may have been on when they were written.
    if cdclique::delete_all(client, driver_ns, &uid).await? {
        return Ok(Some("ComputeDomainCliques"));
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let labelled = nodes
        .list(&ListParams::default().labels(&format!("{COMPUTE_DOMAIN_NODE_LABEL}={uid}")))
        .await?;
    for node in labelled.items {
        let patch = json!({ "metadata": { "labels": { COMPUTE_DOMAIN_NODE_LABEL: null } } });
        nodes
            .patch(
                &node.name_any(),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await?;
    }
    Ok(None)
}

/// Watch mapper: the domain a daemon DaemonSet or pod belongs to, from its annotations.
pub fn domain_of<K: Resource>(obj: &K) -> Option<ObjectRef<ComputeDomain>> {
    let a = obj.meta().annotations.as_ref()?;
    let ns = a.get(COMPUTE_DOMAIN_NAMESPACE_ANNOTATION)?;
    let name = a.get(COMPUTE_DOMAIN_NAME_ANNOTATION)?;
    Some(ObjectRef::new(name).within(ns))
}
