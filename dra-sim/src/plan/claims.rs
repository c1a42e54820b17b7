//! The DRA claim that replaces a workload's device-plugin resources: one request per container
//! and resource, in a ResourceClaimTemplate (a claim per pod, as `nvidia.com/gpu` was per pod),
//! or for MPS in one ResourceClaim the workload's pods share (see docs/plan.md for why).
use super::nodes::{PoolNode, Sharing};
use super::requests::{Ask, Device};
use crate::workloads::{Workload, pod_may_run_on};
use gpu_dra_api::names::{GPU_CLASS, GPU_DRIVER as DRIVER_NAME, MIG_CLASS};
use serde_json::{Value, json};
use std::collections::BTreeSet;

const CONFIG_API_VERSION: &str = "resource.nvidia.com/v1beta1";

/// One request of the claim and the ask it serves.
#[derive(Debug, Clone)]
pub struct Request {
    pub name: String,
    pub class: &'static str,
    pub count: i64,
    /// For MIG: the profile its CEL selector asks for.
    pub profile: Option<String>,
    /// The GpuConfig sharing given to it.
    pub sharing: Option<Sharing>,
}

/// The claim of one workload.
#[derive(Debug, Clone)]
pub struct Design {
    /// `ResourceClaimTemplate`, or `ResourceClaim` (shared by every pod: MPS).
    pub kind: &'static str,
    pub name: String,
    pub namespace: String,
    /// The pod's `spec.resourceClaims[].name`.
    pub entry: String,
    pub requests: Vec<Request>,
    /// Per ask, the name of the request that serves it.
    pub per_ask: Vec<String>,
    /// MPS: the replicas per GPU the device plugin had.
    pub mps_replicas: Option<u32>,
    /// MPS: the pinned memory per client, MiB.
    pub mps_memory_mib: Option<u64>,
}

/// Decides the claim of `w` from its asks and the pool nodes its pods may run on; `taken` holds
/// the "namespace/name" of claim objects already planned. Notes say what maps inexactly.
pub fn design(
    w: &Workload,
    asks: &[Ask],
    pool: &[PoolNode],
    taken: &mut BTreeSet<String>,
    notes: &mut Vec<String>,
) -> Design {
    let eligible = eligible_nodes(w, pool);
    note_gfd_selectors(w, notes);
    let mps = mps_of(&eligible);
    let mut requests = Vec::new();
    let mut per_ask = vec![String::new(); asks.len()];
    // the long-lived containers first: init containers that run before them may reuse theirs
    let (first, long): (Vec<usize>, Vec<usize>) =
        (0..asks.len()).partition(|&i| asks[i].runs_first);
    for i in long.into_iter().chain(first) {
        if let Some(r) = reusable(asks, i, &per_ask, notes) {
            per_ask[i] = r;
            continue;
        }
        let name = request_name(asks, i, &requests);
        per_ask[i] = name.clone();
        requests.push(request_for(&asks[i], name, &eligible, mps.is_some(), notes));
    }
    let kind = if mps.is_some() {
        "ResourceClaim"
    } else {
        "ResourceClaimTemplate"
    };
    if let Some(r) = mps {
        notes.push(format!(
            "MPS (replicas={r}): one ResourceClaim shared by all pods of {} {}, so they run on \
             one node and share its GPU(s) under one MPS daemon; the device plugin spread them \
             over GPUs with {r} clients each (our plugin refuses MPS on consumable shares)",
            w.kind, w.name
        ));
    }
    Design {
        kind,
        name: object_name(w, taken),
        namespace: w.namespace.clone(),
        entry: entry_name(w),
        requests,
        per_ask,
        mps_replicas: mps,
        mps_memory_mib: mps.and_then(|r| {
            let mib = eligible
                .iter()
                .filter_map(|n| n.model)
                .map(|m| m.memory_mib);
            mib.min().map(|m| m / u64::from(r))
        }),
    }
}

/// For an init container that runs first: the request of a long-lived container asking for at
/// least as many devices of the same kind. The device plugin let such an init container reuse
/// the devices of the containers after it; a claim's request can be named by both.
fn reusable(asks: &[Ask], i: usize, per_ask: &[String], notes: &mut Vec<String>) -> Option<String> {
    let ask = &asks[i];
    if !ask.runs_first {
        return None;
    }
    let j = (0..asks.len()).find(|&j| {
        !asks[j].runs_first && asks[j].device == ask.device && asks[j].count >= ask.count
    })?;
    notes.push(format!(
        "init container {}: uses the devices of container {} (request {}), as the device \
         plugin let it reuse them",
        ask.container, asks[j].container, per_ask[j]
    ));
    Some(per_ask[j].clone())
}

/// The pool nodes with GPUs where the pod template may run (nodeSelector, affinity). A Pod's
/// `nodeName` is left out: the pod is created anew and scheduled again.
pub fn eligible_nodes<'a>(w: &Workload, pool: &'a [PoolNode]) -> Vec<&'a PoolNode> {
    let mut spec = w.template.spec.clone().unwrap_or_default();
    spec.node_name = None;
    pool.iter()
        .filter(|n| n.gpus > 0 && pod_may_run_on(&spec, &n.sim_node()))
        .collect()
}

