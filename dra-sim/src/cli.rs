//! The `eval` and `simulate` commands (`dra-controller eval`, `dra-controller simulate`).
use super::alloc::{AllocatedState, Allocator, SimNode, explain::StageCounts};
use super::input::{self, Objects};
use crate::{Error, Result};
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim, ResourceSlice};
use serde::Serialize;
use std::path::PathBuf;

/// The DeviceClasses shipped in `deviceclasses/`, embedded so the default works from any cwd.
pub const EMBEDDED_CLASSES: &[(&str, &str)] = &[
    (
        "deviceclasses/gpu.nvidia.com.yaml",
        include_str!("../../deviceclasses/gpu.nvidia.com.yaml"),
    ),
    (
        "deviceclasses/mig.nvidia.com.yaml",
        include_str!("../../deviceclasses/mig.nvidia.com.yaml"),
    ),
    (
        "deviceclasses/vfio.gpu.nvidia.com.yaml",
        include_str!("../../deviceclasses/vfio.gpu.nvidia.com.yaml"),
    ),
    (
        "deviceclasses/migration.gpu.nvidia.com.yaml",
        include_str!("../../deviceclasses/migration.gpu.nvidia.com.yaml"),
    ),
    (
        "deviceclasses/compute-domain-daemon.nvidia.com.yaml",
        include_str!("../../deviceclasses/compute-domain-daemon.nvidia.com.yaml"),
    ),
    (
        "deviceclasses/compute-domain-default-channel.nvidia.com.yaml",
        include_str!("../../deviceclasses/compute-domain-default-channel.nvidia.com.yaml"),
    ),
];

/// Node name used for `--profile` slices unless `--node` names one.
pub const SIM_NODE: &str = "sim-node";
/// The profile used when `simulate` gets no slices at all.
pub const DEFAULT_PROFILE: &str = "h100-80gb:8";

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Table,
    Yaml,
    Json,
}

#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// CEL selector expression (the body of `selectors[].cel.expression`).
    #[arg(long)]
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

