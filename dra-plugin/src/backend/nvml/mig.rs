//! MIG changes: creating a GPU instance at a placement with its full-size compute instance,
//! destroying it, and switching MIG mode on for the first instance and off after the last.
use gpu_dra_api::inventory::MigDevice;
use gpu_dra_api::profiles::{self, GpuModel, MediaEngines, MigProfile};
use nvml_wrapper_sys::bindings as sys;
use tracing::{info, warn};

use dra_plugin_core::Error;

use super::discovery::NvmlProfile;
use super::{CachedGpu, NvmlBackend, Raw, Session, Status, func, raw_err, struct_version};

/// Full-size compute instance profile for a GPU instance of `slices` compute slices.
fn ci_profile_for(slices: u32) -> Option<u32> {
    Some(match slices {
        1 => sys::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => sys::NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => sys::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => sys::NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        6 => sys::NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
        7 => sys::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
        8 => sys::NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
        _ => return None,
    })
}

/// Why a GPU instance does not fit next to `existing`, in the simulated backend's words.
fn why_no_room(
    existing: &[MigDevice],
    profiles: &[NvmlProfile],
    profile: &MigProfile,
    start: u32,
) -> Option<String> {
    let size = profile.memory_slices;
    let wanted = start..start + size;
    if let Some(c) = existing.iter().find(|d| {
        let other = d.placement_start..d.placement_start + d.placement_size;
        wanted.start < other.end && other.start < wanted.end
    }) {
        return Some(format!(
            "insufficient resources: placement {start}+{size} overlaps {} at {}",
            c.profile, c.placement_start
        ));
    }
    let all: Vec<MigProfile> = profiles.iter().map(|p| p.profile.clone()).collect();
    let existing_ids = existing.iter().map(|d| d.gi_profile_id);
    if let Some(why) = MediaEngines::refusal(&all, existing_ids, profile) {
        return Some(why);
    }
    let same = existing
        .iter()
        .filter(|d| d.gi_profile_id == profile.gi_profile_id)
        .count();
    if same >= profile.max_instances as usize {
        return Some(format!(
            "insufficient resources: {} allows {} instances per GPU",
            profile.name, profile.max_instances
        ));
    }
    let slices_of = |id: u32| {
        profiles
            .iter()
            .find(|p| p.profile.gi_profile_id == id)
            .map_or(0, |p| p.profile.compute_slices)
    };
    let used: u32 = existing.iter().map(|d| slices_of(d.gi_profile_id)).sum();
    let total = profiles
        .iter()
        .map(|p| p.profile.compute_slices)
        .max()
        .unwrap_or(0);
    (used + profile.compute_slices > total).then(|| {
        format!(
            "insufficient resources: {} needs {} compute slices, {} of {total} are free",
            profile.name,
            profile.compute_slices,
            total.saturating_sub(used)
        )
    })
}

