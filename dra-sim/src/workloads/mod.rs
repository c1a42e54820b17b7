//! Workloads as the scheduler sees them: the pods each workload makes (`replicas` counted), the
//! claims each pod gets (`spec.resourceClaims` naming a ResourceClaim or a ResourceClaimTemplate,
//! and the extended-resource claim of KEP-5004), and the pods scheduled one after another over the
//! simulated nodes, each seeing what the ones before it were given.
mod claims;
mod extended;
mod render;
mod schedule;

pub use claims::{ClaimSource, PodClaim, pod_claims};
pub use extended::extended_resource_claim;
pub use render::render_pods_table;
pub use schedule::{PodClaimOutcome, PodOutcome, schedule_pods};

use crate::alloc::{SimNode, node_matches};
use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};

/// A workload object from the input and its pod template.
#[derive(Clone, Debug)]
pub struct Workload {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// Where it is in the input ("file: document N (Kind name)").
    pub origin: String,
    pub template: PodTemplateSpec,
    pub replicas: Replicas,
    /// The object as read (JSON), for tools that write it back changed (`plan`).
    pub source: serde_json::Value,
}

/// How many pods a workload makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replicas {
    Count(usize),
    /// A DaemonSet: one on each node its pods may run on.
    PerNode,
}

/// One pod of a workload.
#[derive(Clone, Debug)]
pub struct SimPod {
    pub namespace: String,
    pub name: String,
    /// "Kind/name" of the workload that makes it.
    pub owner: String,
    pub spec: PodSpec,
}

impl SimPod {
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The pods `w` makes on `nodes`: a Pod is itself; replicas are named `<name>-<i>` (as a
/// StatefulSet names them; the others' real names carry random suffixes); a DaemonSet's pods are
/// `<name>-<node>`.
pub fn pods_of(w: &Workload, nodes: &[SimNode]) -> Vec<SimPod> {
    let spec = w.template.spec.clone().unwrap_or_default();
    let pod = |name: String| SimPod {
        namespace: w.namespace.clone(),
        name,
        owner: format!("{}/{}", w.kind, w.name),
        spec: spec.clone(),
    };
    match w.replicas {
        Replicas::Count(1) if matches!(w.kind.as_str(), "Pod" | "PodTemplate") => {
            vec![pod(w.name.clone())]
        }
        Replicas::Count(n) => (0..n).map(|i| pod(format!("{}-{i}", w.name))).collect(),
        Replicas::PerNode => nodes
            .iter()
            .filter(|n| pod_may_run_on(&spec, n))
            .map(|n| pod(format!("{}-{}", w.name, n.name)))
            .collect(),
    }
}

/// `spec.nodeName`, `spec.nodeSelector` and required node affinity against the node's labels.
pub fn pod_may_run_on(spec: &PodSpec, node: &SimNode) -> bool {
    if let Some(name) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        return name == node.name;
    }
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| node.labels.get(k) == Some(v));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    selector_ok
        && required.is_none_or(|sel| node_matches(node, "", false, Some(sel)).unwrap_or(false))
}
