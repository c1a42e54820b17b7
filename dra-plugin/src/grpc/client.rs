//! Minimal clients for our own sockets: the health check, tests and the benchmark use them.
use std::path::Path;

use hyper_util::rt::TokioIo;
use kubelet_proto::registration::{self, registration_client::RegistrationClient};
use tonic::transport::{Channel, Endpoint, Uri};

/// A gRPC channel over the Unix socket at `path`.
pub async fn unix_channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    Endpoint::try_from("http://localhost")?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(TokioIo::new)
            }
        }))
        .await
}

pub async fn get_info(path: &Path) -> anyhow::Result<registration::PluginInfo> {
    let channel = unix_channel(path).await?;
    let info = RegistrationClient::new(channel)
        .get_info(registration::InfoRequest {})
        .await?;
    Ok(info.into_inner())
}
