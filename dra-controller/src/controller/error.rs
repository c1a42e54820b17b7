//! The controller's one error type, and the label each variant gets in metrics.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API call failed: {0}")]
    Kube(#[source] kube::Error),
    #[error("invalid migration pool selector: {0}")]
    Selector(String),
    #[error("embedded manifest {name} is invalid: {source}")]
    Manifest {
        name: &'static str,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("object has no {0}")]
    MissingField(&'static str),
    #[error("serialising an object failed: {0}")]
    Serialize(#[source] serde_json::Error),
    #[error("finalizer failed: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("onDemandMig.holdDown {0:?} is not a duration like 30s, 5m or 1h30m")]
    HoldDown(String),
    #[error("metrics or health server failed: {0}")]
    Server(#[source] std::io::Error),
    #[error("webhook certificate: {0}")]
    Tls(String),
    #[error("admission webhook server failed: {0}")]
    Webhook(#[source] std::io::Error),
}

impl From<kube::Error> for Error {
    fn from(e: kube::Error) -> Self {
        Self::Kube(e)
    }
}

impl Error {
    /// A short, bounded label for the `failures` metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Kube(_) => "kube",
            Self::Selector(_) => "selector",
            Self::Manifest { .. } => "manifest",
            Self::MissingField(_) => "missing_field",
            Self::Serialize(_) => "serialize",
            Self::Finalizer(_) => "finalizer",
            Self::HoldDown(_) => "hold_down",
            Self::Server(_) => "server",
            Self::Tls(_) => "tls",
            Self::Webhook(_) => "webhook",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
