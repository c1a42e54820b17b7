//! The migration planner (`dra-controller plan`): from a cluster's state as the device plugin
//! stack left it (Nodes with GPU feature discovery labels, workloads asking for `nvidia.com/gpu`
//! and `nvidia.com/mig-<profile>`), the ResourceClaimTemplates and changed workloads that ask
//! the same of this driver, and where the scheduler would place them on a pool of nodes running
//! our kubelet plugin. The written YAML is read back through the simulator's own loader and the
//! placements are those of that YAML, so what is printed is what `simulate` would say of it.
mod claims;
mod nodes;
mod render;
mod requests;
mod rewrite;
mod usage;

pub use claims::mig_selector;
pub use nodes::{Mig, PoolNode, Sharing, model_of};
pub use render::render_report;
pub use usage::{Free, GpuUse};

use crate::cli::EMBEDDED_CLASSES;
use crate::input::{self, Objects};
use crate::workloads::{self, PodOutcome, Workload};
use crate::{Error, Result};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Which nodes form the pool.
#[derive(Debug, Clone)]
pub enum PoolSelection {
    /// `--pool-selector key=value[,key=value]`: every pair must match.
    Selector(Vec<(String, String)>),
    /// `--pool-nodes a,b`.
    Nodes(Vec<String>),
}

impl PoolSelection {
    /// Parses `key=value[,key=value]`.
    pub fn selector(s: &str) -> Result<Self> {
        let mut pairs = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| {
                Error::invalid(format!(
                    "--pool-selector: {part:?} is not key=value (e.g. nvidia.com/gpu.present=true)"
                ))
            })?;
            pairs.push((k.trim().to_string(), v.trim().to_string()));
        }
        if pairs.is_empty() {
            return Err(Error::invalid("--pool-selector: no key=value given"));
        }
        Ok(PoolSelection::Selector(pairs))
    }

    pub fn nodes(s: &str) -> Result<Self> {
        let names: Vec<String> = s
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect();
        if names.is_empty() {
            return Err(Error::invalid("--pool-nodes: no node name given"));
        }
        Ok(PoolSelection::Nodes(names))
    }

    /// The input's Nodes in the pool, by name; an error when a named node is missing or the
    /// selector matches none.
    fn pick<'a>(&self, nodes: &'a [Node]) -> Result<Vec<&'a Node>> {
        let name = |n: &Node| n.metadata.name.clone().unwrap_or_default();
        let all: Vec<String> = nodes.iter().map(name).collect();
        let picked: Vec<&Node> = match self {
            PoolSelection::Nodes(names) => {
                if let Some(missing) = names.iter().find(|n| !all.contains(n)) {
                    return Err(Error::invalid(format!(
                        "--pool-nodes: node {missing} is not in the input (its Nodes: {})",
                        list_or_none(&all)
                    )));
                }
                nodes.iter().filter(|n| names.contains(&name(n))).collect()
            }
            PoolSelection::Selector(pairs) => nodes
                .iter()
                .filter(|n| {
                    let labels = n.metadata.labels.as_ref();
                    pairs
                        .iter()
                        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
                })
                .collect(),
        };
        if picked.is_empty() {
            return Err(Error::invalid(format!(
                "the pool selects none of the input's Nodes ({})",
                list_or_none(&all)
            )));
        }
        let mut picked = picked;
        picked.sort_by_key(|n| name(n));
        Ok(picked)
    }
}

