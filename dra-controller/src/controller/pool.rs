//! The migration pool as a pure function: what each node's labels should be, and who is in conflict.
//!
//! Safety rule: a node has one allocator, never two. Pool nodes get the device plugin switched off
//! (`nvidia.com/gpu.deploy.device-plugin=false`); the DRA plugin label follows only once the node no
//! longer advertises `nvidia.com/gpu`. A node leaving the pool keeps the DRA plugin while it still has
//! prepared claims, then loses the plugin, and gets the device plugin back only after the plugin pod is gone.
use std::collections::{BTreeMap, BTreeSet};

use gpu_dra_api::names::{DEVICE_PLUGIN_LABEL, DRA_DRIVER_LABEL, GPU_PRESENT_LABEL};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};

use super::error::{Error, Result};

/// What the planner needs to know about one node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFacts {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// `nvidia.com/gpu` is in allocatable with a non-zero quantity (a device plugin serves it).
    pub advertises_gpu: bool,
    /// Claims of our drivers allocated on this node.
    pub prepared_claims: usize,
    /// A kubelet-plugin pod of ours exists on this node.
    pub plugin_pod: bool,
    /// Managed label keys this controller's field manager owns on the node now.
    pub owned_labels: BTreeSet<String>,
}

/// Where a node stands in the migration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// In the pool and served by the DRA plugin.
    Ready,
    /// In the pool, but a device plugin still advertises `nvidia.com/gpu`: no DRA plugin is placed.
    Conflicting,
    /// In the pool, still advertising, but claims are prepared, so the plugin must stay to unprepare them.
    ConflictingWithClaims,
    /// Left the pool; the plugin stays until its prepared claims are gone.
    Draining,
    /// Left the pool; the plugin is being removed, the device plugin stays off until it is gone.
    Leaving,
    /// Not in the pool and nothing of ours on it.
    Outside,
}

/// The labels this controller should own on one node. An empty map releases them all.
#[derive(Clone, Debug, PartialEq)]
pub struct NodePlan {
    pub name: String,
    pub role: Role,
    pub labels: BTreeMap<String, String>,
    /// The node's current labels differ from `labels` for keys we manage.
    pub needs_update: bool,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolPlan {
    pub nodes: Vec<NodePlan>,
}

impl PoolPlan {
    fn names(&self, pred: impl Fn(Role) -> bool) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| pred(n.role))
            .map(|n| n.name.clone())
            .collect()
    }

    pub fn pool_nodes(&self) -> usize {
        self.nodes.iter().filter(|n| n.role.in_pool()).count()
    }

    pub fn ready_nodes(&self) -> usize {
        self.nodes.iter().filter(|n| n.role == Role::Ready).count()
    }

    pub fn conflicting(&self) -> Vec<String> {
        self.names(|r| matches!(r, Role::Conflicting | Role::ConflictingWithClaims))
    }

    pub fn draining(&self) -> Vec<String> {
        self.names(|r| matches!(r, Role::Draining | Role::Leaving))
    }

    /// Nodes whose labels must be written.
    pub fn updates(&self) -> impl Iterator<Item = &NodePlan> {
        self.nodes.iter().filter(|n| n.needs_update)
    }

    /// Some node is mid-way through a transition that no watched object may announce.
    pub fn in_transition(&self) -> bool {
        self.nodes
            .iter()
            .any(|n| matches!(n.role, Role::Draining | Role::Leaving | Role::Conflicting))
    }
}

impl Role {
    pub fn in_pool(self) -> bool {
        matches!(
            self,
            Role::Ready | Role::Conflicting | Role::ConflictingWithClaims
        )
    }
}

/// The pool's selector: the configured one, or every GPU node.
pub fn pool_selector(configured: Option<&LabelSelector>) -> Result<Selector> {
    match configured {
        Some(sel) => Selector::try_from(sel.clone()).map_err(|e| Error::Selector(e.to_string())),
        None => Ok(Selector::from_iter([(GPU_PRESENT_LABEL, "true")])),
    }
}

