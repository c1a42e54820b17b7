//! The simulator's one error type: what `eval`, `simulate` and input loading report. CEL and
//! allocator outcomes are not errors of the program: they stay messages (`String`) worded as the
//! scheduler words them, and reach this type only as `Invalid` when a command gives up on them.
use std::io;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Input the simulator cannot use (a flag, a document, a field, a selector), with where it is.
    #[error("{0}")]
    Invalid(String),
    /// No node can take the pod's claims (the outcome has been printed already).
    #[error("unsatisfiable on all {nodes} node(s)")]
    Unsatisfiable { nodes: usize },
    /// Some pods of the input stay Pending (the outcome has been printed already).
    #[error("{pending} of {pods} pod(s) cannot be scheduled")]
    Unschedulable { pending: usize, pods: usize },
    /// Reading a file or a directory.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// Turning a document into JSON, or a typed object back into JSON.
    #[error("{what}")]
    Encode {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// Writing the result as JSON.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// Writing the result as YAML.
    #[error(transparent)]
    Yaml(#[from] serde_yaml::Error),
    /// `--kubeconfig` without a path: no kubeconfig or in-cluster configuration found.
    #[error("loading kubeconfig")]
    InferConfig(#[source] kube::config::InferConfigError),
    /// `--kubeconfig PATH`: the file cannot be read or used.
    #[error("{what}")]
    Kubeconfig {
        what: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Building the client from the configuration.
    #[error(transparent)]
    Client(#[from] kube::Error),
    /// Listing objects from the cluster.
    #[error("listing {kind}")]
    List {
        kind: &'static str,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Error::Invalid(message.into())
    }
}