fn list_or_none(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// One planned workload.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadPlan {
    /// `Deployment default/web`.
    pub workload: String,
    pub origin: String,
    /// `web: nvidia.com/gpu: 1`.
    pub asks: Vec<String>,
    /// `ResourceClaimTemplate default/web-gpu`.
    pub claim: String,
    pub requests: Vec<String>,
    pub file: String,
    pub pods: usize,
    pub placed: usize,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// A file of manifests to apply.
#[derive(Debug, Clone)]
pub struct PlannedFile {
    pub name: String,
    pub text: String,
}

/// The whole plan.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub nodes: Vec<PoolNode>,
    /// Per pool node, the kubelet plugin settings the plan assumes.
    pub settings: BTreeMap<String, String>,
    pub workloads: Vec<WorkloadPlan>,
    pub pods: Vec<PodOutcome>,
    pub gpus: Vec<GpuUse>,
    pub free: Free,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    #[serde(skip)]
    pub files: Vec<PlannedFile>,
    /// The pool's slices as our plugin would publish them.
    #[serde(skip)]
    pub slices: Vec<ResourceSlice>,
    /// The pool's Node objects as read.
    #[serde(skip)]
    pub node_objects: Vec<Node>,
}

impl Plan {
    pub fn unplaced(&self) -> usize {
        self.pods.iter().filter(|p| p.node.is_none()).count()
    }
}

/// Plans the input's GPU workloads onto the pool.
pub fn make_plan(objs: &Objects, pool: &PoolSelection) -> Result<Plan> {
    let picked = pool.pick(&objs.nodes)?;
    let nodes = picked
        .iter()
        .map(|n| PoolNode::from_node(n))
        .collect::<Result<Vec<_>>>()?;
    let mut slices = Vec::new();
    for n in &nodes {
        slices.extend(n.slices()?);
    }
    let mut plan = Plan {
        settings: nodes
            .iter()
            .filter(|n| n.gpus > 0)
            .map(|n| (n.name.clone(), n.plugin_settings()))
            .collect(),
        nodes,
        workloads: vec![],
        pods: vec![],
        gpus: vec![],
        free: Free::default(),
        notes: vec![],
        files: vec![],
        slices,
        node_objects: picked.into_iter().cloned().collect(),
    };
    plan_workloads(objs, &mut plan)?;
    simulate(&mut plan)?;
    Ok(plan)
}

/// Designs each GPU workload's claim and writes its file.
fn plan_workloads(objs: &Objects, plan: &mut Plan) -> Result<()> {
    let mut taken = BTreeSet::new();
    let mut unknown = Vec::new();
    for w in &objs.workloads {
        if let Some(why) = skip_reason(w, objs) {
            plan.notes.push(why);
            continue;
        }
        let asks = requests::asks_of(w, &mut unknown)?;
        if asks.is_empty() {
            continue;
        }
        let mut notes = Vec::new();
        let design = claims::design(w, &asks, &plan.nodes, &mut taken, &mut notes);
        let object = rewrite::rewrite(w, &asks, &design, &mut notes);
        let name = file_name(plan.files.len() + 1, w);
        let text = rewrite::render_file(&w.origin, &notes, &[design.object(), object])?;
        plan.workloads.push(WorkloadPlan {
            workload: format!("{} {}/{}", w.kind, w.namespace, w.name),
            origin: w.origin.clone(),
            asks: asks
                .iter()
                .map(|a| format!("{}: {}: {}", a.container, a.resource, a.count))
                .collect(),
            claim: format!("{} {}/{}", design.kind, design.namespace, design.name),
            requests: design.request_summaries(),
            file: name.clone(),
            pods: 0,
            placed: 0,
            notes,
        });
        plan.files.push(PlannedFile { name, text });
    }
    for u in unknown {
        plan.notes.push(format!(
            "{u}: not a device-plugin GPU resource; left as it is (pods asking for it \
             need a node that still advertises it)"
        ));
    }
    if plan.workloads.is_empty() {
        plan.notes.push(
            "no workload of the input asks for nvidia.com/gpu or nvidia.com/mig-<profile>".into(),
        );
    }
    Ok(())
}

