//! The plugin library's error type. Each variant maps to a gRPC status and a bounded metric label.
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
    #[error("ResourceClaim {0} not found")]
    ClaimNotFound(String),
    #[error("ResourceClaim {key} has UID {actual}, not {expected}: it was deleted and re-created")]
    ClaimReplaced {
        key: String,
        expected: String,
        actual: String,
    },
    #[error("ResourceClaim {0} is not allocated")]
    NotAllocated(String),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl Error {
    pub fn io(what: &'static str, path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }

    /// A fixed, small set of labels for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Io { .. } => "io",
            Error::Model(gpu_dra_api::Error::Config { .. }) => "config",
            Error::Model(_) => "model",
            Error::Device(_) => "device",
            Error::InvalidAllocation(_) => "invalid_allocation",
            Error::Busy(_) => "busy",
            Error::Unsupported(_) => "unsupported",
            Error::ClaimNotFound(_) | Error::ClaimReplaced { .. } | Error::NotAllocated(_) => {
                "claim"
            }
            Error::Kube(_) => "api",
        }
    }

    /// Whether a retry could succeed without anything else changing (for logs and backoff).
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Io { .. } | Error::Kube(_) | Error::Device(_))
    }
}