#[derive(clap::Args, Debug)]
pub struct SimulateArgs {
    /// ResourceClaim or ResourceClaimTemplate files (all together are one pod).
    #[arg(required = true)]
    pub claims: Vec<PathBuf>,
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

fn profile_slices(
    profiles: &[String],
    node: &str,
    dynamic_mig: bool,
) -> Result<Vec<ResourceSlice>> {
    let p: Vec<&str> = profiles.iter().map(|s| s.as_str()).collect();
    gpu_dra_api::slices::simulated_node_slices(node, &p, None, dynamic_mig)
        .map_err(|e| Error::invalid(format!("--profile {}: {e}", profiles.join(","))))
}

#[derive(Serialize)]
struct EvalRow {
    driver: String,
    pool: String,
    device: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    matches: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

pub async fn eval(args: EvalArgs) -> Result<()> {
    if args.selector.len() > super::cel::MAX_EXPRESSION_LENGTH {
        return Err(Error::invalid(format!(
            "selector: Too long: may not be more than {} bytes",
            super::cel::MAX_EXPRESSION_LENGTH
        )));
    }
    let prog = super::cel::compile(&args.selector).map_err(Error::Invalid)?;
    let mut objs = Objects::default();
    if !args.profile.is_empty() {
        objs.slices = profile_slices(&args.profile, SIM_NODE, args.dynamic_mig)?;
    } else if !args.slices.is_empty() {
        input::load_paths(&args.slices, &mut objs)?;
    } else {
        return Err(Error::invalid(
            "eval needs --slices <files|dirs> or --profile <profile>",
        ));
    }
    let mut rows = Vec::new();
    for s in &objs.slices {
        for d in s.spec.devices.iter().flatten() {
            // as the allocator reads devices: in place, conversion checked first
            let raw = super::cel::RawDevice::of(&s.spec.driver, d);
            let r = super::cel::device_check(&raw).and_then(|()| prog.eval_raw(raw));
            let (matches, error) = match r {
                Ok(b) => (Some(b), None),
                Err(e) => (None, Some(super::cel::enhance_runtime_error(&e))),
            };
            rows.push(EvalRow {
                driver: s.spec.driver.clone(),
                pool: s.spec.pool.name.clone(),
                device: d.name.clone(),
                matches,
                error,
            });
        }
    }
    match args.output {
        Output::Json => emit(&format!("{}\n", serde_json::to_string_pretty(&rows)?)),
        Output::Yaml => emit(&serde_yaml::to_string(&rows)?),
        Output::Table => {
            let mut t = String::new();
            let w = rows
                .iter()
                .map(|r| r.device.len())
                .max()
                .unwrap_or(6)
                .max(6);
            let pw = rows.iter().map(|r| r.pool.len()).max().unwrap_or(4).max(4);
            t.push_str(&format!(
                "{:<16} {:<pw$} {:<w$} RESULT\n",
                "DRIVER", "POOL", "DEVICE"
            ));
            for r in &rows {
                let res = match (&r.matches, &r.error) {
                    (Some(b), _) => b.to_string(),
                    (_, Some(e)) => format!("error: {e}"),
                    _ => String::new(),
                };
                t.push_str(&format!(
                    "{:<16} {:<pw$} {:<w$} {res}\n",
                    r.driver, r.pool, r.device
                ));
            }
            emit(&t);
        }
    }
    Ok(())
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
    pub pending: Vec<ResourceClaim>,
    pub allocated: Vec<ResourceClaim>,
    pub nodes: Vec<SimNode>,
}

pub async fn load_scenario(args: &SimulateArgs) -> Result<Scenario> {
    let mut claims = Objects::default();
    input::load_paths(&args.claims, &mut claims)?;
    if claims.claims.is_empty() {
        return Err(Error::invalid(format!(
            "no ResourceClaim or ResourceClaimTemplate found in {:?}",
            args.claims
        )));
    }
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
    objs.claims.clear();
    let mut allocated = Vec::new();
    if let Some(kc) = &args.kubeconfig {
        live::load(kc, &mut objs, &mut allocated).await?;
    }
    let mut profiles = args.profile.clone();
    if profiles.is_empty() && objs.slices.is_empty() && args.kubeconfig.is_none() {
        profiles.push(DEFAULT_PROFILE.to_string());
    }
    let dynamic = args.dynamic_mig
        || (args.profile.is_empty() && profiles.len() == 1 && profiles[0] == DEFAULT_PROFILE);
    if !profiles.is_empty() {
        let node = args.node.clone().unwrap_or_else(|| SIM_NODE.to_string());
        objs.slices
            .extend(profile_slices(&profiles, &node, dynamic)?);
    }
    let (done, pending): (Vec<_>, Vec<_>) = claims.claims.into_iter().partition(|c| {
        c.status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .is_some()
    });
    allocated.extend(done);
    if pending.is_empty() {
        return Err(Error::invalid(
            "all claims in the input are already allocated; nothing to simulate",
        ));
    }
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
    let nodes: Vec<SimNode> = names
        .into_iter()
        .map(|name| {
            let labels = objs
                .nodes
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(name.as_str()))
                .and_then(|n| n.metadata.labels.clone())
                .unwrap_or_default();
            let mut labels = labels;
            labels
                .entry("kubernetes.io/hostname".into())
                .or_insert_with(|| name.clone());
            SimNode { name, labels }
        })
        .collect();
    tracing::debug!(
        slices = objs.slices.len(),
        classes = objs.classes.len(),
        pending = pending.len(),
        allocated = allocated.len(),
        nodes = %nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>().join(","),
        "scenario loaded"
    );
    Ok(Scenario {
        objs,
        pending,
        allocated,
        nodes,
    })
}

/// Runs the allocator on every node of the scenario.
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

pub fn render_table(outcomes: &[NodeOutcome]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let fits: Vec<&NodeOutcome> = outcomes.iter().filter(|o| o.fits).collect();
    if !fits.is_empty() {
        let _ = writeln!(
            s,
            "{:<20} {:<28} {:<22} {:<16} {:<20} DEVICE",
            "NODE", "CLAIM", "REQUEST", "DRIVER", "POOL"
        );
        for o in &fits {
            for c in &o.claims {
                for r in c
                    .allocation
                    .devices
                    .iter()
                    .flat_map(|d| d.results.iter().flatten())
                {
                    let _ = writeln!(
                        s,
                        "{:<20} {:<28} {:<22} {:<16} {:<20} {}",
                        o.node, c.claim, r.request, r.driver, r.pool, r.device
                    );
                }
            }
        }
    }
    for o in outcomes.iter().filter(|o| !o.fits) {
        let _ = writeln!(
            s,
            "node {}: unsatisfiable{}",
            o.node,
            o.error
                .as_ref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        );
        for st in &o.unsatisfiable {
            if st.request.is_empty() {
                for e in &st.errors {
                    let _ = writeln!(s, "  {e}");
                }
                continue;
            }
            let _ = writeln!(
                s,
                "  {} request {} (wants {}): {} devices considered, {} passed class selectors, {} passed request selectors, {} not in use, {} with capacity, {} with counters available, {} tolerated taints, {} satisfy constraints",
                st.claim,
                st.request,
                st.wanted,
                st.considered,
                st.class_selectors,
                st.request_selectors,
                st.not_in_use,
                st.capacity,
                st.counters,
                st.taints,
                st.constraints
            );
            for e in &st.errors {
                let _ = writeln!(s, "    selector error: {e}");
            }
        }
        if let Some(st) = o.unsatisfiable.first() {
            for p in &st.pool_problems {
                let _ = writeln!(s, "  {p}");
            }
        }
    }
    s
}

/// Writes to stdout, tolerating a closed pipe (`| head`).
fn emit(s: &str) {
    use std::io::Write;
    let _ = std::io::stdout().lock().write_all(s.as_bytes());
}

pub async fn simulate(args: SimulateArgs) -> Result<()> {
    let sc = load_scenario(&args).await?;
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

mod live {
    //! `--kubeconfig`: ResourceSlices, DeviceClasses and allocated ResourceClaims from a cluster.
    use super::*;
    use kube::api::{Api, ListParams};

    pub async fn load(
        path: &str,
        objs: &mut Objects,
        allocated: &mut Vec<ResourceClaim>,
    ) -> Result<()> {
        let config = if path.is_empty() {
            kube::Config::infer().await.map_err(Error::InferConfig)?
        } else {
            let kc =
                kube::config::Kubeconfig::read_from(path).map_err(|source| Error::Kubeconfig {
                    what: format!("reading kubeconfig {path}"),
                    source,
                })?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|source| Error::Kubeconfig {
                    what: format!("kubeconfig {path}"),
                    source,
                })?
        };
        let client = kube::Client::try_from(config)?;
        let lp = ListParams::default();
        let slices: Api<ResourceSlice> = Api::all(client.clone());
        objs.slices.extend(
            slices
                .list(&lp)
                .await
                .map_err(|source| Error::List {
                    kind: "ResourceSlices",
                    source,
                })?
                .items,
        );
        let classes: Api<k8s_openapi::api::resource::v1::DeviceClass> = Api::all(client.clone());
        objs.classes.extend(
            classes
                .list(&lp)
                .await
                .map_err(|source| Error::List {
                    kind: "DeviceClasses",
                    source,
                })?
                .items,
        );
        let claims: Api<ResourceClaim> = Api::all(client.clone());
        allocated.extend(
            claims
                .list(&lp)
                .await
                .map_err(|source| Error::List {
                    kind: "ResourceClaims",
                    source,
                })?
                .items
                .into_iter()
                .filter(|c| {
                    c.status
                        .as_ref()
                        .and_then(|s| s.allocation.as_ref())
                        .is_some()
                }),
        );
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
        objs.nodes.extend(
            nodes
                .list(&lp)
                .await
                .map_err(|source| Error::List {
                    kind: "Nodes",
                    source,
                })?
                .items,
        );
        Ok(())
    }
}
