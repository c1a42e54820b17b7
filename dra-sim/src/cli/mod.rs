//! The `eval`, `simulate` and `plan` commands (`dra-controller eval`, `simulate`, `plan`).
mod eval;
mod live;
mod plan;
mod table;

use super::alloc::{AllocatedState, Allocator, SimNode, explain::StageCounts};
use super::input::{self, Objects};
use super::workloads::{self, PodOutcome, SimPod};
use crate::{Error, Result};
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim, ResourceSlice};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

pub use eval::eval;
pub use plan::{PlanArgs, all_manifests, load_plan_input, plan, write_files};
pub use table::{render_table, render_unsatisfiable};

/// The DeviceClasses shipped in `deviceclasses/`, embedded so the default works from any cwd.
pub const EMBEDDED_CLASSES: &[(&str, &str)] = &[
    (
        "deviceclasses/gpu.nvidia.com.yaml",
        include_str!("../../../deviceclasses/gpu.nvidia.com.yaml"),
    ),
    (
        "deviceclasses/mig.nvidia.com.yaml",
        include_str!("../../../deviceclasses/mig.nvidia.com.yaml"),
    ),
    (
        "deviceclasses/vfio.gpu.nvidia.com.yaml",
        include_str!("../../../deviceclasses/vfio.gpu.nvidia.com.yaml"),
    ),
    (
        "deviceclasses/compute-domain-daemon.nvidia.com.yaml",
        include_str!("../../../deviceclasses/compute-domain-daemon.nvidia.com.yaml"),
    ),
    (
        "deviceclasses/compute-domain-default-channel.nvidia.com.yaml",
        include_str!("../../../deviceclasses/compute-domain-default-channel.nvidia.com.yaml"),
    ),
];

/// Node name used for `--profile` slices unless `--node` names one.
pub const SIM_NODE: &str = "sim-node";
/// The profile used when `simulate` gets no slices at all.
pub const DEFAULT_PROFILE: &str = "h100-80gb:8";

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Output {
    #[default]
    Table,
    Yaml,
    Json,
}

#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// CEL selector expression (the body of `selectors[].cel.expression`); may begin with `-`.
    #[arg(long, allow_hyphen_values = true)]
    pub selector: String,
    /// ResourceSlice files or directories.
    #[arg(long, num_args = 1.., conflicts_with = "profile")]
    pub slices: Vec<PathBuf>,
    /// Simulated node profile(s), e.g. `h100-80gb:8`.
    #[arg(long, num_args = 1..)]
    pub profile: Vec<String>,
    /// With --profile: publish dynamic MIG placements (partitionable devices).
    #[arg(long)]
    pub dynamic_mig: bool,
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Output,
}

/// What `simulate` reads, as `kubectl apply -f` reads it.
const SIMULATE_INPUT_HELP: &str = "\
Input: any number of files and directories (their *.yaml, *.yml, *.json; -R for subdirectories; \
- for stdin), multi-document, List kinds included. resource.k8s.io v1 objects are read as they \
are; v1beta1 and v1beta2 are converted to v1 as the API server converts them (a note says so); \
v1alpha2 and v1alpha3 are refused. Workloads and their pod templates: Pod, PodTemplate \
(template, one pod), ReplicationController, Deployment, ReplicaSet, StatefulSet (spec.template, \
spec.replicas, default 1), DaemonSet (spec.template, one pod per matching node), Job \
(spec.template, spec.parallelism up to spec.completions), CronJob (spec.jobTemplate.spec.template). \
Each pod gets its spec.resourceClaims (a ResourceClaim is shared by the pods naming it; a \
ResourceClaimTemplate gives each pod its own claim) and a claim for extended resources \
(nvidia.com/gpu: 2) that a DeviceClass backs through spec.extendedResourceName or \
deviceclass.resource.kubernetes.io/<class>. Pods are scheduled in input order, each on the \
first node by name where its claims fit. Without workloads, all claims and templates of the \
input together are one pod. Other kinds (Namespace, ConfigMap, RBAC, custom resources) are \
listed as ignored.";