/// Node labels under `nvidia.com/` that the pods select on are GPU feature discovery's, some
/// set from the device plugin's config (`gpu.replicas`, `gpu.sharing-strategy`, a `-SHARED` or
/// `-MIG-<p>` product): the plan holds only while the nodes keep them.
fn note_gfd_selectors(w: &Workload, notes: &mut Vec<String>) {
    let Some(spec) = w.template.spec.as_ref() else {
        return;
    };
    let mut keys: BTreeSet<&str> = spec
        .node_selector
        .iter()
        .flatten()
        .map(|(k, _)| k.as_str())
        .collect();
    let terms = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or(&[]);
    let expressions = terms
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten());
    keys.extend(expressions.map(|e| e.key.as_str()));
    let gfd: Vec<&str> = keys
        .into_iter()
        .filter(|k| k.starts_with("nvidia.com/"))
        .collect();
    if !gfd.is_empty() {
        notes.push(format!(
            "selects nodes by {} (GPU feature discovery's labels): planned with the labels the \
             nodes have now; keep them on the nodes after the move, or change the selector",
            gfd.join(", ")
        ));
    }
}

/// MPS replicas when every eligible node shares by MPS with the same replicas.
fn mps_of(eligible: &[&PoolNode]) -> Option<u32> {
    let first = eligible.first()?.mps()?;
    eligible
        .iter()
        .all(|n| n.mps() == Some(first))
        .then_some(first)
}

fn request_for(
    ask: &Ask,
    name: String,
    eligible: &[&PoolNode],
    mps: bool,
    notes: &mut Vec<String>,
) -> Request {
    let mut r = Request {
        name,
        class: GPU_CLASS,
        count: ask.count,
        profile: None,
        sharing: None,
    };
    if let Device::Mig(p) = &ask.device {
        r.class = MIG_CLASS;
        r.profile = Some(p.clone());
        return r;
    }
    if let Some(p) = single_profile(eligible) {
        notes.push(format!(
            "{}: the nodes it may run on have mig.strategy=single, where nvidia.com/gpu was a \
             {p} MIG device: asks {MIG_CLASS} with profile {p}",
            ask.container
        ));
        r.class = MIG_CLASS;
        r.profile = Some(p);
        return r;
    }
    note_partial_single(ask, eligible, notes);
    let time_sliced: Vec<&str> = eligible
        .iter()
        .filter(|n| n.time_sliced())
        .map(|n| n.name.as_str())
        .collect();
    if mps {
        r.sharing = Some(Sharing::Mps);
    } else if ask.shared || !time_sliced.is_empty() {
        r.sharing = Some(Sharing::TimeSlicing);
        note_time_slicing(ask, &time_sliced, notes);
    } else if eligible.iter().any(|n| n.mps().is_some()) {
        notes.push(format!(
            "{}: may run on MPS and other nodes: asks whole GPUs without MPS",
            ask.container
        ));
    }
    r
}

/// The one MIG profile of the eligible nodes when all of them are `single`-strategy nodes.
fn single_profile(eligible: &[&PoolNode]) -> Option<String> {
    let first = eligible.first()?.single_profile()?;
    eligible
        .iter()
        .all(|n| n.single_profile().as_deref() == Some(first.as_str()))
        .then_some(first)
}

fn note_partial_single(ask: &Ask, eligible: &[&PoolNode], notes: &mut Vec<String>) {
    let single: Vec<&str> = eligible
        .iter()
        .filter(|n| n.mig_strategy == "single")
        .map(|n| n.name.as_str())
        .collect();
    if !single.is_empty() {
        notes.push(format!(
            "{}: nodes {} had mig.strategy=single (nvidia.com/gpu was a MIG device there); \
             the claim asks for whole GPUs, which those nodes do not publish",
            ask.container,
            single.join(", ")
        ));
    }
}

fn note_time_slicing(ask: &Ask, nodes: &[&str], notes: &mut Vec<String>) {
    if nodes.is_empty() {
        notes.push(format!(
            "{}: {} asks for a time-sliced GPU, but no pool node it may run on is time-sliced",
            ask.container, ask.resource
        ));
        return;
    }
    notes.push(format!(
        "{}: may run on time-sliced node(s) {}: there each GPU is published with consumable \
         shares (one per device-plugin replica) and each claim takes one; GpuConfig TimeSlicing \
         because claims sharing a GPU must configure it alike",
        ask.container,
        nodes.join(", ")
    ));
    if ask.count > 1 {
        notes.push(format!(
            "{}: count {} takes one share of {} different GPUs; the device plugin could hand \
             out several replicas of one GPU",
            ask.container, ask.count, ask.count
        ));
    }
}

