//! The kubelet plugin's core: what "prepared" means, independent of Kubernetes and gRPC.
pub mod cdi;
pub mod checkpoint;
pub mod configs;
pub mod fsutil;
pub mod health;
pub mod sharing;
pub mod state;
pub mod types;

use futures::future::BoxFuture;

/// Where the allocation of a claim comes from: the API server in production, files or fakes in
/// tests and offline runs.
pub trait ClaimSource: Send + Sync + 'static {
    fn allocation<'a>(
        &'a self,
        claim: &'a types::ClaimRef,
    ) -> BoxFuture<'a, Result<types::ClaimAllocation, crate::Error>>;
}
