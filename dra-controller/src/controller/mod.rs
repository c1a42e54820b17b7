//! The cluster controller: GPUCluster (DeviceClasses, kubelet plugin, RBAC, VAP, migration pool) and
//! ComputeDomains, behind leader election, with metrics and health endpoints.
pub mod apply;
pub mod cdclique;
pub mod computedomain;
pub mod conflict;
pub mod crd;
pub mod dcgm;
pub mod deviceclasses;
pub mod error;
pub mod gpucluster;
pub mod http;
pub mod labels;
pub mod leader;
pub mod memory;
pub mod metrics;
pub mod migshaper;
pub mod pages;
pub mod pool;
pub mod render;
pub mod status;

pub use error::{Error, Result};

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use futures::{FutureExt, StreamExt};
use gpu_dra_api::miglayout::MigLayout;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client};
use tracing::{debug, info, warn};

use crd::{ComputeDomain, GPU_CLUSTER_NAME, GPUCluster};

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Namespace of the driver's DaemonSets, Deployments, ServiceAccounts and Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "gpu-dra-driver")]
    pub namespace: String,
    /// Name of the Lease used for leader election.
    #[arg(long, default_value = "gpu-dra-controller")]
    pub lease_name: String,
    /// This replica's identity in the Lease.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Seconds a lease stays valid without renewal.
    #[arg(long, default_value_t = 15)]
    pub lease_duration_secs: u64,
    /// Controllers to run in this process (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "gpucluster")]
    pub controllers: Vec<ControllerKind>,
    /// Image of the per-ComputeDomain IMEX daemon pods.
    #[arg(long, env = "DAEMON_IMAGE", default_value_t = format!("{}/{}:{}", render::DEFAULT_REPOSITORY, render::DEFAULT_IMAGE, render::DEFAULT_VERSION))]
    pub daemon_image: String,
    /// Command of the IMEX daemon container (comma-separated). The default keeps NVIDIA's
    /// `nvidia-imex` running on the config the compute-domain kubelet plugin writes when it prepares
    /// the daemon device, and signals it when the plugin updates the daemons' hosts file.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "dra-plugin,imex-daemon,run"
    )]
    pub daemon_command: Vec<String>,
    /// The daemon container's probe command (comma-separated; empty: no probes). The default
    /// succeeds once `nvidia-imex-ctl -q` answers READY.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "dra-plugin,imex-daemon,check"
    )]
    pub daemon_check_command: Vec<String>,
    /// NVIDIA's driver feature gates (`Name=bool,...`); the ComputeDomain controller reads
    /// `ComputeDomainCliques` and `IMEXDaemonsWithDNSNames`.
    #[arg(long, env = "FEATURE_GATES", default_value = "")]
    pub feature_gates: String,
    /// Address of the `/metrics`, `/healthz` and `/readyz` endpoint.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// `-v` of the components this controller deploys (kubelet plugins, ComputeDomain
    /// controller), given to them as LOG_VERBOSITY; a component's `env` in the GPUCluster wins.
    #[arg(long, env = "COMPONENTS_LOG_VERBOSITY", value_name = "N")]
    pub components_log_verbosity: Option<u32>,
    /// `--logging-format` of the components this controller deploys, as LOGGING_FORMAT.
    #[arg(
        long,
        env = "COMPONENTS_LOGGING_FORMAT",
        value_enum,
        value_name = "FORMAT"
    )]
    pub components_logging_format: Option<gpu_dra_log::Format>,
    /// Also serve the ResourceClaim admission webhook (the `--webhook-*` options), on every
    /// replica, leader or not.
    #[arg(long)]
    pub webhook: bool,
    #[command(flatten)]
    pub webhook_args: crate::webhook::WebhookArgs,
}

impl RunArgs {
    /// The logging variables of the components this controller deploys.
    pub fn components_log_env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if let Some(v) = self.components_log_verbosity {
            env.push((gpu_dra_log::VERBOSITY_ENV, v.to_string()));
        }
        if let Some(f) = self.components_logging_format {
            env.push((gpu_dra_log::FORMAT_ENV, f.as_str().to_string()));
        }
        env
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControllerKind {
    /// GPUCluster: DeviceClasses, kubelet plugin, RBAC, VAP, migration pool, on-demand MIG shaper.
    Gpucluster,
    /// ComputeDomain: workload and daemon ResourceClaimTemplates, daemon DaemonSets, status.
    Computedomain,
}

/// Run until SIGTERM or Ctrl-C: serve the admin endpoint, win the lease, reconcile, release the lease.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    memory::no_huge_pages();
    let client = Client::try_default()
        .await
        .context("building a Kubernetes client")?;
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(metrics::Metrics::new(&mut registry));
    let admin = Arc::new(http::AdminState {
        registry,
        ready: AtomicBool::new(false),
    });
    let shutdown = shutdown_signal().shared();
    let server = tokio::spawn(http::serve(
        args.metrics_addr,
        admin.clone(),
        shutdown.clone(),
    ));
    let webhook = if args.webhook {
        Some(
            crate::webhook::start(&args.webhook_args, shutdown.clone())
                .await?
                .1,
        )
    } else {
        None
    };

