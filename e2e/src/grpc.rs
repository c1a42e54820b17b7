//! gRPC channels over Unix sockets, the transport the kubelet uses for plugins.
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tower::service_fn;

/// The kubelet's per-call timeout for DRA calls.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(45);

/// A channel that dials `path` on first use and again after every broken connection, so it
/// survives a plugin restart that recreates the socket.
pub fn uds_channel(path: &Path) -> Channel {
    let path: PathBuf = path.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(5))
        .timeout(CALL_TIMEOUT)
        .connect_with_connector_lazy(service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
}
