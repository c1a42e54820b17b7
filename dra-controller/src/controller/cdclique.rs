//! ComputeDomainClique objects under NVIDIA's `ComputeDomainCliques` gate, kept from the domain's
//! daemon pods (which this controller already watches), plus the ComputeDomain status NVIDIA
//! reports in that mode: one `status.nodes[]` entry per clique daemon, and one with `index: -1`
//! per daemon on a node without NVLink fabric.
//!
//! A daemon's clique is its pod's `resource.nvidia.com/computeDomain.cliqueID` label, else its
//! node's `nvidia.com/gpu.clique` label; with neither it is not fabric-attached and has no clique.
use std::collections::{BTreeMap, BTreeSet};

use gpu_dra_api::cdclique::{self, ComputeDomainClique, DaemonInfo};
use gpu_dra_api::names::{
    COMPUTE_DOMAIN_CLIQUE_LABEL, COMPUTE_DOMAIN_NODE_LABEL, GPU_CLIQUE_NODE_LABEL,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::apply::{delete_background, params};
use super::crd::{ComputeDomainNode, ComputeDomainStatus, DomainStatus};
use super::error::Result;

/// A running daemon, as the pods show it.
#[derive(Clone, Debug, PartialEq)]
pub struct Daemon {
    pub node: String,
    pub ip: String,
    pub clique_id: String,
    pub ready: bool,
    pub pod_name: String,
    pub pod_uid: String,
}

/// Pure: the domain's daemons from its pods (terminating and unscheduled pods left out); the clique
/// comes from the pod label, else from `node_cliques` (node name → `nvidia.com/gpu.clique`).
pub fn daemons(pods: &[Pod], node_cliques: &BTreeMap<String, String>) -> Vec<Daemon> {
    let mut out: BTreeMap<String, Daemon> = BTreeMap::new();
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        let status = pod.status.as_ref();
        let ready = status
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let clique_id = pod
            .labels()
            .get(COMPUTE_DOMAIN_CLIQUE_LABEL)
            .or_else(|| node_cliques.get(&node))
            .cloned()
            .unwrap_or_default();
        out.insert(
            node.clone(),
            Daemon {
                node,
                ip: status.and_then(|s| s.pod_ip.clone()).unwrap_or_default(),
                clique_id,
                ready,
                pod_name: pod.name_any(),
                pod_uid: pod.uid().unwrap_or_default(),
            },
        );
    }
    out.into_values().collect()
}

fn status_word(ready: bool) -> &'static str {
    if ready { "Ready" } else { "NotReady" }
}

pub fn domain_status(ready: bool) -> DomainStatus {
    if ready {
        DomainStatus::Ready
    } else {
        DomainStatus::NotReady
    }
}

/// Pure: each node's index, in the order given: the one it had in `before`, else the smallest
/// index no node holds (NVIDIA's gap filling, so a running daemon's DNS name stays put).
pub fn stable_indices(nodes: &[&str], before: &BTreeMap<&str, i32>) -> Vec<i32> {
    let mut used: BTreeSet<i32> = nodes
        .iter()
        .filter_map(|n| before.get(n).copied())
        .collect();
    nodes
        .iter()
        .map(|n| {
            before.get(n).copied().unwrap_or_else(|| {
                let free = (0..).find(|i| !used.contains(i)).unwrap_or_default();
                used.insert(free);
                free
            })
        })
        .collect()
}

/// Pure: each clique's object as it should be. A node keeps the index its clique gave it; a new
/// node takes the smallest free one (NVIDIA's gap filling, so names stay stable). Nodes without a
/// daemon pod drop out. Owners are the clique's daemon pods, as NVIDIA's daemons set them.
pub fn plan(
    uid: &str,
    namespace: &str,
    existing: &[ComputeDomainClique],
    daemons: &[Daemon],
) -> Vec<ComputeDomainClique> {
    let mut by_clique: BTreeMap<&str, Vec<&Daemon>> = BTreeMap::new();
    for d in daemons.iter().filter(|d| !d.clique_id.is_empty()) {
        by_clique.entry(&d.clique_id).or_default().push(d);
    }
    by_clique
        .into_iter()
        .map(|(clique_id, members)| {
            let name = cdclique::clique_name(uid, clique_id);
            let before: BTreeMap<&str, i32> = existing
                .iter()
                .filter(|c| c.metadata.name.as_deref() == Some(name.as_str()))
                .flat_map(|c| &c.daemons)
                .map(|d| (d.node_name.as_str(), d.index))
                .collect();
            let nodes: Vec<&str> = members.iter().map(|d| d.node.as_str()).collect();
            let mut entries: Vec<DaemonInfo> = members
                .iter()
                .zip(stable_indices(&nodes, &before))
                .map(|(d, index)| DaemonInfo {
                    node_name: d.node.clone(),
                    ip_address: d.ip.clone(),
                    clique_id: clique_id.to_string(),
                    index,
                    status: status_word(d.ready).into(),
                })
                .collect();
            entries.sort_by_key(|e| e.index);
            let owners = members
                .iter()
                .map(|d| json!({ "apiVersion": "v1", "kind": "Pod", "name": d.pod_name, "uid": d.pod_uid }))
                .collect::<Vec<_>>();
            let mut c: ComputeDomainClique = serde_json::from_value(json!({
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": { COMPUTE_DOMAIN_NODE_LABEL: uid, COMPUTE_DOMAIN_CLIQUE_LABEL: clique_id },
                    "ownerReferences": owners,
                },
            }))
            .expect("a clique's metadata is well-formed");
            c.daemons = entries;
            c
        })
        .collect()
}