    let identity = match args.identity.clone() {
        Some(id) => id,
        None => format!(
            "{}-{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "dra-controller".into()),
            std::process::id()
        ),
    };
    let lock = leader::LeaseLock {
        api: Api::<Lease>::namespaced(client.clone(), &args.namespace),
        name: args.lease_name.clone(),
        identity,
        duration: Duration::from_secs(args.lease_duration_secs),
    };
    admin.ready.store(true, Ordering::Relaxed);
    let retry = lock.duration / 3;
    info!(lease = %lock.name, identity = %lock.identity, "waiting for leadership");
    loop {
        match lock.try_acquire().await {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => warn!(error = %e, "lease attempt failed"),
        }
        tokio::select! {
            _ = shutdown.clone() => return Ok(()),
            _ = tokio::time::sleep(retry) => {}
        }
    }
    metrics.leader.set(1);
    info!("leading; starting controllers");

    let mut controllers: Vec<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>> = Vec::new();
    if args.controllers.contains(&ControllerKind::Gpucluster) {
        let ctx = Arc::new(gpucluster::Ctx {
            client: client.clone(),
            namespace: args.namespace.clone(),
            metrics: metrics.clone(),
            log_env: args.components_log_env(),
        });
        controllers.push(Box::pin(gpucluster_controller(
            client.clone(),
            ctx,
            shutdown.clone(),
        )));
        let shaper = Arc::new(migshaper::run::Ctx {
            client: client.clone(),
            metrics: metrics.clone(),
            memory: Default::default(),
        });
        controllers.push(Box::pin(migshaper::gate::run(
            client.clone(),
            shaper,
            shutdown.clone(),
            migshaper_controller,
        )));
    }
    if args.controllers.contains(&ControllerKind::Computedomain) {
        let gates = gpu_dra_api::gates::FeatureGates::parse(&args.feature_gates)?;
        for n in gates.without_effect(gpu_dra_api::gates::Component::ComputeDomainController) {
            warn!(gate = n.gate, value = n.value, "{n}");
        }
        let ctx = Arc::new(computedomain::Ctx {
            cliques: gates.enabled("ComputeDomainCliques"),
            client: client.clone(),
            namespace: args.namespace.clone(),
            daemon: computedomain::DaemonImage {
                image: args.daemon_image.clone(),
                command: args.daemon_command.clone(),
                check: args.daemon_check_command.clone(),
            },
            metrics: metrics.clone(),
        });
        controllers.push(Box::pin(computedomain_controller(
            client.clone(),
            ctx,
            shutdown.clone(),
        )));
    }
    let controllers = futures::future::join_all(controllers);
    let renew = async {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(retry).await;
            match lock.try_acquire().await {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                Ok(false) => return anyhow::anyhow!("lost the lease to another replica"),
                Err(e) => warn!(error = %e, "lease renewal failed"),
            }
            if last_ok.elapsed() > lock.duration {
                return anyhow::anyhow!("could not renew the lease within {:?}", lock.duration);
            }
        }
    };
    let result = tokio::select! {
        _ = controllers => Ok(()),
        lost = renew => Err(lost),
    };
    if let Err(e) = lock.release().await {
        warn!(error = %e, "releasing the lease failed");
    }
    server.abort();
    if let Some(w) = webhook {
        w.abort();
    }
    result
}

/// A watch's objects as metadata only, for watches whose mappers read nothing else: kube asks the
/// API server for `PartialObjectMetadata`, so neither it nor the controller handles the spec and
/// status of the Nodes, Pods, claims and slices behind them.
type Meta<K> = PartialObjectMeta<K>;

