//! On-demand MIG: what must change on one GPU to reach the MIG devices the controller wants, and
//! whether it may. Pure; the plugin crate reads the wish from the `MigLayout` object, withdraws
//! the affected devices from its slices and calls the backend.
use std::collections::BTreeSet;

use gpu_dra_api::inventory::{Gpu, MigDevice, gpu_device_name, mig_device_name};

/// One wanted MIG device: a profile by NVIDIA's name at a placement start.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct WantedMig {
    pub profile: String,
    pub start: u32,
}

/// A MIG device to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewMig {
    pub profile: String,
    pub gi_profile_id: u32,
    pub start: u32,
}

/// The changes that bring a GPU to its wanted layout. Destroys come first: they free the slices
/// the creates need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuChange {
    pub minor: u32,
    pub destroy: Vec<MigDevice>,
    pub create: Vec<NewMig>,
    /// Published devices that must leave the slices before the hardware changes: the whole GPU
    /// when it is carved, and every instance to destroy.
    pub withdrawn: BTreeSet<String>,
}

impl GpuChange {
    pub fn is_empty(&self) -> bool {
        self.destroy.is_empty() && self.create.is_empty()
    }
}

/// Why a GPU's wanted layout is not applied. `reason` is a fixed word (conditions, metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `Invalid` (the wish cannot exist on this GPU), `InUse` (a claim holds what must go) or
    /// `Failed` (the hardware did not do or is not in what was asked).
    pub reason: &'static str,
    pub message: String,
}

impl Refusal {
    fn invalid(message: String) -> Self {
        Refusal {
            reason: "Invalid",
            message,
        }
    }
}

/// The name a MIG device is published under.
pub fn device_name(minor: u32, d: &MigDevice) -> String {
    mig_device_name(minor, &d.profile, d.gi_profile_id, d.placement_start)
}

/// Resolves `wanted` against the GPU's profiles and placements, refusing unknown profiles,
/// invalid starts and overlapping memory slices (what the controller should never ask for).
fn resolve(gpu: &Gpu, wanted: &[WantedMig]) -> Result<Vec<NewMig>, Refusal> {
    let Some(mig) = &gpu.mig else {
        return Err(Refusal::invalid(format!(
            "gpu-{} ({}) cannot do MIG",
            gpu.minor, gpu.product_name
        )));
    };
    let mut used: Vec<(u32, u32, &str)> = Vec::new();
    let mut out = Vec::new();
    for w in wanted {
        let p = mig
            .profiles
            .iter()
            .find(|p| p.name == w.profile)
            .ok_or_else(|| {
                Refusal::invalid(format!(
                    "gpu-{} ({}) has no MIG profile {}",
                    gpu.minor, gpu.product_name, w.profile
                ))
            })?;
        if !p.placements.iter().any(|[s, _]| *s == w.start) {
            return Err(Refusal::invalid(format!(
                "{} cannot start at memory slice {} on gpu-{}",
                w.profile, w.start, gpu.minor
            )));
        }
        let end = w.start + p.memory_slices;
        if let Some((_, _, other)) = used.iter().find(|(s, e, _)| w.start < *e && *s < end) {
            return Err(Refusal::invalid(format!(
                "{} at {} overlaps {other} on gpu-{}",
                w.profile, w.start, gpu.minor
            )));
        }
        used.push((w.start, end, &w.profile));
        out.push(NewMig {
            profile: p.name.clone(),
            gi_profile_id: p.gi_profile_id,
            start: w.start,
        });
    }
    Ok(out)
}

/// What to do on `gpu` so that its MIG devices are exactly `wanted` (empty: the whole GPU).
/// `held` names the devices that claims hold or are allocated: none of them may go, and a held
/// whole GPU may not be carved.
pub fn plan_gpu(
    gpu: &Gpu,
    wanted: &[WantedMig],
    held: &BTreeSet<String>,
) -> Result<GpuChange, Refusal> {
    let existing: &[MigDevice] = gpu.mig.as_ref().map_or(&[], |m| &m.devices);
    if wanted.is_empty() && existing.is_empty() {
        // Nothing to destroy, yet the GPU is published whole only once MIG mode is off.
        if gpu.mig_enabled() {
            return Err(Refusal {
                reason: "Failed",
                message: format!(
                    "gpu-{} is in MIG mode without MIG devices, so it is not published whole \
                     (MIG mode could not be left; a GPU reset may be pending)",
                    gpu.minor
                ),
            });
        }
        return Ok(GpuChange {
            minor: gpu.minor,
            ..Default::default()
        });
    }
    let resolved = resolve(gpu, wanted)?;
    let is_wanted = |d: &MigDevice| {
        resolved
            .iter()
            .any(|n| n.gi_profile_id == d.gi_profile_id && n.start == d.placement_start)
    };
    let mut change = GpuChange {
        minor: gpu.minor,
        destroy: existing.iter().filter(|d| !is_wanted(d)).cloned().collect(),
        create: resolved
            .into_iter()
            .filter(|n| {
                !existing
                    .iter()
                    .any(|d| d.gi_profile_id == n.gi_profile_id && d.placement_start == n.start)
            })
            .collect(),
        withdrawn: BTreeSet::new(),
    };
    change.withdrawn = change
        .destroy
        .iter()
        .map(|d| device_name(gpu.minor, d))
        .collect();
    if existing.is_empty() && !change.create.is_empty() {
        change.withdrawn.insert(gpu_device_name(gpu.minor));
    }
    check_not_held(&change, held)?;
    Ok(change)
}

/// Refuses a change that would take a device a claim holds or is allocated.
pub fn check_not_held(change: &GpuChange, held: &BTreeSet<String>) -> Result<(), Refusal> {
    let busy: Vec<&str> = change
        .withdrawn
        .iter()
        .filter(|n| held.contains(*n))
        .map(String::as_str)
        .collect();
    if busy.is_empty() {
        return Ok(());
    }
    Err(Refusal {
        reason: "InUse",
        message: format!(
            "gpu-{}: {} allocated to or prepared for a claim; not changed",
            change.minor,
            busy.join(", ")
        ),
    })
}

#[cfg(test)]
mod tests;
