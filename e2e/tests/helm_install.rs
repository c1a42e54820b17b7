//! The Helm chart (`deploy/helm/gpu-dra-driver`) with the real `helm` (built from its Go module by
//! `deploy/helm/build-helm.sh`) against the real control plane: `helm lint`, `helm template` (every
//! kind served by the API server), `helm install` (every object accepted, the controller
//! Deployment's pods Running through a stock kubelet: the fake runtime "runs" any image without
//! pulling and executes nothing), `helm upgrade` with changed values, `helm uninstall` (every object
//! gone, the CRDs kept as Helm keeps them).
//!
//! `E2E_TEST_TARGETS="--test helm_install" bash e2e/run.sh`.
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result, bail, ensure};
use e2e::env::{Env, WAIT, wait_until, yaml_docs};
use e2e::env_or_skip;
use e2e::manifests::{self, WorkloadControllers};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams};
use kube::discovery::{Discovery, Scope};
use serde_json::Value;
use tokio::process::Command;

const TEST: &str = "hm1_helm_lint_template_install_upgrade_uninstall";
const NODE: &str = "hm1-a";
const RELEASE: &str = "gpu-dra";
const CONTROLLER: &str = "gpu-dra-controller";
/// Every kind the chart may render (with or without the webhook, cert-manager, the GPUCluster).
const KNOWN_KINDS: [&str; 13] = [
    "CustomResourceDefinition",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "Deployment",
    "Service",
    "GPUCluster",
    "ValidatingWebhookConfiguration",
    "Certificate",
    "Issuer",
    "Secret",
];

/// The helm binary: `E2E_HELM_BIN` (set by e2e/run.sh), or what `deploy/helm/build-helm.sh`
/// builds or finds cached.
async fn helm_bin(repo: &Path) -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("E2E_HELM_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let script = repo.join("deploy/helm/build-helm.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .await
        .with_context(|| format!("running {}", script.display()))?;
    ensure!(
        out.status.success(),
        "{} failed ({})",
        script.display(),
        out.status
    );
    let stdout = String::from_utf8(out.stdout)?;
    let bin = PathBuf::from(
        stdout
            .lines()
            .last()
            .context("build-helm.sh printed no path")?,
    );
    ensure!(
        bin.exists(),
        "build-helm.sh printed {}, which does not exist",
        bin.display()
    );
    Ok(bin)
}

/// Runs helm with its cache, config and data under the test's work dir and the test cluster's
/// kubeconfig; stdout when it exits 0.
struct Helm {
    bin: PathBuf,
    home: PathBuf,
    kubeconfig: PathBuf,
    chart: PathBuf,
    ns: String,
}

impl Helm {
    async fn run(&self, args: &[&str]) -> Result<String> {
        let mut cmd = Command::new(&self.bin);
        for (var, dir) in [
            ("HELM_CACHE_HOME", "cache"),
            ("HELM_CONFIG_HOME", "config"),
            ("HELM_DATA_HOME", "data"),
        ] {
            cmd.env(var, self.home.join(dir));
        }
        cmd.env("KUBECONFIG", &self.kubeconfig).args(args);
        let out = cmd.output().await.context("running helm")?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "helm {args:?} failed ({}):\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(stdout)
    }

    fn chart(&self) -> &str {
        self.chart.to_str().expect("utf-8 chart path")
    }

    /// `helm status -o json`: (status, revision).
    async fn status(&self) -> Result<(String, u64)> {
        let out = self
            .run(&["status", RELEASE, "--namespace", &self.ns, "-o", "json"])
            .await?;
        let v: Value = serde_json::from_str(&out).context("helm status -o json")?;
        Ok((
            v["info"]["status"].as_str().unwrap_or("?").to_string(),
            v["version"].as_u64().unwrap_or(0),
        ))
    }

    /// The release's objects, as `helm get manifest` lists them.
    async fn manifest(&self) -> Result<Vec<Value>> {
        let out = self
            .run(&["get", "manifest", RELEASE, "--namespace", &self.ns])
            .await?;
        yaml_docs(&out)
    }
}

