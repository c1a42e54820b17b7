//! The kubelet-facing sockets: DRA (v1, v1beta1, and health when given) and registration.
use std::sync::Arc;
use std::time::Duration;

use hyper_util::service::TowerToHyperService;
use kubelet_proto::registration::registration_server::RegistrationServer;
use tokio::sync::watch;
use tracing::{info, warn};

use super::shutdown::wait;
use crate::cli::RunArgs;
use crate::grpc::dra::DraService;
use crate::grpc::health::HealthService;
use crate::grpc::observe::{Observer, Socket};
use crate::grpc::registration::RegistrationService;
use crate::grpc::routes::DraRoutes;
use crate::grpc::server::SocketGuard;
use crate::kube::events::NodeEvents;
use crate::metrics::Metrics;
use dra_plugin_core::checkpoint::Checkpoint;

pub(super) struct KubeletServers {
    dra: tokio::task::JoinHandle<()>,
    registration: tokio::task::JoinHandle<()>,
    guards: (SocketGuard, SocketGuard),
    pub reg_path: std::path::PathBuf,
}

impl KubeletServers {
    /// Stops serving, then leaves the checkpoint's newest state where a previous version would
    /// look for it (no more calls can change it).
    pub async fn stop(self, checkpoint: &Checkpoint) {
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            let _ = self.dra.await;
            let _ = self.registration.await;
        })
        .await;
        if let Err(e) = checkpoint.settle().await {
            warn!(error = %e, "could not settle the checkpoint");
        }
        drop(self.guards);
        info!("stopped");
    }
}

/// `events`: where a refused registration is reported (none offline).
pub(super) fn serve_kubelet(
    args: &RunArgs,
    service: DraService,
    health: Option<HealthService>,
    metrics: &Arc<Metrics>,
    events: Option<Arc<dyn NodeEvents>>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<KubeletServers> {
    let driver = &args.device.driver_name;
    let uid = super::rolling::pod_uid(args.rolling_update_uid.as_deref())?;
    let (dra_file, reg_file) = super::rolling::socket_names(driver, uid);
    // The DRA socket first, then registration: the kubelet may call as soon as it sees us.
    let dra_path = std::path::absolute(args.plugin_dir.join(dra_file))?;
    let reg_path = args.registrar_dir.join(reg_file);
    let registration = RegistrationService::new(
        driver,
        &dra_path.to_string_lossy(),
        health.is_some(),
        metrics.clone(),
    )
    .with_events(events);
    let (dra_listener, dra_guard) = crate::grpc::server::bind(&dra_path)?;
    let dra = tokio::spawn(crate::grpc::server::serve(
        dra_listener,
        DraRoutes::new(service, health),
        Observer::new(Socket::Dra, metrics.clone()),
        wait(shutdown.clone()),
    ));
    let (reg_listener, reg_guard) = crate::grpc::server::bind(&reg_path)?;
    // One service on this socket: its generated server answers Unimplemented for anything else.
    let registration = tokio::spawn(crate::grpc::server::serve(
        reg_listener,
        TowerToHyperService::new(RegistrationServer::new(registration)),
        Observer::new(Socket::Registration, metrics.clone()),
        wait(shutdown),
    ));
    info!(dra = %dra_path.display(), registration = %reg_path.display(), "serving the kubelet");
    Ok(KubeletServers {
        dra,
        registration,
        guards: (dra_guard, reg_guard),
        reg_path,
    })
}
