//! `plan`: the migration planner's flags, its input (files as `simulate` reads them, or a live
//! cluster) and where its output goes (the report on stdout; the manifests to `--out DIR`, or
//! with `--out -` to stdout and the report to stderr, so they can be piped to `kubectl apply`).
use super::{Output, emit, live, tell_user};
use crate::input::{self, Objects};
use crate::plan::{Plan, PoolSelection, make_plan, render_report};
use crate::{Error, Result};
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

const PLAN_HELP: &str = "\
Input: a dump (kubectl get nodes,pods,deploy,sts,ds,jobs,cronjobs -A -o yaml; a List or \
multi-document YAML, read as simulate reads files) or a live cluster (--kubeconfig). The pool's \
Nodes are read by their GPU feature discovery labels (nvidia.com/gpu.product, gpu.count, \
gpu.memory, mig.strategy, mig.config, gpu.replicas, gpu.sharing-strategy) and capacity. \
Workloads asking for nvidia.com/gpu or nvidia.com/mig-<profile> get a ResourceClaimTemplate \
(gpu.nvidia.com, or mig.nvidia.com with a CEL selector on the profile) and their pod template \
changed to use it; the result is placed on the pool with the scheduler's allocator. Pods made by \
a controller are planned through it. See docs/plan.md.";

#[derive(clap::Args, Debug, Default)]
#[command(after_help = PLAN_HELP)]
#[command(group(clap::ArgGroup::new("pool").required(true).args(["pool_selector", "pool_nodes"])))]
pub struct PlanArgs {
    /// The dump: files or directories with Nodes and workloads.
    pub files: Vec<PathBuf>,
    /// More files or directories, as with `kubectl apply -f` (repeatable).
    #[arg(short = 'f', long = "filename")]
    pub filename: Vec<PathBuf>,
    /// Read the directories' subdirectories too.
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// Read Nodes and workloads from a cluster (the default kubeconfig without a path).
    #[arg(long, num_args = 0..=1, default_missing_value = "")]
    pub kubeconfig: Option<String>,
    /// The pool: Nodes with all these labels, `key=value[,key=value]`.
    #[arg(long)]
    pub pool_selector: Option<String>,
    /// The pool: these Nodes, `a,b`.
    #[arg(long)]
    pub pool_nodes: Option<String>,
    /// Write the manifests, one file per workload, to this directory (`-`: to stdout, and the
    /// report to stderr).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The report's format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Output,
}

impl PlanArgs {
    fn pool(&self) -> Result<PoolSelection> {
        match (&self.pool_selector, &self.pool_nodes) {
            (Some(s), None) => PoolSelection::selector(s),
            (None, Some(n)) => PoolSelection::nodes(n),
            _ => Err(Error::invalid(
                "plan needs one of --pool-selector and --pool-nodes",
            )),
        }
    }
}

/// The dump's objects, and with `--kubeconfig` the cluster's.
pub async fn load_plan_input(args: &PlanArgs) -> Result<Objects> {
    let inputs: Vec<PathBuf> = args.files.iter().chain(&args.filename).cloned().collect();
    if inputs.is_empty() && args.kubeconfig.is_none() {
        return Err(Error::invalid(
            "plan needs a dump (FILES or -f) or a cluster (--kubeconfig)",
        ));
    }
    let mut objs = Objects::default();
    input::load_paths_with(&inputs, args.recursive, &mut objs)?;
    if let Some(kc) = &args.kubeconfig {
        let list = live_list(kc).await?;
        input::load_str("the cluster (--kubeconfig)", &list.to_string(), &mut objs)?;
    }
    Ok(objs)
}

/// What `kubectl get nodes,pods,deploy,sts,ds,jobs,cronjobs -A` lists, as one List.
async fn live_list(kubeconfig: &str) -> Result<Value> {
    use k8s_openapi::api::{apps::v1 as apps, batch::v1 as batch, core::v1 as core};
    let client = live::client(kubeconfig).await?;
    let mut items = Vec::new();
    list::<core::Node>(&client, "Nodes", &mut items).await?;
    list::<core::Pod>(&client, "Pods", &mut items).await?;
    list::<apps::Deployment>(&client, "Deployments", &mut items).await?;
    list::<apps::StatefulSet>(&client, "StatefulSets", &mut items).await?;
    list::<apps::DaemonSet>(&client, "DaemonSets", &mut items).await?;
    list::<batch::Job>(&client, "Jobs", &mut items).await?;
    list::<batch::CronJob>(&client, "CronJobs", &mut items).await?;
    Ok(json!({ "apiVersion": "v1", "kind": "List", "items": items }))
}

async fn list<K>(client: &kube::Client, kind: &'static str, items: &mut Vec<Value>) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::all(client.clone());
    let listed = api
        .list(&ListParams::default())
        .await
        .map_err(|source| Error::List { kind, source })?;
    for o in listed.items {
        items.push(serde_json::to_value(&o)?);
    }
    Ok(())
}

pub async fn plan(args: PlanArgs) -> Result<()> {
    let pool = args.pool()?;
    let objs = load_plan_input(&args).await?;
    tell_user(&objs);
    let plan = make_plan(&objs, &pool)?;
    let report = match args.output {
        Output::Table => render_report(&plan),
        Output::Yaml => serde_yaml::to_string(&plan)?,
        Output::Json => format!("{}\n", serde_json::to_string_pretty(&plan)?),
    };
    match args.out.as_deref() {
        Some(p) if p.as_os_str() == "-" => {
            eprint!("{report}");
            emit(&all_manifests(&plan));
        }
        Some(dir) => {
            write_files(dir, &plan)?;
            emit(&report);
            eprintln!("wrote {} file(s) to {}", plan.files.len(), dir.display());
        }
        None => {
            emit(&report);
            eprintln!("(--out DIR writes the manifests, one file per workload; --out - to stdout)");
        }
    }
    match plan.unplaced() {
        0 => Ok(()),
        pending => Err(Error::Unschedulable {
            pending,
            pods: plan.pods.len(),
        }),
    }
}

/// Every file, one after another (each begins with its comment and `---`).
pub fn all_manifests(plan: &Plan) -> String {
    plan.files.iter().map(|f| f.text.as_str()).collect()
}

/// Writes the files to `dir`, refusing a directory that holds other manifests: `kubectl apply
/// -f DIR` would apply those too.
pub fn write_files(dir: &Path, plan: &Plan) -> Result<()> {
    let io = |what: String| move |source| Error::Io { what, source };
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let ours: Vec<&str> = plan.files.iter().map(|f| f.name.as_str()).collect();
    let others: Vec<String> = input::expand(&[dir.to_path_buf()], false)?
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(String::from))
        .filter(|n| !ours.contains(&n.as_str()))
        .collect();
    if !others.is_empty() {
        return Err(Error::invalid(format!(
            "--out {}: the directory holds other manifests ({}); use an empty one",
            dir.display(),
            others.join(", ")
        )));
    }
    for f in &plan.files {
        let path = dir.join(&f.name);
        std::fs::write(&path, &f.text).map_err(io(format!("writing {}", path.display())))?;
    }
    Ok(())
}
