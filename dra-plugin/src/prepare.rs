//! What the kubelet's DRA calls drive: where a claim's allocation comes from, and what prepares
//! it (the core's GPU state, or the compute-domain state, which also labels the node).
use futures::future::BoxFuture;

use dra_plugin_core::checkpoint::Checkpoint;
use dra_plugin_core::state::DeviceState;
use dra_plugin_core::types::{ClaimAllocation, ClaimRef, PreparedDevice};

use crate::Error;

/// Where the allocation of a claim comes from: the API server in production, files or fakes in
/// tests and offline runs.
pub trait ClaimSource: Send + Sync + 'static {
    fn allocation<'a>(
        &'a self,
        claim: &'a ClaimRef,
    ) -> BoxFuture<'a, Result<ClaimAllocation, Error>>;
}

/// What the kubelet's DRA calls drive: the GPU state, or the compute-domain state.
pub trait Preparer: Send + Sync + 'static {
    fn prepare<'a>(
        &'a self,
        alloc: &'a ClaimAllocation,
    ) -> BoxFuture<'a, Result<Vec<PreparedDevice>, Error>>;
    fn unprepare<'a>(&'a self, claim_uid: &'a str) -> BoxFuture<'a, Result<(), Error>>;
    fn checkpoint(&self) -> &Checkpoint;
    /// Devices of completed claims, for the `prepared devices` gauge.
    fn prepared_device_count(&self) -> usize {
        self.checkpoint().prepared_device_count()
    }
}

impl Preparer for DeviceState {
    fn prepare<'a>(
        &'a self,
        alloc: &'a ClaimAllocation,
    ) -> BoxFuture<'a, Result<Vec<PreparedDevice>, Error>> {
        Box::pin(async move { Ok(DeviceState::prepare(self, alloc).await?) })
    }

    fn unprepare<'a>(&'a self, claim_uid: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move { Ok(DeviceState::unprepare(self, claim_uid).await?) })
    }

    fn checkpoint(&self) -> &Checkpoint {
        DeviceState::checkpoint(self)
    }
}
