//! The plugin's error type: the core's errors plus those of reading ResourceClaims from the API
//! server. Each variant maps to the error text the kubelet gets and a bounded metric label.
use std::path::Path;

use dra_plugin_core::Error as CoreError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Core(#[from] CoreError),
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
        CoreError::io(what, path, source).into()
    }

    /// A fixed, small set of labels for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Core(e) => core_reason(e),
            Error::ClaimNotFound(_) | Error::ClaimReplaced { .. } | Error::NotAllocated(_) => {
                "claim"
            }
            Error::Kube(_) => "api",
        }
    }

    /// Whether a retry could succeed without anything else changing (for logs and backoff).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Core(e) => e.is_transient(),
            Error::Kube(_) => true,
            Error::ClaimNotFound(_) | Error::ClaimReplaced { .. } | Error::NotAllocated(_) => false,
        }
    }
}

/// The metric label of a core error.
fn core_reason(e: &CoreError) -> &'static str {
    match e {
        CoreError::Io { .. } => "io",
        CoreError::Model(gpu_dra_api::Error::Config { .. }) => "config",
        CoreError::Model(_) => "model",
        CoreError::Device(_) => "device",
        CoreError::InvalidAllocation(_) => "invalid_allocation",
        CoreError::Busy(_) => "busy",
        CoreError::Unsupported(_) => "unsupported",
    }
}
