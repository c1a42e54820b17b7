//! NVIDIA's own public manifests (dra-driver-nvidia-gpu v0.5.0: `demo/specs/**` and
//! `tests/bats/specs/*`), applied as whole files through the API server and run by stock kubelets,
//! must give NVIDIA's outcome: which pods run, which devices they get (type, count, distinct or
//! shared), the CDI devices each container reaches the runtime with, and which pods stay Pending
//! with the scheduler's reason. The files are read from the Go module cache (`e2e/run.sh` sets
//! `E2E_NVIDIA_DRIVER_DIR`), never copied into this repository.
//!
//! `bash e2e/run.sh nm1` (or `E2E_TEST_TARGETS="--test nvidia_manifests"`).
#[path = "nvidia_manifests/check.rs"]
mod check;
#[path = "vfio/fake_pci.rs"]
mod fake_pci;
#[path = "nvidia_manifests/setup.rs"]
mod setup;
#[path = "nvidia_manifests/table.rs"]
mod table;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use e2e::env::{Env, WAIT, wait_until, yaml_docs};
use e2e::env_or_skip;
use e2e::manifests::{self, WorkloadControllers};
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::Discovery;
use serde_json::json;
use setup::{Host, Setup};
use table::{Expect, Row};

/// Where the module's files are, or `None` (with the reason printed) outside CI.
fn module_dir() -> Result<Option<PathBuf>> {
    let dir = std::env::var_os("E2E_NVIDIA_DRIVER_DIR").map(PathBuf::from);
    match dir {
        Some(d) if d.join("tests/bats/specs").is_dir() => Ok(Some(d)),
        other => {
            let why = format!(
                "NVIDIA's driver module is not available (E2E_NVIDIA_DRIVER_DIR={other:?}); \
                 e2e/run.sh downloads sigs.k8s.io/dra-driver-nvidia-gpu@v0.5.0 through the Go module proxy"
            );
            if std::env::var("CI").as_deref() == Ok("true") {
                bail!(why);
            }
            println!("SKIP nm1: {why}");
            Ok(None)
        }
    }
}

/// Every file of the table, one node setup after the other (a plugin restart with other flags, as
/// `helm upgrade` does between NVIDIA's bats files), on two stock-kubelet nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nm1_nvidia_manifests_give_nvidias_outcome() -> Result<()> {
    let mut env = env_or_skip!("nm1_nvidia_manifests_give_nvidias_outcome");
    let Some(module) = module_dir()? else {
        return env.teardown().await;
    };
    let started = std::time::Instant::now();
    let rows = table::rows();
    table::check_complete(&module, &rows)?;
    cordon_foreign_nodes(&env).await?;
    let host = Host::create(&env.work)?;
    let mut controllers =
        WorkloadControllers::start(&env.kubeconfig, &env.work.join("nm1-controllers.log"))?;
    let discovery = Discovery::new(env.client.clone()).run().await?;
    let mut report = Vec::new();
    let mut failed = Vec::new();
    let mut current: Option<Setup> = None;
    for setup in Setup::ALL {
        let todo: Vec<&Row> = rows
            .iter()
            .filter(|r| r.setup == setup && r.expect.applies())
            .collect();
        if todo.is_empty() {
            continue;
        }
        setup::switch(&mut env, current, setup, &host).await?;
        current = Some(setup);
        let world = World {
            env: &env,
            discovery: &discovery,
            module: &module,
            types: check::device_types(&env.client).await?,
        };
        world
            .run_rows(setup, &todo, &mut controllers, &mut report, &mut failed)
            .await?;
        if setup == Setup::Vfio {
            host.check_pci().await?;
        }
    }
    for row in rows.iter().filter(|r| !r.expect.applies()) {
        report.push(check::not_applied(&discovery, &module, row)?);
    }
    println!(
        "nm1: NVIDIA manifests, {} rows in {:.0}s:\n  {}",
        rows.len(),
        started.elapsed().as_secs_f64(),
        report.join("\n  ")
    );
    if !failed.is_empty() {
        bail!("NVIDIA's outcome not met by {failed:?} (see the FAIL lines)");
    }
    env.teardown().await
}

/// What every row of one setup runs against.
struct World<'a> {
    env: &'a Env,
    discovery: &'a Discovery,
    module: &'a Path,
    types: check::DeviceTypes,
}