#[derive(clap::Args, Debug, Default)]
#[command(after_help = SIMULATE_INPUT_HELP)]
pub struct SimulateArgs {
    /// Files or directories with workloads, claims, templates, DeviceClasses, slices, Nodes.
    pub files: Vec<PathBuf>,
    /// More files or directories, as with `kubectl apply -f` (repeatable).
    #[arg(short = 'f', long = "filename")]
    pub filename: Vec<PathBuf>,
    /// Read the directories' subdirectories too.
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// ResourceSlice files or directories.
    #[arg(long, num_args = 1..)]
    pub slices: Vec<PathBuf>,
    /// DeviceClass files or directories (default: the embedded deviceclasses/).
    #[arg(long, num_args = 1..)]
    pub classes: Vec<PathBuf>,
    /// Simulated node profile(s), e.g. `h100-80gb:8`, published by the plugin's own slice builder.
    #[arg(long, num_args = 1..)]
    pub profile: Vec<String>,
    /// With --profile: publish dynamic MIG placements with shared counters.
    #[arg(long)]
    pub dynamic_mig: bool,
    /// With --profile: the node plugin's feature gates (NVIDIA's names); `PassthroughSupport=true`
    /// adds a `gpu-vfio-<index>` device per GPU without MIG devices.
    #[arg(long, default_value = "")]
    pub feature_gates: String,
    /// With --profile and `ConsumableShares=true`: NVIDIA's `--consumable-shares` mode
    /// (`disabled`, `memory`, `unlimited` or a number of shares per device).
    #[arg(long, default_value = "disabled")]
    pub consumable_shares: gpu_dra_api::slices::ConsumableShares,
    /// With --profile, without --dynamic-mig: a static MIG layout (`all-1g.10gb`, `all-balanced`,
    /// or a list such as `3g.40gb,2g.20gb`).
    #[arg(long)]
    pub mig_layout: Option<String>,
    /// Node objects (their labels are matched against nodeSelector slices).
    #[arg(long, num_args = 1..)]
    pub nodes: Vec<PathBuf>,
    /// Only try this node (default: every node found in the slices).
    #[arg(long)]
    pub node: Option<String>,
    /// Read ResourceSlices, DeviceClasses and allocated claims from a cluster.
    #[arg(long, num_args = 0..=1, default_missing_value = "")]
    pub kubeconfig: Option<String>,
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Output,
}

