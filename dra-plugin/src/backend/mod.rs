//! Device backends: where GPUs come from (simulated profiles or NVML) and how MIG is changed.
use gpu_dra_api::inventory::{Inventory, MigDevice};

use crate::Error;

pub mod nvml;
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
}
