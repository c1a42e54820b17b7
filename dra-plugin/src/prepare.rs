//! What the kubelet's DRA calls drive: where a claim's allocation comes from, and what prepares
//! it (the core's GPU state, or the compute-domain state, which also labels the node), with
//! what a prepared claim shows outside the node's files ([`ClaimOutputs`]).
use std::sync::Arc;

use futures::future::BoxFuture;

use dra_plugin_core::checkpoint::Checkpoint;
use dra_plugin_core::metadata::{DeviceAttributes, MetadataWriter, add_cdi_ids};
use dra_plugin_core::state::DeviceState;
use dra_plugin_core::types::{ClaimAllocation, ClaimRef, PreparedDevice};

use crate::Error;
use crate::kube::status::ClaimStatus;
use crate::metrics::Metrics;

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
    /// What the kubelet's unprepare calls: [`Preparer::unprepare`], plus whatever else the
    /// claim's name locates ([`ClaimOutputs`]).
    fn unprepare_claim<'a>(&'a self, claim: &'a ClaimRef) -> BoxFuture<'a, Result<(), Error>> {
        self.unprepare(&claim.uid)
    }
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

/// A preparer plus what a prepared claim shows beyond its CDI spec: device metadata files (the
/// `DeviceMetadata` gate) and the claim's `status.devices`. Neither fails a prepare: a metadata
/// file that cannot be written is logged and counted (the upstream helper's rule), the status is
/// written and retried in the background.
pub struct ClaimOutputs {
    pub inner: Arc<dyn Preparer>,
    pub metadata: Option<MetadataWriter>,
    pub status: Option<Arc<dyn ClaimStatus>>,
    pub metrics: Arc<Metrics>,
}

impl ClaimOutputs {
    async fn write_metadata(&self, alloc: &ClaimAllocation, devices: &mut [PreparedDevice]) {
        let Some(writer) = self.metadata.clone() else {
            return;
        };
        let owned = alloc.clone();
        // No device publishes attributes yet (NVIDIA: VFIO devices only).
        let written =
            tokio::task::spawn_blocking(move || writer.write(&owned, &DeviceAttributes::new()))
                .await;
        match written {
            Ok(Ok(ids)) => add_cdi_ids(devices, &ids),
            Ok(Err(e)) => {
                let e = Error::from(e);
                tracing::warn!(error = %e, "device metadata not written; the claim is prepared without it");
                self.metrics.error("device_metadata", e.reason());
            }
            Err(e) => tracing::warn!(error = %e, "device metadata task failed"),
        }
    }
}

impl Preparer for ClaimOutputs {
    fn prepare<'a>(
        &'a self,
        alloc: &'a ClaimAllocation,
    ) -> BoxFuture<'a, Result<Vec<PreparedDevice>, Error>> {
        Box::pin(async move {
            let mut devices = self.inner.prepare(alloc).await?;
            self.write_metadata(alloc, &mut devices).await;
            if let Some(status) = &self.status {
                status.prepared(&alloc.claim, &devices);
            }
            Ok(devices)
        })
    }

    fn unprepare<'a>(&'a self, claim_uid: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            // Cleanup knows a claim by UID only; its record has the name.
            match self.inner.checkpoint().get(claim_uid) {
                Some(r) => {
                    let claim = ClaimRef {
                        uid: claim_uid.to_string(),
                        namespace: r.namespace,
                        name: r.name,
                    };
                    self.unprepare_claim(&claim).await
                }
                None => self.inner.unprepare(claim_uid).await,
            }
        })
    }

    fn unprepare_claim<'a>(&'a self, claim: &'a ClaimRef) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            self.inner.unprepare_claim(claim).await?;
            if let Some(writer) = self.metadata.clone() {
                let owned = claim.clone();
                // A removal that fails fails the unprepare, so the kubelet retries it (as the
                // helper does).
                tokio::task::spawn_blocking(move || writer.remove(&owned))
                    .await
                    .map_err(|e| {
                        let e = std::io::Error::other(format!("metadata removal task: {e}"));
                        Error::io("removing the device metadata", std::path::Path::new(""), e)
                    })??;
            }
            if let Some(status) = &self.status {
                status.unprepared(claim);
            }
            Ok(())
        })
    }

    fn checkpoint(&self) -> &Checkpoint {
        self.inner.checkpoint()
    }

    fn prepared_device_count(&self) -> usize {
        self.inner.prepared_device_count()
    }
}
