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

/// What the kubelet's DRA calls drive: the GPU state, or the compute-domain state.
pub trait Preparer: Send + Sync + 'static {
    fn prepare<'a>(
        &'a self,
        alloc: &'a types::ClaimAllocation,
    ) -> BoxFuture<'a, Result<Vec<types::PreparedDevice>, crate::Error>>;
    fn unprepare<'a>(&'a self, claim_uid: &'a str) -> BoxFuture<'a, Result<(), crate::Error>>;
    fn checkpoint(&self) -> &checkpoint::Checkpoint;
    /// Devices of completed claims, for the `prepared devices` gauge.
    fn prepared_device_count(&self) -> usize {
        self.checkpoint().with_claims(|claims| {
            claims
                .values()
                .filter(|r| r.state == checkpoint::ClaimState::PrepareCompleted)
                .map(|r| r.devices.len())
                .sum()
        })
    }
}

impl Preparer for state::DeviceState {
    fn prepare<'a>(
        &'a self,
        alloc: &'a types::ClaimAllocation,
    ) -> BoxFuture<'a, Result<Vec<types::PreparedDevice>, crate::Error>> {
        Box::pin(state::DeviceState::prepare(self, alloc))
    }

    fn unprepare<'a>(&'a self, claim_uid: &'a str) -> BoxFuture<'a, Result<(), crate::Error>> {
        Box::pin(state::DeviceState::unprepare(self, claim_uid))
    }

    fn checkpoint(&self) -> &checkpoint::Checkpoint {
        state::DeviceState::checkpoint(self)
    }
}
