//! gRPC over Unix sockets: stale sockets removed before binding, sockets removed on shutdown.
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use crate::Error;

/// Binds `path`, replacing a stale socket left by a crashed predecessor.
pub fn bind(path: &Path) -> Result<(UnixListenerStream, SocketGuard), Error> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io("creating the socket directory", dir, e))?;
    }
    crate::core::fsutil::remove_if_exists(path)
        .map_err(|e| Error::io("removing a stale socket", path, e))?;
    let listener = UnixListener::bind(path).map_err(|e| Error::io("binding", path, e))?;
    Ok((
        UnixListenerStream::new(listener),
        SocketGuard(path.to_path_buf()),
    ))
}

/// Removes the socket file when dropped, so the kubelet sees the plugin go away.
pub struct SocketGuard(PathBuf);

impl Drop for SocketGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
