//! The validating admission webhook for ResourceClaims and ResourceClaimTemplates: refuses an opaque
//! config of `gpu.nvidia.com` or `compute-domain.nvidia.com` the kubelet plugin would refuse at
//! prepare time, when it is applied rather than when a pod is stuck (docs/admission.md).
//!
//! Served by `dra-controller webhook`, or by `dra-controller run --webhook` beside the controllers;
//! every replica serves it, leader or not.
pub mod review;
pub mod server;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;

use tracing::info;

use crate::controller::{Error, Result};

#[derive(clap::Args, Debug, Clone)]
pub struct WebhookArgs {
    /// Address of the webhook's HTTPS endpoint (`POST /validate`, `GET /healthz`).
    #[arg(long, default_value = "0.0.0.0:9443")]
    pub webhook_addr: SocketAddr,
    /// PEM certificate chain the webhook serves; read again when it changes.
    #[arg(long, default_value = "/etc/gpu-dra-webhook/tls.crt")]
    pub webhook_cert_file: PathBuf,
    /// PEM private key of the certificate; read again when it changes.
    #[arg(long, default_value = "/etc/gpu-dra-webhook/tls.key")]
    pub webhook_key_file: PathBuf,
}

/// Loads the certificate, binds, and serves until `shutdown`. Returns once bound, with the
/// serving task's handle, so a caller knows the port is open (and which, for port 0).
pub async fn start(
    args: &WebhookArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, tokio::task::JoinHandle<Result<()>>)> {
    let reloader = tls::Reloader::load(tls::CertFiles {
        cert: args.webhook_cert_file.clone(),
        key: args.webhook_key_file.clone(),
    })
    .await?;
    let config = reloader.server_config()?;
    let listener = tokio::net::TcpListener::bind(args.webhook_addr)
        .await
        .map_err(Error::Webhook)?;
    let addr = listener.local_addr().map_err(Error::Webhook)?;
    info!(%addr, path = server::VALIDATE_PATH, "serving the admission webhook");
    let task = tokio::spawn(async move {
        let watch = tokio::spawn(reloader.watch());
        let served = server::serve(listener, config, shutdown).await;
        watch.abort();
        served.map_err(Error::Webhook)
    });
    Ok((addr, task))
}

/// `dra-controller webhook`: only the webhook, until SIGTERM or Ctrl-C.
pub async fn run(args: WebhookArgs) -> anyhow::Result<()> {
    let (_, task) = start(&args, crate::controller::shutdown_signal()).await?;
    task.await??;
    Ok(())
}