/// Why a workload is not planned itself: pods and Jobs its controller makes (planned through
/// the controller, or not at all when the controller is not in the input), finished Pods.
fn skip_reason(w: &Workload, objs: &Objects) -> Option<String> {
    let phase = w.source.pointer("/status/phase").and_then(Value::as_str);
    if w.kind == "Pod" && matches!(phase, Some("Succeeded" | "Failed")) {
        let phase = phase.unwrap_or_default();
        return Some(format!(
            "Pod {}/{}: {phase}, not planned",
            w.namespace, w.name
        ));
    }
    let owners = w.source.pointer("/metadata/ownerReferences")?;
    let controller = owners
        .as_array()?
        .iter()
        .find(|o| o.get("controller") == Some(&Value::Bool(true)));
    if let Some(o) = controller {
        let kind = o.get("kind").and_then(Value::as_str).unwrap_or_default();
        let name = o.get("name").and_then(Value::as_str).unwrap_or_default();
        let what = format!(
            "{} {}/{}: made by {kind} {name}",
            w.kind, w.namespace, w.name
        );
        return Some(match owner_in_input(kind, name, &w.namespace, objs) {
            Some(owner) => format!("{what}; planned through {owner}"),
            None => format!("{what}, which is not in the input: not planned"),
        });
    }
    None
}

/// The input's workload behind a controller reference (a ReplicaSet `<deployment>-<hash>`
/// stands for its Deployment, which dumps list instead of it).
fn owner_in_input(kind: &str, name: &str, namespace: &str, objs: &Objects) -> Option<String> {
    let find = |k: &str, n: &str| {
        objs.workloads
            .iter()
            .find(|w| w.kind == k && w.name == n && w.namespace == namespace)
            .map(|w| format!("{} {}", w.kind, w.name))
    };
    find(kind, name).or_else(|| {
        let deployment = name.rsplit_once('-')?.0;
        (kind == "ReplicaSet").then(|| find("Deployment", deployment))?
    })
}

/// `NN-<kind>-<namespace>-<name>.yaml`: numbered so that reading the directory (sorted, as
/// `simulate` and `kubectl apply -f DIR` do) keeps the input's order.
fn file_name(n: usize, w: &Workload) -> String {
    format!(
        "{n:02}-{}-{}-{}.yaml",
        w.kind.to_ascii_lowercase(),
        w.namespace,
        w.name
    )
}

/// Reads the planned files back through the loader and schedules their pods on the pool.
fn simulate(plan: &mut Plan) -> Result<()> {
    let mut objs = Objects::default();
    for (name, text) in EMBEDDED_CLASSES {
        input::load_str(name, text, &mut objs)?;
    }
    for f in &plan.files {
        input::load_str(&f.name, &f.text, &mut objs)?;
    }
    objs.slices.extend(plan.slices.iter().cloned());
    objs.nodes.extend(plan.node_objects.iter().cloned());
    let sim_nodes: Vec<_> = plan.nodes.iter().map(PoolNode::sim_node).collect();
    let mut pods = Vec::new();
    for (w, wp) in objs.workloads.iter().zip(plan.workloads.iter_mut()) {
        let mine = workloads::pods_of(w, &sim_nodes);
        wp.pods = mine.len();
        pods.extend(mine);
    }
    // the pool nodes no longer run the device plugin: nothing is advertised
    plan.pods = workloads::schedule_pods(&objs, &pods, &sim_nodes, &BTreeMap::new(), &[]);
    for wp in &mut plan.workloads {
        let owner = wp.workload.split_once(' ').map(|(k, rest)| {
            let (ns, name) = rest.split_once('/').unwrap_or(("", rest));
            (format!("{k}/{name}"), format!("{ns}/"))
        });
        let Some((owner, ns)) = owner else { continue };
        wp.placed = plan
            .pods
            .iter()
            .filter(|p| p.owner == owner && p.pod.starts_with(&ns) && p.node.is_some())
            .count();
    }
    let (gpus, free) = usage::usage(&plan.nodes, &plan.slices, &plan.pods);
    plan.gpus = gpus;
    plan.free = free;
    Ok(())
}
