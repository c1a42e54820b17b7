//! The core's error type. It names no Kubernetes or gRPC failure; the plugin crate maps each
//! variant to what the kubelet is told and to a bounded metric label.
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Model(#[from] gpu_dra_api::Error),
    #[error("device: {0}")]
    Device(String),
    #[error("{0}")]
    InvalidAllocation(String),
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    Unsupported(String),
}

impl Error {
    pub fn io(what: &'static str, path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }

    /// Whether a retry could succeed without anything else changing (for logs and backoff).
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Io { .. } | Error::Device(_))
    }
}
