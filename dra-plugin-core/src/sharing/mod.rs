//! GPU sharing chosen per claim through opaque config: time-slicing and MPS.
//!
//! Time-slicing is a per-GPU setting applied through the backend at prepare and reset to
//! `Default` when the last claim that asked for it goes. MPS gets one control daemon per claim,
//! run by the plugin itself as a supervised process (see [`mps`]).
//!
//! Everything a claim changes is recorded in its checkpoint record (as `HardwareChange`s) before
//! it is changed, so unprepare, rollback of a failed prepare and a restart after a crash can all
//! undo it.
pub mod mps;
pub mod runner;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::Path;

use gpu_dra_api::config::TimeSliceInterval;
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::fsutil::write_atomic;

/// What the plugin has applied to each GPU, written to `sharing.json` in the plugin directory
/// after every change so operators (and the e2e tests) can see it without NVML.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SharingStateFile {
    /// By device name of the GPU (`gpu-<minor>`).
    pub gpus: BTreeMap<String, GpuSharingState>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuSharingState {
    pub time_slice: TimeSliceInterval,
    /// `Default` or `ExclusiveProcess`.
    pub compute_mode: String,
    /// UIDs of the claims holding these settings.
    pub claims: Vec<String>,
}

impl Default for GpuSharingState {
    fn default() -> Self {
        GpuSharingState {
            time_slice: TimeSliceInterval::Default,
            compute_mode: "Default".into(),
            claims: Vec::new(),
        }
    }
}

impl SharingStateFile {
    pub const FILE_NAME: &'static str = "sharing.json";

    pub fn write(&self, dir: &Path) -> Result<(), Error> {
        let path = dir.join(Self::FILE_NAME);
        let data = serde_json::to_vec_pretty(self).expect("sharing state serializes");
        write_atomic(&path, &data).map_err(|e| Error::io("writing the sharing state", &path, e))
    }

    pub fn read(dir: &Path) -> Option<Self> {
        let data = std::fs::read(dir.join(Self::FILE_NAME)).ok()?;
        serde_json::from_slice(&data).ok()
    }
}

/// A clear per-claim error for a GPU already time-sliced differently by another claim.
pub fn time_slice_conflict(
    device: &str,
    wanted: TimeSliceInterval,
    held: TimeSliceInterval,
    holder: &str,
) -> Error {
    Error::Busy(format!(
        "{device}: this claim asks for time slice {wanted:?}, but ResourceClaim {holder} already \
         runs the GPU with time slice {held:?}; one GPU has one time slice at a time"
    ))
}