/// Decide every node's managed labels. Nodes are returned in name order.
pub fn plan(selector: &Selector, nodes: &[NodeFacts]) -> PoolPlan {
    let mut out: Vec<NodePlan> = nodes.iter().map(|n| plan_node(selector, n)).collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    PoolPlan { nodes: out }
}

fn plan_node(selector: &Selector, node: &NodeFacts) -> NodePlan {
    let in_pool = selector.matches(&node.labels);
    let has_plugin_label = node
        .labels
        .get(DRA_DRIVER_LABEL)
        .is_some_and(|v| v == "true");
    let claims = node.prepared_claims > 0;

    let role = match (in_pool, node.advertises_gpu) {
        (true, false) => Role::Ready,
        (true, true) if claims && (has_plugin_label || node.plugin_pod) => {
            Role::ConflictingWithClaims
        }
        (true, true) => Role::Conflicting,
        (false, _) if claims && (has_plugin_label || node.plugin_pod) => Role::Draining,
        (false, _) if has_plugin_label || node.plugin_pod => Role::Leaving,
        (false, _) => Role::Outside,
    };
    let (plugin, dp_off) = match role {
        Role::Ready | Role::ConflictingWithClaims | Role::Draining => (true, true),
        Role::Conflicting | Role::Leaving => (false, true),
        Role::Outside => (false, false),
    };
    let mut labels = BTreeMap::new();
    if dp_off {
        labels.insert(DEVICE_PLUGIN_LABEL.to_owned(), "false".to_owned());
    }
    if plugin {
        labels.insert(DRA_DRIVER_LABEL.to_owned(), "true".to_owned());
    }
    // Compare with what we own, not with what is there: a user's own `device-plugin=false` on a node
    // we never managed is neither ours to remove nor a reason to write.
    let owned: BTreeMap<String, String> = node
        .labels
        .iter()
        .filter(|(k, _)| node.owned_labels.contains(*k))
        .filter(|(k, _)| *k == DEVICE_PLUGIN_LABEL || *k == DRA_DRIVER_LABEL)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let needs_update = owned != labels;
    NodePlan {
        name: node.name.clone(),
        role,
        labels,
        needs_update,
    }
}