impl NvmlBackend {
    pub(super) fn create_mig_device(
        &self,
        parent_minor: u32,
        gi_profile_id: u32,
        placement_start: u32,
    ) -> Result<MigDevice, Error> {
        let s = self.session()?;
        let _mig = self.mig.lock().expect("mig lock");
        let g = s.gpu(parent_minor)?;
        if s.mig_mode(g)?.is_none() {
            return Err(Error::Device(format!("gpu-{parent_minor} cannot do MIG")));
        }
        let name = s.device(g).name().unwrap_or_default();
        let model = profiles::catalog().iter().find(|c| c.product_name == name);
        let profiles = s.gi_profiles(g, model)?;
        let profile = profiles
            .iter()
            .map(|p| &p.profile)
            .find(|p| p.gi_profile_id == gi_profile_id)
            .ok_or_else(|| {
                Error::Device(format!(
                    "gpu-{parent_minor} has no GI profile {gi_profile_id}"
                ))
            })?;
        let size = profile
            .placements
            .iter()
            .find(|[start, _]| *start == placement_start)
            .map(|[_, size]| *size)
            .ok_or_else(|| {
                Error::Device(format!(
                    "{} cannot start at memory slice {placement_start}",
                    profile.name
                ))
            })?;
        s.ensure_mig_mode(g, self.opts.enable_mig_mode)?;

        // Idempotent: the instance may exist already (a retried prepare), perhaps without its
        // compute instance (a crash between the two steps).
        let existing = s
            .gpu_instances(g, profile)?
            .into_iter()
            .find(|i| i.start == placement_start);
        let (gi, gi_id) = match existing {
            Some(i) => (i.handle, i.gi_id),
            None => {
                let create = func(
                    &s.lib().nvmlDeviceCreateGpuInstanceWithPlacement,
                    "nvmlDeviceCreateGpuInstanceWithPlacement",
                )?;
                let placement = sys::nvmlGpuInstancePlacement_t {
                    start: placement_start,
                    size,
                };
                let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
                // SAFETY: valid handle, placement and out-pointer.
                let r =
                    Status::ok(unsafe { create(g.handle.0, gi_profile_id, &placement, &mut gi) });
                if let Err(st) = r {
                    let why = if st.is(sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES) {
                        s.mig_devices(g, &profiles)
                            .ok()
                            .and_then(|ds| why_no_room(&ds, &profiles, profile, placement_start))
                    } else {
                        None
                    };
                    return Err(Error::Device(why.unwrap_or_else(|| {
                        format!(
                            "NVML creating {} at {placement_start} on gpu-{parent_minor}: {st}",
                            profile.name
                        )
                    })));
                }
                let mut info: sys::nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
                let get_info = func(&s.lib().nvmlGpuInstanceGetInfo, "nvmlGpuInstanceGetInfo")?;
                // SAFETY: the instance just created.
                Status::ok(unsafe { get_info(gi, &mut info) })
                    .map_err(raw_err("GPU instance info"))?;
                (Raw(gi), info.id)
            }
        };
        let uuids = s.mig_uuids(g)?;
        let (ci_id, uuid) = match uuids.range((gi_id, 0)..=(gi_id, u32::MAX)).next() {
            Some((&(_, ci), uuid)) => (ci, uuid.clone()),
            None => {
                let ci = match s.create_ci(gi.0, profile.compute_slices) {
                    Ok(ci) => ci,
                    Err(e) => {
                        // Leave no half-made device behind.
                        if let Err(e2) = s.destroy_instance(gi.0) {
                            warn!(gpu = parent_minor, error = %e2, "could not roll back the GPU instance");
                        }
                        return Err(e);
                    }
                };
                let uuid = s.mig_uuids(g)?.remove(&(gi_id, ci)).ok_or_else(|| {
                    Error::Device(format!(
                        "NVML lists no MIG device for GPU instance {gi_id}/compute instance {ci} on gpu-{parent_minor}"
                    ))
                })?;
                (ci, uuid)
            }
        };
        info!(gpu = parent_minor, profile = %profile.name, start = placement_start, gi = gi_id, ci = ci_id, %uuid, "MIG device ready");
        Ok(MigDevice {
            profile: profile.name.clone(),
            gi_profile_id,
            placement_start,
            placement_size: size,
            uuid,
            gi_id,
            ci_id,
        })
    }

    pub(super) fn destroy_mig_device(
        &self,
        parent_minor: u32,
        gi_profile_id: u32,
        placement_start: u32,
    ) -> Result<(), Error> {
        let s = self.session()?;
        let _mig = self.mig.lock().expect("mig lock");
        let g = s.gpu(parent_minor)?;
        if s.mig_mode(g)? != Some(true) {
            return Ok(());
        }
        let name = s.device(g).name().unwrap_or_default();
        let model = profiles::catalog().iter().find(|c| c.product_name == name);
        let Some(profile) = s
            .gi_profiles(g, model)?
            .into_iter()
            .map(|p| p.profile)
            .find(|p| p.gi_profile_id == gi_profile_id)
        else {
            return Ok(());
        };
        for inst in s.gpu_instances(g, &profile)? {
            if inst.start == placement_start {
                s.destroy_instance(inst.handle.0).map_err(|e| {
                    Error::Device(format!(
                        "destroying {} at {placement_start} on gpu-{parent_minor}: {e}",
                        profile.name
                    ))
                })?;
                info!(gpu = parent_minor, profile = %profile.name, start = placement_start, gi = inst.gi_id, "destroyed MIG device");
            }
        }
        if self.opts.enable_mig_mode {
            s.leave_mig_mode_if_unused(g, model)?;
        }
        Ok(())
    }
}

impl Session {
    /// Switches MIG mode on, if it is not on already.
    pub(super) fn ensure_mig_mode(&self, g: &CachedGpu, allowed: bool) -> Result<(), Error> {
        match self.mig_mode(g)? {
            None => Err(Error::Device(format!("gpu-{} cannot do MIG", g.minor))),
            Some(true) => Ok(()),
            Some(false) if !allowed => Err(Error::Device(format!(
                "gpu-{} is not in MIG mode and this plugin may not change that",
                g.minor
            ))),
            Some(false) => {
                let f = func(&self.lib().nvmlDeviceSetMigMode, "nvmlDeviceSetMigMode")?;
                let mut activation: sys::nvmlReturn_t = 0;
                // SAFETY: valid handle and out-pointer.
                Status::ok(unsafe { f(g.handle.0, sys::NVML_DEVICE_MIG_ENABLE, &mut activation) })
                    .map_err(raw_err(format_args!(
                        "enabling MIG mode on gpu-{}",
                        g.minor
                    )))?;
                if self.mig_mode(g)? != Some(true) {
                    return Err(Error::Device(format!(
                        "MIG mode on gpu-{} is pending until the GPU is reset ({})",
                        g.minor,
                        Status(activation)
                    )));
                }
                info!(gpu = g.minor, "enabled MIG mode");
                Ok(())
            }
        }
    }

