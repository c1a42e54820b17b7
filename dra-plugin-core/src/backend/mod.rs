//! The device port: where GPUs come from, how MIG and sharing settings are changed, and what the
//! hardware says about its health. The core drives it; the simulated backend here and the NVML
//! backend of the plugin crate implement it.
use std::path::PathBuf;
use std::time::Duration;

use gpu_dra_api::config::TimeSliceInterval;
use gpu_dra_api::inventory::{Inventory, MigDevice};

use crate::Error;

pub mod simulated;

/// Blocking calls; async callers run them on the blocking pool.
pub trait DeviceBackend: Send + Sync + 'static {
    /// `simulated` or `nvml`, for logs and metrics.
    fn kind(&self) -> &'static str;

    /// Every GPU with its MIG capability and current MIG devices.
    fn discover(&self) -> Result<Inventory, Error>;

    /// Creates a GPU instance of `gi_profile_id` at `placement_start` on the GPU with minor
    /// `parent_minor`, plus its full-size compute instance (enabling MIG mode if needed).
    fn create_mig(
        &self,
        parent_minor: u32,
        gi_profile_id: u32,
        placement_start: u32,
    ) -> Result<MigDevice, Error>;

    /// Destroys the MIG device of `gi_profile_id` at `placement_start` on `parent_minor`; absent
    /// is fine (idempotent).
    fn destroy_mig(
        &self,
        parent_minor: u32,
        gi_profile_id: u32,
        placement_start: u32,
    ) -> Result<(), Error>;

    /// Sets the time-slice interval of the GPU with minor `gpu_minor` (`Default` resets it).
    fn set_time_slice(&self, gpu_minor: u32, interval: TimeSliceInterval) -> Result<(), Error> {
        Err(Error::Unsupported(format!(
            "the {} backend cannot set the time slice of gpu-{gpu_minor} to {interval:?}",
            self.kind()
        )))
    }

    /// Sets the compute mode of the GPU with minor `gpu_minor` (MPS needs exclusive-process).
    fn set_compute_mode(&self, gpu_minor: u32, mode: ComputeMode) -> Result<(), Error> {
        Err(Error::Unsupported(format!(
            "the {} backend cannot set the compute mode of gpu-{gpu_minor} to {mode:?}",
            self.kind()
        )))
    }

    /// The root of the driver installation whose tools serve these GPUs: the MPS control daemon
    /// is `<root>/usr/bin/nvidia-cuda-mps-control`. `None` for GPUs without a driver (simulated
    /// ones), whose claims get a stand-in daemon.
    fn driver_root(&self) -> Option<PathBuf> {
        None
    }

    /// Blocks for up to `timeout` and returns the health events that arrived meanwhile. A
    /// backend that cannot watch a GPU reports `Unmonitored` for it once.
    fn health_events(&self, timeout: Duration) -> Result<Vec<HealthEvent>, Error> {
        std::thread::sleep(timeout);
        Ok(Vec::new())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeMode {
    Default,
    ExclusiveProcess,
}

/// Something the driver reported about a GPU (MIG devices share their parent's health unless the
/// event names one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthEvent {
    /// The GPU's minor number (`gpu-<minor>`).
    pub minor: u32,
    pub uuid: String,
    pub kind: HealthEventKind,
    /// The MIG device concerned, as (GPU instance, compute instance), when the driver names one.
    pub mig: Option<(u32, u32)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthEventKind {
    /// An XID error with its code.
    Xid(u64),
    /// An uncorrectable (double-bit) ECC error.
    DoubleBitEcc,
    /// The GPU fell off the bus or is otherwise unreachable.
    GpuLost,
    /// Health cannot be watched for this GPU (events could not be registered).
    Unmonitored,
    /// The GPU reports healthy again (after a reset, or the simulator says so).
    Healthy,
}