/// Pure: the ComputeDomain status NVIDIA writes with cliques on: the clique daemons, then every
/// daemon without a clique (`cliqueID: ""`, `index: -1`). `Ready` when there are at least `numNodes`
/// nodes and none is `NotReady`.
pub fn status(
    cliques: &[ComputeDomainClique],
    daemons: &[Daemon],
    num_nodes: i32,
) -> ComputeDomainStatus {
    let mut nodes: Vec<ComputeDomainNode> = cliques
        .iter()
        .flat_map(|c| &c.daemons)
        .map(|d| ComputeDomainNode {
            name: d.node_name.clone(),
            ip_address: d.ip_address.clone(),
            clique_id: d.clique_id.clone(),
            index: d.index,
            status: domain_status(d.status == "Ready"),
        })
        .collect();
    nodes.extend(
        daemons
            .iter()
            .filter(|d| d.clique_id.is_empty() && !d.ip.is_empty())
            .map(|d| ComputeDomainNode {
                name: d.node.clone(),
                ip_address: d.ip.clone(),
                clique_id: String::new(),
                index: -1,
                status: domain_status(d.ready),
            }),
    );
    let enough = nodes.len() >= usize::try_from(num_nodes).unwrap_or(0);
    let ready = enough && nodes.iter().all(|n| n.status == DomainStatus::Ready);
    ComputeDomainStatus {
        status: domain_status(ready),
        nodes,
    }
}

fn selector(uid: &str) -> ListParams {
    ListParams::default().labels(&format!("{COMPUTE_DOMAIN_NODE_LABEL}={uid}"))
}

/// The NVLink clique (`nvidia.com/gpu.clique`) of each node of domain `uid`, by node name. The
/// plugin labels exactly the domain's nodes, so this list stays as small as the domain.
pub async fn node_cliques(client: &Client, uid: &str) -> Result<BTreeMap<String, String>> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&selector(uid))
        .await?;
    Ok(nodes
        .items
        .iter()
        .filter_map(|n| Some((n.name_any(), n.labels().get(GPU_CLIQUE_NODE_LABEL)?.clone())))
        .collect())
}

/// Brings the domain's cliques in line with its daemon pods and returns the status to report.
pub async fn sync(
    client: &Client,
    namespace: &str,
    uid: &str,
    pods: &[Pod],
    num_nodes: i32,
) -> Result<ComputeDomainStatus> {
    let node_cliques = node_cliques(client, uid).await?;
    let daemons = daemons(pods, &node_cliques);
    let api: Api<ComputeDomainClique> = Api::namespaced(client.clone(), namespace);
    let existing = api.list(&selector(uid)).await?.items;
    let wanted = plan(uid, namespace, &existing, &daemons);
    for c in &wanted {
        let current = existing.iter().find(|e| e.metadata.name == c.metadata.name);
        // Unchanged cliques are not written: each write wakes every daemon-side watcher.
        if current.is_some_and(|e| {
            e.daemons == c.daemons && e.metadata.owner_references == c.metadata.owner_references
        }) {
            continue;
        }
        let mut body = serde_json::to_value(c).map_err(super::error::Error::Serialize)?;
        body["apiVersion"] = json!(format!("{}/{}", cdclique::GROUP, cdclique::VERSION));
        body["kind"] = json!(cdclique::KIND);
        // Applied in full: an absent `daemons` clears the entries this manager wrote before.
        body["daemons"] = json!(c.daemons);
        api.patch(&c.name_any(), &params(), &Patch::Apply(body))
            .await?;
    }
    for gone in existing
        .iter()
        .filter(|e| !wanted.iter().any(|w| w.metadata.name == e.metadata.name))
    {
        delete_background(&api, &gone.name_any()).await?;
    }
    Ok(status(&wanted, &daemons, num_nodes))
}

/// Deletes every clique of the domain (its daemon pods are gone by then). `true` while one remains.
pub async fn delete_all(client: &Client, namespace: &str, uid: &str) -> Result<bool> {
    let api: Api<ComputeDomainClique> = Api::namespaced(client.clone(), namespace);
    let list = match api.list(&selector(uid)).await {
        Ok(l) => l,
        // Without the CRD (installed before cliques existed) there is nothing to delete.
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    let mut left = false;
    for c in list.items {
        left |= delete_background(&api, &c.name_any()).await?;
    }
    Ok(left)
}