/// Label keys under `metadata.labels` that `manager` owns through server-side apply.
pub fn owned_label_keys(
    managed: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry],
    manager: &str,
) -> BTreeSet<String> {
    managed
        .iter()
        .filter(|e| {
            e.manager.as_deref() == Some(manager) && e.operation.as_deref() == Some("Apply")
        })
        .filter_map(|e| e.fields_v1.as_ref())
        .filter_map(|f| f.0.get("f:metadata")?.get("f:labels")?.as_object().cloned())
        .flat_map(|labels| {
            labels
                .into_iter()
                .filter_map(|(k, _)| k.strip_prefix("f:").map(str::to_owned))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        FieldsV1, LabelSelectorRequirement, ManagedFieldsEntry,
    };

    fn node(name: &str, labels: &[(&str, &str)]) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn gpu(name: &str) -> NodeFacts {
        node(name, &[(GPU_PRESENT_LABEL, "true")])
    }

    /// A node carrying both our labels, owned by us, as after a previous reconcile.
    fn managed(mut n: NodeFacts, plugin: bool) -> NodeFacts {
        n.labels.insert(DEVICE_PLUGIN_LABEL.into(), "false".into());
        n.owned_labels.insert(DEVICE_PLUGIN_LABEL.into());
        if plugin {
            n.labels.insert(DRA_DRIVER_LABEL.into(), "true".into());
            n.owned_labels.insert(DRA_DRIVER_LABEL.into());
        }
        n
    }

    fn default_plan(nodes: &[NodeFacts]) -> PoolPlan {
        plan(&pool_selector(None).unwrap(), nodes)
    }

    fn labels(p: &NodePlan) -> Vec<(&str, &str)> {
        p.labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    const BOTH: [(&str, &str); 2] = [(DEVICE_PLUGIN_LABEL, "false"), (DRA_DRIVER_LABEL, "true")];

    #[test]
    fn default_pool_is_every_gpu_node() {
        let p = default_plan(&[gpu("g1"), node("cpu", &[]), gpu("g2")]);
        assert_eq!(p.pool_nodes(), 2);
        assert_eq!(p.ready_nodes(), 2);
        let by_name: Vec<_> = p.nodes.iter().map(|n| (n.name.as_str(), n.role)).collect();
        assert_eq!(
            by_name,
            [
                ("cpu", Role::Outside),
                ("g1", Role::Ready),
                ("g2", Role::Ready)
            ]
        );
        assert_eq!(labels(&p.nodes[1]), BOTH);
        assert!(p.nodes[1].needs_update);
        assert!(p.nodes[0].labels.is_empty());
        assert!(!p.nodes[0].needs_update);
    }

    #[test]
    fn custom_selector_limits_the_pool() {
        let sel = LabelSelector {
            match_labels: Some([("pool".to_string(), "dra".to_string())].into()),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: GPU_PRESENT_LABEL.into(),
                operator: "Exists".into(),
                values: None,
            }]),
        };
        let sel = pool_selector(Some(&sel)).unwrap();
        let mut both = gpu("a");
        both.labels.insert("pool".into(), "dra".into());
        let only_pool = node("b", &[("pool", "dra")]);
        let p = plan(&sel, &[both, only_pool, gpu("c")]);
        assert_eq!(
            p.nodes.iter().map(|n| n.role).collect::<Vec<_>>(),
            [Role::Ready, Role::Outside, Role::Outside]
        );
    }

    #[test]
    fn invalid_selector_is_an_error() {
        let sel = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "k".into(),
                operator: "Near".into(),
                values: None,
            }]),
        };
        assert!(matches!(pool_selector(Some(&sel)), Err(Error::Selector(_))));
    }

    #[test]
    fn node_advertising_gpu_gets_device_plugin_off_but_no_dra_plugin() {
        let mut n = gpu("g1");
        n.advertises_gpu = true;
        let p = default_plan(&[n]);
        let plan = &p.nodes[0];
        assert_eq!(plan.role, Role::Conflicting);
        assert_eq!(labels(plan), [(DEVICE_PLUGIN_LABEL, "false")]);
        assert!(plan.needs_update);
        assert_eq!(p.conflicting(), ["g1"]);
        assert_eq!(p.ready_nodes(), 0);
        assert_eq!(p.pool_nodes(), 1);
        assert!(p.in_transition());
    }

    #[test]
    fn conflict_clears_once_the_node_stops_advertising() {
        let mut n = managed(gpu("g1"), false);
        n.advertises_gpu = true;
        let before = default_plan(std::slice::from_ref(&n));
        assert!(!before.nodes[0].needs_update, "already labelled as desired");
        n.advertises_gpu = false;
        let after = default_plan(&[n]);
        assert_eq!(after.nodes[0].role, Role::Ready);
        assert_eq!(labels(&after.nodes[0]), BOTH);
        assert!(after.nodes[0].needs_update);
        assert!(after.conflicting().is_empty());
    }

    #[test]
    fn conflict_on_a_node_with_prepared_claims_keeps_the_plugin_until_they_are_gone() {
        let mut n = managed(gpu("g1"), true);
        n.advertises_gpu = true;
        n.prepared_claims = 2;
        let p = default_plan(std::slice::from_ref(&n));
        assert_eq!(p.nodes[0].role, Role::ConflictingWithClaims);
        assert_eq!(labels(&p.nodes[0]), BOTH);
        assert!(!p.nodes[0].needs_update);
        assert_eq!(p.conflicting(), ["g1"]);
        n.prepared_claims = 0;
        let p = default_plan(&[n]);
        assert_eq!(p.nodes[0].role, Role::Conflicting);
        assert_eq!(labels(&p.nodes[0]), [(DEVICE_PLUGIN_LABEL, "false")]);
        assert!(p.nodes[0].needs_update);
    }

    #[test]
    fn ready_node_already_labelled_needs_no_write() {
        let p = default_plan(&[managed(gpu("g1"), true)]);
        assert_eq!(p.nodes[0].role, Role::Ready);
        assert_eq!(p.updates().count(), 0);
        assert!(!p.in_transition());
    }

    #[test]
    fn node_leaving_with_claims_keeps_both_labels() {
        let mut n = managed(node("g1", &[]), true);
        n.plugin_pod = true;
        n.prepared_claims = 1;
        let p = default_plan(&[n]);
        assert_eq!(p.nodes[0].role, Role::Draining);
        assert_eq!(labels(&p.nodes[0]), BOTH);
        assert!(!p.nodes[0].needs_update);
        assert_eq!(p.draining(), ["g1"]);
        assert_eq!(p.pool_nodes(), 0);
    }

    #[test]
    fn node_leaving_without_claims_loses_the_plugin_first_then_the_device_plugin_label() {
        // Step 1: claims gone, plugin label still there -> drop the plugin label only.
        let mut n = managed(node("g1", &[]), true);
        n.plugin_pod = true;
        let p = default_plan(std::slice::from_ref(&n));
        assert_eq!(p.nodes[0].role, Role::Leaving);
        assert_eq!(labels(&p.nodes[0]), [(DEVICE_PLUGIN_LABEL, "false")]);
        assert!(p.nodes[0].needs_update);
        // Step 2: label gone, pod still terminating -> the device plugin must stay off.
        n.labels.remove(DRA_DRIVER_LABEL);
        n.owned_labels.remove(DRA_DRIVER_LABEL);
        let p = default_plan(std::slice::from_ref(&n));
        assert_eq!(p.nodes[0].role, Role::Leaving);
        assert!(!p.nodes[0].needs_update);
        // Step 3: pod gone -> release everything.
        n.plugin_pod = false;
        let p = default_plan(&[n]);
        assert_eq!(p.nodes[0].role, Role::Outside);
        assert!(p.nodes[0].labels.is_empty());
        assert!(p.nodes[0].needs_update);
        assert!(p.draining().is_empty());
    }

    #[test]
    fn user_owned_device_plugin_label_outside_the_pool_is_left_alone() {
        let n = node("cpu", &[(DEVICE_PLUGIN_LABEL, "false")]);
        let p = default_plan(&[n]);
        assert_eq!(p.nodes[0].role, Role::Outside);
        assert!(!p.nodes[0].needs_update);
    }

    #[test]
    fn user_label_on_a_pool_node_is_still_claimed() {
        let mut n = gpu("g1");
        n.labels.insert(DEVICE_PLUGIN_LABEL.into(), "false".into());
        let p = default_plan(&[n]);
        assert_eq!(labels(&p.nodes[0]), BOTH);
        assert!(p.nodes[0].needs_update);
    }

    #[test]
    fn owned_label_keys_reads_only_our_apply_entries() {
        let entry = |manager: &str, op: &str, fields: serde_json::Value| ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(op.into()),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        };
        let ours = serde_json::json!({"f:metadata": {"f:labels": {
            "f:nvidia.com/gpu.deploy.device-plugin": {}, "f:nvidia.com/gpu.deploy.dra-driver": {}}}});
        let theirs = serde_json::json!({"f:metadata": {"f:labels": {"f:other": {}}}});
        let managed = [
            entry("gpu-dra-controller", "Apply", ours.clone()),
            entry("kubectl", "Apply", theirs.clone()),
            entry("gpu-dra-controller", "Update", theirs),
            entry(
                "gpu-dra-controller",
                "Apply",
                serde_json::json!({"f:spec": {}}),
            ),
        ];
        let keys = owned_label_keys(&managed, "gpu-dra-controller");
        assert_eq!(
            keys.into_iter().collect::<Vec<_>>(),
            [DEVICE_PLUGIN_LABEL, DRA_DRIVER_LABEL]
        );
    }
}