impl SimulateArgs {
    /// The input files: the positional ones, then those of `-f`.
    pub fn inputs(&self) -> Vec<PathBuf> {
        self.files.iter().chain(&self.filename).cloned().collect()
    }
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct ClaimAllocation {
    pub claim: String,
    pub allocation: AllocationResult,
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct NodeOutcome {
    pub node: String,
    pub fits: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<ClaimAllocation>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unsatisfiable: Vec<StageCounts>,
}

/// Everything `simulate` needs, resolved from flags.
pub struct Scenario {
    pub objs: Objects,
    /// Without workloads: the claims of the one pod.
    pub pending: Vec<ResourceClaim>,
    pub allocated: Vec<ResourceClaim>,
    pub nodes: Vec<SimNode>,
    /// With workloads: their pods, in input order.
    pub pods: Vec<SimPod>,
}

/// The input files, the DeviceClasses and slices, and with `--kubeconfig` the cluster's state.
pub async fn load_scenario(args: &SimulateArgs) -> Result<Scenario> {
    let mut cluster = Objects::default();
    let mut allocated = Vec::new();
    if let Some(kc) = &args.kubeconfig {
        live::load(kc, &mut cluster, &mut allocated).await?;
    }
    build_scenario(args, cluster, allocated)
}

/// [`load_scenario`] once the cluster's objects (if any) are read.
pub fn build_scenario(
    args: &SimulateArgs,
    cluster: Objects,
    mut allocated: Vec<ResourceClaim>,
) -> Result<Scenario> {
    let inputs = args.inputs();
    if inputs.is_empty() {
        return Err(Error::invalid("simulate needs input files (FILES or -f)"));
    }
    let mut given = Objects::default();
    input::load_paths_with(&inputs, args.recursive, &mut given)?;
    let mut objs = Objects::default();
    if args.classes.is_empty() && args.kubeconfig.is_none() {
        for (name, text) in EMBEDDED_CLASSES {
            input::load_str(name, text, &mut objs)?;
        }
    } else {
        input::load_paths(&args.classes, &mut objs)?;
    }
    input::load_paths(&args.slices, &mut objs)?;
    input::load_paths(&args.nodes, &mut objs)?;
    objs.extend(cluster);
    merge_input(&mut objs, given);
    add_profile_slices(args, &mut objs)?;
    let nodes = sim_nodes(args, &objs);
    let mut pending = Vec::new();
    let mut pods = Vec::new();
    if objs.workloads.is_empty() {
        let (done, todo) = claims_of_one_pod(&objs, &inputs)?;
        allocated.extend(done);
        pending = todo;
    } else {
        for w in &objs.workloads {
            pods.extend(workloads::pods_of(w, &nodes));
        }
    }
    tracing::debug!(
        slices = objs.slices.len(),
        classes = objs.classes.len(),
        pending = pending.len(),
        pods = pods.len(),
        allocated = allocated.len(),
        nodes = %nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>().join(","),
        "scenario loaded"
    );
    Ok(Scenario {
        objs,
        pending,
        allocated,
        nodes,
        pods,
    })
}

/// Adds the input's objects; a DeviceClass of the input replaces the one of the same name.
fn merge_input(objs: &mut Objects, given: Objects) {
    let names: BTreeSet<Option<String>> = given
        .classes
        .iter()
        .map(|c| c.metadata.name.clone())
        .collect();
    objs.classes.retain(|c| !names.contains(&c.metadata.name));
    objs.extend(given);
}

fn add_profile_slices(args: &SimulateArgs, objs: &mut Objects) -> Result<()> {
    let mut profiles = args.profile.clone();
    let embedded_default =
        profiles.is_empty() && objs.slices.is_empty() && args.kubeconfig.is_none();
    if embedded_default {
        profiles.push(DEFAULT_PROFILE.to_string());
    }
    let gates = gpu_dra_api::gates::FeatureGates::parse(&args.feature_gates)
        .map_err(|e| Error::invalid(format!("--feature-gates: {e}")))?;
    let passthrough = gates.enabled("PassthroughSupport");
    // the embedded default node has dynamic MIG, as `make run` shows
    let dynamic = args.dynamic_mig
        || gates.dynamic_mig()
        || (embedded_default && args.mig_layout.is_none() && !passthrough);
    args.consumable_shares
        .check_gate(&gates)
        .map_err(Error::invalid)?;
    if !profiles.is_empty() {
        let node = args.node.clone().unwrap_or_else(|| SIM_NODE.to_string());
        let p: Vec<&str> = profiles.iter().map(|s| s.as_str()).collect();
        let sim = gpu_dra_api::slices::SimulatedNode {
            name: &node,
            profiles: &p,
            mig_layout: args.mig_layout.as_deref(),
            dynamic_mig: dynamic,
            passthrough,
            consumable_shares: args.consumable_shares,
        };
        let slices = sim
            .slices()
            .map_err(|e| Error::invalid(format!("--profile {}: {e}", profiles.join(","))))?;
        objs.slices.extend(slices);
    }
    Ok(())
}

/// Without workloads: the input's claims and templates are one pod's; (allocated, pending).
fn claims_of_one_pod(
    objs: &Objects,
    inputs: &[PathBuf],
) -> Result<(Vec<ResourceClaim>, Vec<ResourceClaim>)> {
    let claims = objs.standalone_claims();
    if claims.is_empty() {
        return Err(Error::invalid(format!(
            "no workload, ResourceClaim or ResourceClaimTemplate found in {}",
            inputs
                .iter()
                .map(|p| input::display(p))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let (done, pending): (Vec<_>, Vec<_>) = claims.into_iter().partition(|c| {
        c.status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .is_some()
    });
    if pending.is_empty() {
        return Err(Error::invalid(
            "all claims in the input are already allocated; nothing to simulate",
        ));
    }
    Ok((done, pending))
}

/// The nodes to try: `--node`, or every node of the slices and Node objects, by name.
fn sim_nodes(args: &SimulateArgs, objs: &Objects) -> Vec<SimNode> {
    let mut names: Vec<String> = match &args.node {
        Some(n) => vec![n.clone()],
        None => {
            let mut v: Vec<String> = objs
                .slices
                .iter()
                .filter_map(|s| s.spec.node_name.clone())
                .collect();
            v.extend(objs.nodes.iter().filter_map(|n| n.metadata.name.clone()));
            v.sort();
            v.dedup();
            v
        }
    };
    if names.is_empty() {
        names.push(SIM_NODE.to_string());
    }
    names
        .into_iter()
        .map(|name| {
            let mut labels = objs
                .nodes
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(name.as_str()))
                .and_then(|n| n.metadata.labels.clone())
                .unwrap_or_default();
            labels
                .entry("kubernetes.io/hostname".into())
                .or_insert_with(|| name.clone());
            SimNode { name, labels }
        })
        .collect()
}

/// Per node, the extended resources its Node object's allocatable has (a device plugin's).
pub fn advertised_resources(objs: &Objects) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for n in &objs.nodes {
        let allocatable = n.status.as_ref().and_then(|s| s.allocatable.as_ref());
        let names: BTreeSet<String> = allocatable
            .into_iter()
            .flatten()
            .filter(|(k, q)| k.contains('/') && q.0 != "0")
            .map(|(k, _)| k.clone())
            .collect();
        if let Some(name) = &n.metadata.name {
            out.insert(name.clone(), names);
        }
    }
    out
}

/// Runs the allocator on every node of the scenario (without workloads: the one pod).
pub fn run_scenario(sc: &Scenario) -> Vec<NodeOutcome> {
    let alloc = Allocator::new(
        &sc.objs.classes,
        &sc.objs.slices,
        AllocatedState::from_claims(&sc.allocated),
    );
    let mut out = Vec::new();
    for node in &sc.nodes {
        let res = alloc.allocate(node, &sc.pending);
        let mut o = NodeOutcome {
            node: node.name.clone(),
            fits: false,
            claims: vec![],
            error: None,
            unsatisfiable: vec![],
        };
        match res {
            Ok(Some(results)) => {
                o.fits = true;
                o.claims = sc
                    .pending
                    .iter()
                    .zip(results)
                    .map(|(c, a)| ClaimAllocation {
                        claim: super::alloc::claim_name(c),
                        allocation: a,
                    })
                    .collect();
            }
            Ok(None) => o.unsatisfiable = alloc.explain(node, &sc.pending),
            Err(e) => {
                o.error = Some(e);
                o.unsatisfiable = alloc.explain(node, &sc.pending);
            }
        }
        out.push(o);
    }
    out
}

/// Schedules the scenario's pods one after another (with workloads).
pub fn run_pods(sc: &Scenario) -> Vec<PodOutcome> {
    let advertised = advertised_resources(&sc.objs);
    workloads::schedule_pods(&sc.objs, &sc.pods, &sc.nodes, &advertised, &sc.allocated)
}

/// `simulate -o json|yaml` with workloads.
#[derive(Serialize)]
struct PodsReport<'a> {
    pods: &'a [PodOutcome],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    notes: &'a [String],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    ignored: &'a [String],
}

/// Writes to stdout, tolerating a closed pipe (`| head`).
fn emit(s: &str) {
    use std::io::Write;
    let _ = std::io::stdout().lock().write_all(s.as_bytes());
}

/// Notes and ignored objects go to stderr, so that stdout stays the answer.
fn tell_user(objs: &Objects) {
    for n in &objs.notes {
        eprintln!("note: {n}");
    }
    for i in &objs.ignored {
        eprintln!("note: {i}");
    }
}

pub async fn simulate(args: SimulateArgs) -> Result<()> {
    let sc = load_scenario(&args).await?;
    tell_user(&sc.objs);
    if !sc.objs.workloads.is_empty() {
        return simulate_pods(&sc, args.output);
    }
    let outcomes = run_scenario(&sc);
    for o in &outcomes {
        tracing::debug!(node = %o.node, fits = o.fits, "allocator ran");
    }
    match args.output {
        Output::Json => emit(&format!("{}\n", serde_json::to_string_pretty(&outcomes)?)),
        Output::Yaml => emit(&serde_yaml::to_string(&outcomes)?),
        Output::Table => emit(&render_table(&outcomes)),
    }
    if !outcomes.iter().any(|o| o.fits) {
        return Err(Error::Unsatisfiable {
            nodes: outcomes.len(),
        });
    }
    Ok(())
}

fn simulate_pods(sc: &Scenario, output: Output) -> Result<()> {
    let outcomes = run_pods(sc);
    let report = PodsReport {
        pods: &outcomes,
        notes: &sc.objs.notes,
        ignored: &sc.objs.ignored,
    };
    match output {
        Output::Json => emit(&format!("{}\n", serde_json::to_string_pretty(&report)?)),
        Output::Yaml => emit(&serde_yaml::to_string(&report)?),
        Output::Table => emit(&workloads::render_pods_table(&outcomes)),
    }
    let pending = outcomes.iter().filter(|o| o.node.is_none()).count();
    if pending > 0 {
        return Err(Error::Unschedulable {
            pending,
            pods: outcomes.len(),
        });
    }
    Ok(())
}