impl World<'_> {
    /// Runs the rows of `setup` one after the other, each in a namespace of its own; adds their
    /// report lines and the files of failed rows.
    async fn run_rows(
        &self,
        setup: Setup,
        rows: &[&Row],
        controllers: &mut WorkloadControllers,
        report: &mut Vec<String>,
        failed: &mut Vec<&'static str>,
    ) -> Result<()> {
        for (i, row) in rows.iter().enumerate() {
            controllers.check_alive()?;
            let ns = format!("nm-{}-{i}", setup.slug());
            let (line, ok) = self.run_row(row, &ns).await?;
            println!("nm1: {line}");
            report.push(line);
            if !ok {
                failed.push(row.files);
            }
        }
        Ok(())
    }

    /// Runs one row in namespace `ns` and waits until the nodes are clean again; returns its
    /// report line and whether NVIDIA's outcome was met. Only a failure to clean up ends the test
    /// (later rows would see its leftovers).
    async fn run_row(&self, row: &Row, ns: &str) -> Result<(String, bool)> {
        let t0 = std::time::Instant::now();
        let outcome = self.apply_and_check(row, ns).await;
        cleanup(self.env, ns).await?;
        let secs = t0.elapsed().as_secs_f64();
        Ok(match outcome {
            Ok(got) => (
                format!(
                    "pass      {:<55} {}: {got} ({secs:.0}s)",
                    row.files, row.why
                ),
                true,
            ),
            Err(e) => (format!("FAIL      {:<55} {e:#}", row.files), false),
        })
    }

    /// Applies the row's files into `ns` (for documents without a namespace, like
    /// `kubectl apply -n`), checks the outcome, deletes what was applied. Returns a short
    /// description of what it saw.
    async fn apply_and_check(&self, row: &Row, ns: &str) -> Result<String> {
        let env = self.env;
        let nss: Api<Namespace> = Api::all(env.client.clone());
        let namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        nss.create(&PostParams::default(), &namespace).await?;
        let docs = file_docs(self.module, row)?;
        let applied = manifests::apply_docs(&env.client, self.discovery, &docs, ns).await;
        let result = check::outcome(env, &applied, ns, &row.expect, &self.types).await;
        // Deleted whatever the outcome, so that the next row starts from clean nodes.
        let deleted = manifests::delete_applied(&env.client, &applied).await;
        let namespaces = applied.namespaces(ns);
        wait_namespaces_gone(env, &namespaces).await?;
        deleted?;
        result
    }
}

/// Every document of the row's files, in order.
fn file_docs(module: &Path, row: &Row) -> Result<Vec<serde_json::Value>> {
    let mut docs = Vec::new();
    for (file, copies) in row.file_list() {
        let text = std::fs::read_to_string(module.join(file))
            .with_context(|| format!("reading {file}"))?;
        let text = row
            .vars
            .iter()
            .fold(text, |t, (k, v)| t.replace(&format!("${{{k}}}"), v));
        for i in 0..copies {
            // test_gpu_stress.bats renders its pod template with sed, one __INDEX__ per pod.
            docs.extend(yaml_docs(&text.replace("__INDEX__", &i.to_string()))?);
        }
    }
    Ok(docs)
}

async fn wait_namespaces_gone(env: &Env, names: &[String]) -> Result<()> {
    let nss: Api<Namespace> = Api::all(env.client.clone());
    for n in names {
        match nss.delete(n, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    wait_until("the file's namespaces deleted", WAIT, || async {
        for n in names {
            if nss.get_opt(n).await?.is_some() {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await
}

/// After a file: no claim left prepared in any kubelet, no CDI spec left, no runtime refusal.
async fn cleanup(env: &Env, ns: &str) -> Result<()> {
    wait_until(
        &format!("{ns}: nothing prepared, no CDI spec"),
        WAIT,
        || async {
            for n in &env.nodes {
                let prepared = n.kubelet.prepared()?;
                if !prepared.is_empty() {
                    bail!("{}: claims still prepared: {:?}", n.name, prepared.keys());
                }
                let files = e2e::cdi::spec_files(&n.dirs.cdi)?;
                if !files.is_empty() {
                    bail!("{}: CDI spec files left: {files:?}", n.name);
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    env.check_violations()
}

/// Nodes of scenarios that failed earlier on this cluster would take this test's pods (its files
/// have no node selectors): cordon them.
async fn cordon_foreign_nodes(env: &Env) -> Result<()> {
    let nodes: Api<Node> = Api::all(env.client.clone());
    for n in nodes.list(&ListParams::default()).await?.items {
        if n.labels().get("e2e-test") != Some(&env.test) {
            println!(
                "nm1: cordoning {} (left over from another scenario)",
                n.name_any()
            );
            let patch = Patch::Merge(json!({"spec": {"unschedulable": true}}));
            nodes
                .patch(&n.name_any(), &PatchParams::default(), &patch)
                .await?;
        }
    }
    Ok(())
}

impl Expect {
    /// Whether the row's files are applied (the others are listed with their reason).
    fn applies(&self) -> bool {
        !matches!(self, Expect::Unserved(_) | Expect::Listed(_))
    }
}
