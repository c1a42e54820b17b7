//! gRPC over Unix sockets: stale sockets removed before binding, HTTP/2 served with hyper
//! directly, open calls finished on shutdown, sockets removed after.
use std::convert::Infallible;
use std::path::{Path, PathBuf};

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tracing::warn;

use crate::Error;
use crate::grpc::authority::{AuthorityFix, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE};
use crate::grpc::observe::{ConnectionWatch, Observer};

/// Binds `path`, replacing a stale socket left by a crashed predecessor.
pub fn bind(path: &Path) -> Result<(UnixListener, SocketGuard), Error> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io("creating the socket directory", dir, e))?;
    }
    dra_plugin_core::fsutil::remove_if_exists(path)
        .map_err(|e| Error::io("removing a stale socket", path, e))?;
    let listener = UnixListener::bind(path).map_err(|e| Error::io("binding", path, e))?;
    Ok((listener, SocketGuard(path.to_path_buf())))
}

/// Removes the socket file when dropped, so the kubelet sees the plugin go away.
pub struct SocketGuard(PathBuf);

impl Drop for SocketGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Serves gRPC on `listener` until `shutdown` completes; then stops accepting, sends every
/// connection a GOAWAY and returns once their open calls have finished. `observer` logs and
/// counts failed calls and broken connections.
///
/// hyper's HTTP/2 server rather than tonic's `Server`: the kubelet speaks only HTTP/2 (prior
/// knowledge) on these sockets, and tonic's protocol detection, tower layers and axum routing
/// cost 5-7% of a prepare/unprepare pair's CPU in the benchmark. HTTP/2 settings are hyper's
/// defaults, which are also what tonic's `Server` uses unless told otherwise. Every connection
/// reads through [`AuthorityFix`], so grpc-go clients that dial a bare socket path (the kubelet's
/// plugin watcher) are served.
pub async fn serve<S>(
    listener: UnixListener,
    service: S,
    observer: Observer,
    shutdown: impl Future<Output = ()>,
) where
    S: hyper::service::Service<
            http::Request<Incoming>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let (stop, stopping) = watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let (service, ending) = observer.connection(service.clone());
                    connections.spawn(connection(stream, service, ending, stopping.clone()));
                }
                // Out of file descriptors, most likely: a pause lets calls in flight free some.
                Err(e) => {
                    warn!(socket = observer.socket().label(), error = %e, "accepting a connection");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let _ = stop.send(true);
    while connections.join_next().await.is_some() {}
}

async fn connection<S>(
    stream: UnixStream,
    service: S,
    ending: ConnectionWatch,
    mut stopping: watch::Receiver<bool>,
) where
    S: hyper::service::Service<
            http::Request<Incoming>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + Send
        + 'static,
    S::Future: Send + 'static,
{
    let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .max_frame_size(MAX_FRAME_SIZE)
        .max_header_list_size(MAX_HEADER_LIST_SIZE)
        .serve_connection(TokioIo::new(AuthorityFix::new(stream)), service);
    tokio::pin!(conn);
    let done = tokio::select! {
        done = conn.as_mut() => done,
        // Err (the sender gone) means the server is done too.
        () = async { drop(stopping.wait_for(|stop| *stop).await) } => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = done {
        ending.ended(&e);
    }
}