    /// Dynamic MIG: MIG mode goes off again with the last instance, so the whole GPU can be
    /// handed out (the simulated backend does the same).
    pub(super) fn leave_mig_mode_if_unused(
        &self,
        g: &CachedGpu,
        model: Option<&GpuModel>,
    ) -> Result<(), Error> {
        let profiles = self.gi_profiles(g, model)?;
        for p in &profiles {
            if !self.gpu_instances(g, &p.profile)?.is_empty() {
                return Ok(());
            }
        }
        let f = func(&self.lib().nvmlDeviceSetMigMode, "nvmlDeviceSetMigMode")?;
        let mut activation: sys::nvmlReturn_t = 0;
        // SAFETY: valid handle and out-pointer.
        match Status::ok(unsafe { f(g.handle.0, sys::NVML_DEVICE_MIG_DISABLE, &mut activation) }) {
            Ok(()) => info!(gpu = g.minor, "MIG mode off: no MIG devices left"),
            Err(st) => warn!(gpu = g.minor, error = %st, "could not leave MIG mode"),
        }
        Ok(())
    }

    /// The full-size compute instance profile of a GPU instance: (NVML CI profile id).
    pub(super) fn full_ci_profile(
        &self,
        gi: sys::nvmlGpuInstance_t,
        slices: u32,
    ) -> Result<u32, Error> {
        let index = ci_profile_for(slices).ok_or_else(|| {
            Error::Device(format!("no compute instance profile for {slices} slices"))
        })?;
        let f = func(
            &self.lib().nvmlGpuInstanceGetComputeInstanceProfileInfoV,
            "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
        )?;
        // SAFETY: zeroed out-struct of the declared version.
        let mut info: sys::nvmlComputeInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
        info.version = struct_version::<sys::nvmlComputeInstanceProfileInfo_v2_t>(2);
        Status::ok(unsafe {
            f(
                gi,
                index,
                sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &mut info as *mut _ as *mut _,
            )
        })
        .map_err(raw_err(format_args!(
            "compute instance profile of {slices} slices"
        )))?;
        Ok(info.id)
    }

    /// Creates the full-size compute instance in `gi`; its id.
    pub(super) fn create_ci(&self, gi: sys::nvmlGpuInstance_t, slices: u32) -> Result<u32, Error> {
        let lib = self.lib();
        let profile = self.full_ci_profile(gi, slices)?;
        let create = func(
            &lib.nvmlGpuInstanceCreateComputeInstance,
            "nvmlGpuInstanceCreateComputeInstance",
        )?;
        let get_info = func(
            &lib.nvmlComputeInstanceGetInfo_v2,
            "nvmlComputeInstanceGetInfo_v2",
        )?;
        let mut ci: sys::nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: a GPU instance handle from NVML.
        Status::ok(unsafe { create(gi, profile, &mut ci) })
            .map_err(raw_err("creating the compute instance"))?;
        let mut info: sys::nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: the compute instance just created.
        Status::ok(unsafe { get_info(ci, &mut info) }).map_err(raw_err("compute instance info"))?;
        Ok(info.id)
    }

    /// Destroys every compute instance of `gi`, then `gi`.
    pub(super) fn destroy_instance(&self, gi: sys::nvmlGpuInstance_t) -> Result<(), Error> {
        let lib = self.lib();
        let list = func(
            &lib.nvmlGpuInstanceGetComputeInstances,
            "nvmlGpuInstanceGetComputeInstances",
        )?;
        let destroy_ci = func(
            &lib.nvmlComputeInstanceDestroy,
            "nvmlComputeInstanceDestroy",
        )?;
        let destroy_gi = func(&lib.nvmlGpuInstanceDestroy, "nvmlGpuInstanceDestroy")?;
        for profile in 0..sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            let mut count: u32 = 8;
            let mut cis: Vec<sys::nvmlComputeInstance_t> =
                vec![std::ptr::null_mut(); count as usize];
            // SAFETY: the array holds `count` entries.
            match Status::ok(unsafe { list(gi, profile, cis.as_mut_ptr(), &mut count) }) {
                Ok(()) => {}
                Err(s)
                    if s.is(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED)
                        || s.is(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT) =>
                {
                    continue;
                }
                Err(s) => return Err(raw_err("listing compute instances")(s)),
            }
            for ci in &cis[..count as usize] {
                // SAFETY: a compute instance handle from NVML.
                Status::ok(unsafe { destroy_ci(*ci) })
                    .map_err(raw_err("destroying a compute instance"))?;
            }
        }
        // SAFETY: a GPU instance handle from NVML, now without compute instances.
        Status::ok(unsafe { destroy_gi(gi) }).map_err(raw_err("destroying the GPU instance"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_compute_instance_profiles() {
        assert_eq!(
            ci_profile_for(7),
            Some(sys::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE)
        );
        assert_eq!(
            ci_profile_for(1),
            Some(sys::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
        );
        assert_eq!(ci_profile_for(5), None);
    }
}