fn gpucluster_controller(
    client: Client,
    ctx: Arc<gpucluster::Ctx>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Future<Output = ()> {
    let ns = ctx.namespace.clone();
    let ours =
        watcher::Config::default().labels(&format!("{}={}", labels::PART_OF.0, labels::PART_OF.1));
    let all = watcher::Config::default;
    Controller::new(Api::<GPUCluster>::all(client.clone()), all())
        .watches(
            Api::<Meta<DeviceClass>>::all(client.clone()),
            ours.clone(),
            singleton,
        )
        .watches(
            Api::<Meta<DaemonSet>>::namespaced(client.clone(), &ns),
            ours.clone(),
            singleton,
        )
        .watches(
            Api::<Meta<Pod>>::namespaced(client.clone(), &ns),
            ours,
            singleton,
        )
        .watches(Api::<Meta<Node>>::all(client.clone()), all(), singleton)
        .watches(Api::<Meta<ResourceClaim>>::all(client), all(), singleton)
        .with_config(ControllerConfig::default().debounce(Duration::from_secs(1)))
        .graceful_shutdown_on(shutdown)
        .run(gpucluster::reconcile, gpucluster::error_policy, ctx)
        .for_each(|res| async move { log_outcome("gpucluster", res) })
}

/// The on-demand MIG shaper: one pass over the pool for any change of demand or geometry. It runs
/// only while the GPUCluster enables on-demand MIG ([`migshaper::gate`]).
fn migshaper_controller<S>(
    client: Client,
    ctx: Arc<migshaper::run::Ctx>,
    off: migshaper::gate::ModeOff<S>,
) -> impl Future<Output = ()>
where
    S: Future<Output = ()> + Send + Sync + Unpin + 'static,
{
    let all = watcher::Config::default;
    Controller::new(Api::<GPUCluster>::all(client.clone()), all())
        .watches(Api::<Meta<Pod>>::all(client.clone()), all(), singleton)
        .watches(
            Api::<Meta<ResourceClaim>>::all(client.clone()),
            all(),
            singleton,
        )
        .watches(
            Api::<Meta<ResourceSlice>>::all(client.clone()),
            all(),
            singleton,
        )
        .watches(Api::<Meta<MigLayout>>::all(client), all(), singleton)
        .graceful_shutdown_on(off.wait())
        .run(migshaper::run::reconcile, migshaper::run::error_policy, ctx)
        .for_each(|res| async move { log_outcome("migshaper", res) })
}

fn computedomain_controller(
    client: Client,
    ctx: Arc<computedomain::Ctx>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Future<Output = ()> {
    let ns = ctx.namespace.clone();
    let daemons = watcher::Config::default().labels(&format!(
        "{}={}",
        labels::COMPONENT,
        gpucluster::CD_DAEMON_COMPONENT
    ));
    let workload =
        watcher::Config::default().labels(&format!("{}={}", labels::PART_OF.0, labels::PART_OF.1));
    Controller::new(
        Api::<ComputeDomain>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(
        Api::<Meta<ResourceClaimTemplate>>::all(client.clone()),
        workload,
    )
    .watches(
        Api::<Meta<DaemonSet>>::namespaced(client.clone(), &ns),
        daemons.clone(),
        |ds| computedomain::domain_of(&ds),
    )
    .watches(Api::<Meta<Pod>>::namespaced(client, &ns), daemons, |pod| {
        computedomain::domain_of(&pod)
    })
    .with_config(ControllerConfig::default().debounce(Duration::from_secs(1)))
    .graceful_shutdown_on(shutdown)
    .run(computedomain::reconcile, computedomain::error_policy, ctx)
    .for_each(|res| async move { log_outcome("computedomain", res) })
}

/// A reconcile's failure at WARN, except a request for an object not in the local store: the
/// watches of the GPUCluster controller map every Node, Pod and claim event to the singleton,
/// which before the GPUCluster exists (and after it is deleted) is simply absent, and a deleted
/// ComputeDomain's children trigger one last request too. Nothing to do then, so debug only.
fn log_outcome<T, E: std::error::Error, Q: std::error::Error>(
    controller: &'static str,
    res: Result<T, kube::runtime::controller::Error<E, Q>>,
) {
    use kube::runtime::controller::Error as CtrlError;
    match res {
        Ok(_) => {}
        Err(CtrlError::ObjectNotFound(obj)) => {
            debug!(controller, object = %obj, "nothing to reconcile: the object is not (or no longer) there")
        }
        Err(e) => warn!(controller, error = %e, "reconcile failed"),
    }
}

/// Every watched object concerns the one GPUCluster.
fn singleton<T>(_: T) -> Option<ObjectRef<GPUCluster>> {
    Some(ObjectRef::new(GPU_CLUSTER_NAME))
}

pub(crate) async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
    info!("shutting down");
}

/// `dra-controller crdgen`: the CRDs as generated from the Rust types, on stdout.
pub fn crdgen() -> anyhow::Result<()> {
    use std::io::Write as _;
    let yaml = crd::crds_yaml().context("serialising the CRDs")?;
    std::io::stdout()
        .write_all(yaml.as_bytes())
        .context("writing the CRDs")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use kube::runtime::controller::Error as CtrlError;

    use super::*;

    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What `log_outcome` writes for `res` at the default verbosity.
    fn logged(res: Result<(), CtrlError<std::io::Error, std::io::Error>>) -> String {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        let config = gpu_dra_log::Config {
            verbosity: 0,
            format: gpu_dra_log::Format::Text,
            filter: None,
            colour: false,
        };
        let sub = gpu_dra_log::subscriber(&config, move || Sink(sink.clone())).unwrap();
        tracing::subscriber::with_default(sub, || log_outcome("gpucluster", res));
        String::from_utf8(buf.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn an_object_not_in_the_store_is_quiet_and_a_failed_reconcile_warns() {
        let missing = ObjectRef::<GPUCluster>::new(GPU_CLUSTER_NAME).erase();
        assert_eq!(
            logged(Err(CtrlError::ObjectNotFound(Box::new(missing)))),
            ""
        );
        let failed = CtrlError::ReconcilerFailed(
            std::io::Error::other("apply refused"),
            Box::new(ObjectRef::<GPUCluster>::new(GPU_CLUSTER_NAME).erase()),
        );
        let out = logged(Err(failed));
        assert!(
            out.contains("WARN") && out.contains("apply refused"),
            "{out}"
        );
    }
}