/// `gpu` / `mig` for a single ask; else `<container>-<resource>` as a DNS label, made unique.
fn request_name(asks: &[Ask], i: usize, done: &[Request]) -> String {
    let ask = &asks[i];
    let base = if asks.len() == 1 {
        match ask.device {
            Device::Gpu => "gpu".to_string(),
            Device::Mig(_) => "mig".to_string(),
        }
    } else {
        let res = ask.resource.trim_start_matches("nvidia.com/");
        dns_label(&format!("{}-{res}", ask.container))
    };
    let mut name = base.clone();
    let mut n = 2;
    while done.iter().any(|r| r.name == name) {
        name = dns_label(&format!("{base}-{n}"));
        n += 1;
    }
    name
}

/// Lower case letters, digits and `-`, at most 63, starting and ending alphanumeric.
fn dns_label(s: &str) -> String {
    let mapped: String = s
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let cut: String = mapped.chars().take(63).collect();
    cut.trim_matches('-').to_string()
}

/// `<workload>-gpu`, or `<workload>-<kind>-gpu` when another workload of the namespace has it.
fn object_name(w: &Workload, taken: &mut BTreeSet<String>) -> String {
    let mut name = format!("{}-gpu", w.name);
    if taken.contains(&format!("{}/{name}", w.namespace)) {
        name = format!("{}-{}-gpu", w.name, w.kind.to_ascii_lowercase());
    }
    taken.insert(format!("{}/{name}", w.namespace));
    name
}

/// `gpu`, unless the pod already has an entry of that name.
fn entry_name(w: &Workload) -> String {
    let spec = w.template.spec.as_ref();
    let existing: Vec<&str> = spec
        .and_then(|s| s.resource_claims.as_deref())
        .unwrap_or(&[])
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    let mut name = "gpu".to_string();
    let mut n = 2;
    while existing.contains(&name.as_str()) {
        name = format!("gpu-{n}");
        n += 1;
    }
    name
}

impl Design {
    /// The claim's `spec` (a ResourceClaimSpec).
    fn claim_spec(&self) -> Value {
        let requests: Vec<Value> = self.requests.iter().map(request_json).collect();
        let mut devices = json!({ "requests": requests });
        let config = self.config_json();
        if !config.is_empty() {
            devices["config"] = Value::Array(config);
        }
        json!({ "devices": devices })
    }

    /// One GpuConfig per sharing strategy, for the whole-GPU requests that have it.
    fn config_json(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for strategy in [Sharing::TimeSlicing, Sharing::Mps] {
            let names: Vec<&str> = self
                .requests
                .iter()
                .filter(|r| r.sharing == Some(strategy))
                .map(|r| r.name.as_str())
                .collect();
            if names.is_empty() {
                continue;
            }
            out.push(json!({
                "requests": names,
                "opaque": {
                    "driver": DRIVER_NAME,
                    "parameters": {
                        "apiVersion": CONFIG_API_VERSION,
                        "kind": "GpuConfig",
                        "sharing": self.sharing_json(strategy),
                    },
                },
            }));
        }
        out
    }

    /// TimeSlicing at the Default interval; MPS split as the device plugin split it: each of
    /// the N replicas gets 100/N % of the threads and 1/N of the memory.
    fn sharing_json(&self, strategy: Sharing) -> Value {
        match strategy {
            Sharing::TimeSlicing => json!({
                "strategy": "TimeSlicing",
                "timeSlicingConfig": { "interval": "Default" },
            }),
            Sharing::Mps => {
                let r = self.mps_replicas.unwrap_or(1).max(1);
                let mut mps = json!({ "defaultActiveThreadPercentage": 100 / r });
                if let Some(mib) = self.mps_memory_mib {
                    mps["defaultPinnedDeviceMemoryLimit"] = json!(format!("{mib}Mi"));
                }
                json!({ "strategy": "MPS", "mpsConfig": mps })
            }
        }
    }

    /// The ResourceClaimTemplate or ResourceClaim object.
    pub fn object(&self) -> Value {
        let meta = json!({ "name": self.name, "namespace": self.namespace });
        let spec = self.claim_spec();
        let spec = if self.kind == "ResourceClaim" {
            spec
        } else {
            json!({ "spec": spec })
        };
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": self.kind,
            "metadata": meta,
            "spec": spec,
        })
    }

    /// For the report: `gpu: gpu.nvidia.com x1 (TimeSlicing)`.
    pub fn request_summaries(&self) -> Vec<String> {
        self.requests
            .iter()
            .map(|r| {
                let mut s = format!("{}: {} x{}", r.name, r.class, r.count);
                if let Some(p) = &r.profile {
                    s.push_str(&format!(" profile {p}"));
                }
                if let Some(sh) = r.sharing {
                    s.push_str(&format!(" ({})", sh.as_str()));
                }
                s
            })
            .collect()
    }
}

fn request_json(r: &Request) -> Value {
    let mut exactly = json!({
        "deviceClassName": r.class,
        "allocationMode": "ExactCount",
        "count": r.count,
    });
    if let Some(p) = &r.profile {
        exactly["selectors"] = json!([{ "cel": { "expression": mig_selector(p) } }]);
    }
    json!({ "name": r.name, "exactly": exactly })
}

/// The CEL selector for one MIG profile.
pub fn mig_selector(profile: &str) -> String {
    format!("device.attributes['{DRIVER_NAME}'].profile == '{profile}'")
}