fn kind_name(doc: &Value) -> String {
    format!(
        "{}/{}",
        doc["kind"].as_str().unwrap_or("?"),
        doc["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// The dynamic API of one rendered object (its namespace: the document's, else `ns` when the kind
/// is namespaced).
fn api_of(env: &Env, discovery: &Discovery, doc: &Value) -> Result<(Api<DynamicObject>, String)> {
    let api_version = doc["apiVersion"].as_str().context("no apiVersion")?;
    let kind = doc["kind"].as_str().context("no kind")?;
    let name = doc["metadata"]["name"].as_str().context("no name")?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let (ar, caps) = discovery
        .resolve_gvk(&GroupVersionKind::gvk(group, version, kind))
        .with_context(|| format!("the API server does not serve {api_version} {kind}"))?;
    let api = if caps.scope == Scope::Namespaced {
        let ns = doc["metadata"]["namespace"].as_str().unwrap_or(&env.ns);
        Api::namespaced_with(env.client.clone(), ns, &ar)
    } else {
        Api::all_with(env.client.clone(), &ar)
    };
    Ok((api, name.to_string()))
}

/// The controller pods, with the value of their container's `LOG_VERBOSITY`.
async fn controller_pods(pods: &Api<Pod>) -> Result<Vec<(Pod, Option<String>)>> {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/name={CONTROLLER}"));
    Ok(pods
        .list(&lp)
        .await?
        .items
        .into_iter()
        .map(|p| {
            let v = p.spec.as_ref().and_then(|s| {
                s.containers[0]
                    .env
                    .iter()
                    .flatten()
                    .find(|e| e.name == "LOG_VERBOSITY")
                    .and_then(|e| e.value.clone())
            });
            (p, v)
        })
        .collect())
}

fn running_on_node(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hm1_helm_lint_template_install_upgrade_uninstall() -> Result<()> {
    let mut env = env_or_skip!(TEST);
    let helm = Helm {
        bin: helm_bin(&env.repo).await?,
        home: env.work.join("hm1-helm"),
        kubeconfig: env.kubeconfig.clone(),
        chart: env.repo.join("deploy/helm/gpu-dra-driver"),
        ns: env.ns.clone(),
    };
    let version = helm.run(&["version", "--template", "{{.Version}}"]).await?;
    println!("hm1: {} {version}", helm.bin.display());

    // lint, with the defaults and with the GPUCluster.
    for extra in [&[][..], &["--set", "gpuCluster.deployCR=true"][..]] {
        let mut args = vec!["lint", helm.chart(), "--strict"];
        args.extend_from_slice(extra);
        let out = helm.run(&args).await?;
        ensure!(
            out.contains("0 chart(s) failed"),
            "helm lint {extra:?}:\n{out}"
        );
    }
    println!("hm1: helm lint --strict passed");

    // The values of the install: the controller on this test's node, any image (nothing pulls).
    let node_selector = format!("controller.nodeSelector.e2e-test={TEST}");
    let values = [
        "--set",
        "gpuCluster.deployCR=true",
        "--set",
        "image.repository=example.invalid/e2e",
        "--set",
        "image.tag=h1",
        "--set",
        &node_selector,
    ];
    let mut args = vec!["template", RELEASE, helm.chart(), "--namespace", &env.ns];
    args.push("--include-crds");
    args.extend_from_slice(&values);
    let rendered = yaml_docs(&helm.run(&args).await?)?;
    let unknown: Vec<String> = rendered
        .iter()
        .filter(|d| {
            d["apiVersion"].as_str().is_none()
                || !KNOWN_KINDS.contains(&d["kind"].as_str().unwrap_or(""))
        })
        .map(kind_name)
        .collect();
    ensure!(
        unknown.is_empty(),
        "helm template rendered unknown kinds: {unknown:?}"
    );
    let mut names: Vec<String> = rendered.iter().map(kind_name).collect();
    names.sort();
    println!("hm1: helm template: {}", names.join(", "));
    for want in ["Deployment/gpu-dra-controller", "GPUCluster/gpu-cluster"] {
        ensure!(
            names.iter().any(|n| n == want),
            "{want} not rendered: {names:?}"
        );
    }

    // install: a stock-kubelet node for the controller pods, and the workload controllers that
    // turn the Deployment into pods.
    env.add_node(NODE, &["--profile", "h100-80gb:1"]).await?;
    // A RefCell: the waits below check, each round, that it is still alive.
    let controllers = std::cell::RefCell::new(WorkloadControllers::start(
        &env.kubeconfig,
        &env.work.join("hm1-controllers.log"),
    )?);
    let mut args = vec!["install", RELEASE, helm.chart(), "--namespace", &env.ns];
    args.extend_from_slice(&values);
    helm.run(&args).await?;
    let (status, revision) = helm.status().await?;
    ensure!(
        status == "deployed" && revision == 1,
        "after install: status {status}, revision {revision}"
    );
    let discovery = Discovery::new(env.client.clone()).run().await?;
    let unserved = manifests::unserved(&discovery, &rendered);
    ensure!(
        unserved.is_empty(),
        "kinds the API server does not serve: {unserved:?}"
    );
    let objects = helm.manifest().await?;
    ensure!(!objects.is_empty(), "helm get manifest listed no objects");
    for doc in &objects {
        let (api, name) = api_of(&env, &discovery, doc)?;
        ensure!(
            api.get_opt(&name).await?.is_some(),
            "{} of the release is not in the API server",
            kind_name(doc)
        );
    }
    let crds: Vec<String> = rendered
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .filter_map(|d| d["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    let crd_api: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    for crd in &crds {
        ensure!(
            crd_api.get_opt(crd).await?.is_some(),
            "CRD {crd} not installed"
        );
    }
    println!(
        "hm1: helm install: deployed, {} objects in the API server, CRDs {crds:?}",
        objects.len()
    );

    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    let replicas = wait_until(
        "2 controller pods Running on the stock kubelet",
        WAIT,
        || async {
            controllers.borrow_mut().check_alive()?;
            let ps = controller_pods(&pods).await?;
            Ok((ps.len() == 2 && ps.iter().all(|(p, _)| running_on_node(p))).then_some(ps.len()))
        },
    )
    .await?;
    println!("hm1: {replicas} controller pods Running on {NODE} through the kubelet");

    // upgrade: one replica, verbosity 4 (a new pod template, so a new ReplicaSet).
    let mut args = vec!["upgrade", RELEASE, helm.chart(), "--namespace", &env.ns];
    args.extend_from_slice(&["--reuse-values", "--set", "controller.replicas=1"]);
    args.extend_from_slice(&["--set", "logVerbosity=4"]);
    helm.run(&args).await?;
    let (status, revision) = helm.status().await?;
    ensure!(
        status == "deployed" && revision == 2,
        "after upgrade: status {status}, revision {revision}"
    );
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
    let dep = deployments.get(CONTROLLER).await?;
    let spec = &dep.spec;
    ensure!(
        spec.replicas == Some(1),
        "replicas after upgrade: {:?}",
        spec.replicas
    );
    // The fake runtime serves no probe, so no pod is ever Ready and the rollout keeps an old pod:
    // the new template's pod running is what the upgrade can show here.
    wait_until("the upgraded controller pod Running", WAIT, || async {
        controllers.borrow_mut().check_alive()?;
        let ps = controller_pods(&pods).await?;
        Ok(ps
            .iter()
            .any(|(p, v)| v.as_deref() == Some("4") && running_on_node(p))
            .then_some(()))
    })
    .await?;
    println!("hm1: helm upgrade: revision 2, replicas 1, a LOG_VERBOSITY=4 pod Running");

    // uninstall: every object of the release gone, the pods with them, the CRDs kept.
    let objects = helm.manifest().await?;
    helm.run(&["uninstall", RELEASE, "--namespace", &env.ns])
        .await?;
    for doc in &objects {
        let (api, name) = api_of(&env, &discovery, doc)?;
        wait_until(&format!("{} deleted", kind_name(doc)), WAIT, || async {
            Ok(api.get_opt(&name).await?.is_none().then_some(()))
        })
        .await?;
    }
    wait_until("the controller pods deleted", WAIT, || async {
        Ok(controller_pods(&pods).await?.is_empty().then_some(()))
    })
    .await?;
    for crd in &crds {
        ensure!(
            crd_api.get_opt(crd).await?.is_some(),
            "CRD {crd} deleted by helm uninstall"
        );
    }
    ensure!(
        helm.status().await.is_err(),
        "helm status still finds the release after uninstall"
    );
    println!(
        "hm1: helm uninstall: {} objects and the pods gone, CRDs kept",
        objects.len()
    );
    drop(controllers);
    env.teardown().await
}
