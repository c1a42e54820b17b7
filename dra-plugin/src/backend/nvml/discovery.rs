//! Discovery: what a GPU is (name, PCI, NUMA node, addressing mode) and its MIG geometry and
//! devices as NVML reports them, read into the core's inventory.
use std::collections::BTreeMap;
use std::path::Path;

use dra_plugin_core::Error;
use gpu_dra_api::inventory::{Gpu, Inventory, MigDevice, MigInfo};
use gpu_dra_api::profiles::{self, GpuModel, MigProfile};
use nvml_wrapper::Device;
use nvml_wrapper::enum_wrappers::device::Brand;
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;
use tracing::warn;

use super::{
    CachedGpu, NvmlBackend, Raw, Session, Status, c_name, dev_err, func, raw_err, struct_version,
};

fn brand_name(b: Brand) -> String {
    match b {
        Brand::Tesla => "Tesla",
        Brand::Quadro => "Quadro",
        Brand::GeForce => "GeForce",
        Brand::Titan => "Titan",
        Brand::NvidiaRTX => "NvidiaRTX",
        Brand::NVS => "NVS",
        Brand::GRID => "GRID",
        Brand::Nvidia => "NVIDIA",
        _ => "Unknown",
    }
    .to_string()
}

fn architecture_name(a: Result<DeviceArchitecture, NvmlError>) -> String {
    match a {
        Ok(DeviceArchitecture::Ada) => "Ada Lovelace".to_string(),
        Ok(a) => a.to_string(),
        Err(_) => "Unknown".to_string(),
    }
}

/// NVML prints an 8-digit PCI domain; the standard attribute and sysfs use 4.
fn normalize_bus_id(raw: &str) -> String {
    let bus_id = raw.trim_end_matches('\0').to_ascii_lowercase();
    match bus_id.split_once(':') {
        Some((domain, rest)) if domain.len() == 8 => format!("{}:{rest}", &domain[4..]),
        _ => bus_id,
    }
}

/// The PCIe root complex a device hangs off: `<sysfs>/bus/pci/devices/<id>` links into
/// `<sysfs>/devices/pci<domain>:<bus>/...`.
fn pcie_root_of(sysfs: &Path, bus_id: &str) -> Option<String> {
    let target = std::fs::canonicalize(sysfs.join("bus/pci/devices").join(bus_id)).ok()?;
    let devices = std::fs::canonicalize(sysfs.join("devices")).ok()?;
    let rel = target.strip_prefix(devices).ok()?;
    rel.components()
        .next()
        .and_then(|c| c.as_os_str().to_str())
        .filter(|c| c.starts_with("pci"))
        .map(str::to_string)
}

/// The NUMA node from sysfs; `-1` there means the platform has none.
fn sysfs_numa_node(sysfs: &Path, bus_id: &str) -> Option<Option<i64>> {
    let text =
        std::fs::read_to_string(sysfs.join("bus/pci/devices").join(bus_id).join("numa_node"))
            .ok()?;
    let n: i64 = text.trim().parse().ok()?;
    Some((n >= 0).then_some(n))
}

/// A GPU-instance profile as NVML reports it.
#[derive(Debug, Clone)]
pub(super) struct NvmlProfile {
    /// `NVML_GPU_INSTANCE_PROFILE_*`, what GetGpuInstanceProfileInfo takes.
    #[allow(dead_code)]
    pub(super) index: u32,
    pub(super) profile: MigProfile,
}

/// A GPU instance that exists, with the MIG device of its first compute instance.
pub(super) struct LiveInstance {
    pub(super) handle: Raw<sys::nvmlGpuInstance_t>,
    pub(super) gi_id: u32,
    pub(super) profile_id: u32,
    pub(super) start: u32,
    pub(super) size: u32,
}

impl NvmlBackend {
    /// Every GPU with its MIG state, read under the MIG lock.
    pub(super) fn discover_gpus(&self) -> Result<Inventory, Error> {
        let s = self.session()?;
        let _mig = self.mig.lock().expect("mig lock");
        let driver = s
            .nvml
            .sys_driver_version()
            .map_err(dev_err("driver version"))?;
        let cuda = s
            .nvml
            .sys_cuda_driver_version()
            .map_err(dev_err("CUDA driver version"))?;
        let cuda = format!("{}.{}", cuda / 1000, (cuda % 1000) / 10);
        let gpus = s
            .gpus
            .iter()
            .map(|g| s.discover_gpu(g, &self.opts.sysfs_root, &driver, &cuda))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Inventory { gpus })
    }
}

impl Session {
    pub(super) fn addressing_mode(&self, g: &CachedGpu) -> Option<String> {
        let f = self.lib().nvmlDeviceGetAddressingMode.as_ref().ok()?;
        let mut mode = sys::nvmlDeviceAddressingMode_t {
            version: struct_version::<sys::nvmlDeviceAddressingMode_t>(1),
            value: 0,
        };
        // SAFETY: a valid handle and an out-struct of the declared version.
        Status::ok(unsafe { f(g.handle.0, &mut mode) }).ok()?;
        match mode.value {
            sys::nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_NONE => {
                Some("None".into())
            }
            sys::nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_HMM => {
                Some("HMM".into())
            }
            sys::nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_ATS => {
                Some("ATS".into())
            }
            _ => None,
        }
    }

    /// Every GPU-instance profile the GPU supports, with its possible placements.
    pub(super) fn gi_profiles(
        &self,
        g: &CachedGpu,
        model: Option<&GpuModel>,
    ) -> Result<Vec<NvmlProfile>, Error> {
        let lib = self.lib();
        let info_v = func(
            &lib.nvmlDeviceGetGpuInstanceProfileInfoV,
            "nvmlDeviceGetGpuInstanceProfileInfoV",
        )?;
        let placements_v2 = func(
            &lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2,
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
        )?;
        let mut out = Vec::new();
        for index in 0..sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
            // SAFETY: zeroed plain-old-data out-struct.
            let mut info: sys::nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
            info.version = struct_version::<sys::nvmlGpuInstanceProfileInfo_v2_t>(2);
            // SAFETY: valid handle, out-struct of the declared version.
            match Status::ok(unsafe { info_v(g.handle.0, index, &mut info as *mut _ as *mut _) }) {
                Ok(()) => {}
                Err(s)
                    if s.is(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED)
                        || s.is(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT) =>
                {
                    continue;
                }
                Err(s) => {
                    return Err(raw_err(format_args!(
                        "GPU instance profile {index} of gpu-{}",
                        g.minor
                    ))(s));
                }
            }
            let mut count = 0u32;
            // SAFETY: a null array asks for the count.
            Status::ok(unsafe {
                placements_v2(g.handle.0, info.id, std::ptr::null_mut(), &mut count)
            })
            .map_err(raw_err(format_args!(
                "placements of profile {} on gpu-{}",
                info.id, g.minor
            )))?;
            let mut places =
                vec![sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
            // SAFETY: the array holds `count` entries.
            Status::ok(unsafe {
                placements_v2(g.handle.0, info.id, places.as_mut_ptr(), &mut count)
            })
            .map_err(raw_err(format_args!(
                "placements of profile {} on gpu-{}",
                info.id, g.minor
            )))?;
            places.truncate(count as usize);
            let name = c_name(&info.name);
            let name = name.strip_prefix("MIG ").unwrap_or(&name).to_string();
            let known = model.and_then(|m| m.profile(&name));
            out.push(NvmlProfile {
                index,
                profile: MigProfile {
                    gi_profile_id: info.id,
                    compute_slices: info.sliceCount,
                    memory_slices: places.first().map(|p| p.size).unwrap_or(0),
                    memory_mib: info.memorySizeMB,
                    multiprocessors: info.multiprocessorCount,
                    copy_engines: info.copyEngineCount,
                    decoders: info.decoderCount,
                    encoders: info.encoderCount,
                    jpeg_engines: info.jpegCount,
                    ofa_engines: info.ofaCount,
                    max_instances: info.instanceCount,
                    placements: places.iter().map(|p| [p.start, p.size]).collect(),
                    inferred: known.map(|k| k.inferred.clone()).unwrap_or_default(),
                    name,
                },
            });
        }
        // Our table's order where we know the model (stable names and slices), NVML's otherwise.
        let rank = |p: &NvmlProfile| {
            model
                .and_then(|m| m.profiles.iter().position(|k| k.name == p.profile.name))
                .unwrap_or(usize::MAX)
        };
        out.sort_by_key(|p| (rank(p), p.profile.gi_profile_id));
        Ok(out)
    }

    /// GPU instances of `profile_id` that exist now.
    pub(super) fn gpu_instances(
        &self,
        g: &CachedGpu,
        profile: &MigProfile,
    ) -> Result<Vec<LiveInstance>, Error> {
        let lib = self.lib();
        let list = func(&lib.nvmlDeviceGetGpuInstances, "nvmlDeviceGetGpuInstances")?;
        let get_info = func(&lib.nvmlGpuInstanceGetInfo, "nvmlGpuInstanceGetInfo")?;
        let mut count = profile.max_instances.max(1);
        let mut handles: Vec<sys::nvmlGpuInstance_t> = vec![std::ptr::null_mut(); count as usize];
        // SAFETY: the array holds `count` entries.
        match Status::ok(unsafe {
            list(
                g.handle.0,
                profile.gi_profile_id,
                handles.as_mut_ptr(),
                &mut count,
            )
        }) {
            Ok(()) => {}
            // MIG mode off: there are none.
            Err(s) if s.is(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED) => return Ok(Vec::new()),
            Err(s) => {
                return Err(raw_err(format_args!(
                    "GPU instances of {} on gpu-{}",
                    profile.name, g.minor
                ))(s));
            }
        }
        handles.truncate(count as usize);
        let mut out = Vec::new();
        for h in handles {
            // SAFETY: zeroed out-struct, handle from NVML.
            let mut info: sys::nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
            Status::ok(unsafe { get_info(h, &mut info) }).map_err(raw_err(format_args!(
                "GPU instance info on gpu-{}",
                g.minor
            )))?;
            out.push(LiveInstance {
                handle: Raw(h),
                gi_id: info.id,
                profile_id: info.profileId,
                start: info.placement.start,
                size: info.placement.size,
            });
        }
        Ok(out)
    }

    /// MIG devices by (GPU instance, compute instance): their UUIDs.
    pub(super) fn mig_uuids(&self, g: &CachedGpu) -> Result<BTreeMap<(u32, u32), String>, Error> {
        let lib = self.lib();
        let max = func(
            &lib.nvmlDeviceGetMaxMigDeviceCount,
            "nvmlDeviceGetMaxMigDeviceCount",
        )?;
        let by_index = func(
            &lib.nvmlDeviceGetMigDeviceHandleByIndex,
            "nvmlDeviceGetMigDeviceHandleByIndex",
        )?;
        let gi_of = func(
            &lib.nvmlDeviceGetGpuInstanceId,
            "nvmlDeviceGetGpuInstanceId",
        )?;
        let ci_of = func(
            &lib.nvmlDeviceGetComputeInstanceId,
            "nvmlDeviceGetComputeInstanceId",
        )?;
        let mut n = 0u32;
        // SAFETY: valid handle and out-pointer.
        Status::ok(unsafe { max(g.handle.0, &mut n) })
            .map_err(raw_err(format_args!("MIG device count of gpu-{}", g.minor)))?;
        let mut out = BTreeMap::new();
        for i in 0..n {
            let mut mig: sys::nvmlDevice_t = std::ptr::null_mut();
            // SAFETY: valid handle and out-pointer.
            match Status::ok(unsafe { by_index(g.handle.0, i, &mut mig) }) {
                Ok(()) => {}
                Err(s)
                    if s.is(sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND)
                        || s.is(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
                        || s.is(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED) =>
                {
                    continue;
                }
                Err(s) => {
                    return Err(raw_err(format_args!("MIG device {i} of gpu-{}", g.minor))(
                        s,
                    ));
                }
            }
            let (mut gi, mut ci) = (0u32, 0u32);
            // SAFETY: a MIG device handle from NVML.
            Status::ok(unsafe { gi_of(mig, &mut gi) })
                .and_then(|_| Status::ok(unsafe { ci_of(mig, &mut ci) }))
                .map_err(raw_err(format_args!("MIG device {i} of gpu-{}", g.minor)))?;
            // SAFETY: as above; the wrapper only reads through the handle.
            let uuid = unsafe { Device::new(mig, &self.nvml) }
                .uuid()
                .map_err(dev_err(format_args!(
                    "UUID of MIG device {i} on gpu-{}",
                    g.minor
                )))?;
            out.insert((gi, ci), uuid);
        }
        Ok(out)
    }

    /// The MIG devices (GPU instance + its first compute instance) that exist on `g`.
    pub(super) fn mig_devices(
        &self,
        g: &CachedGpu,
        profiles: &[NvmlProfile],
    ) -> Result<Vec<MigDevice>, Error> {
        let uuids = self.mig_uuids(g)?;
        let mut out = Vec::new();
        for p in profiles {
            for inst in self.gpu_instances(g, &p.profile)? {
                match uuids.range((inst.gi_id, 0)..=(inst.gi_id, u32::MAX)).next() {
                    Some((&(_, ci_id), uuid)) => out.push(MigDevice {
                        profile: p.profile.name.clone(),
                        gi_profile_id: inst.profile_id,
                        placement_start: inst.start,
                        placement_size: inst.size,
                        uuid: uuid.clone(),
                        gi_id: inst.gi_id,
                        ci_id,
                    }),
                    None => warn!(
                        gpu = g.minor,
                        gi = inst.gi_id,
                        profile = %p.profile.name,
                        start = inst.start,
                        "GPU instance without a compute instance; not a usable MIG device"
                    ),
                }
            }
        }
        out.sort_by_key(|d| (d.placement_start, d.gi_profile_id));
        Ok(out)
    }

    pub(super) fn discover_gpu(
        &self,
        g: &CachedGpu,
        sysfs: &Path,
        driver: &str,
        cuda: &str,
    ) -> Result<Gpu, Error> {
        let d = self.device(g);
        let m = g.minor;
        let name = d.name().map_err(dev_err(format_args!("name of gpu-{m}")))?;
        let cc = d
            .cuda_compute_capability()
            .map_err(dev_err(format_args!("compute capability of gpu-{m}")))?;
        let pci = d
            .pci_info()
            .map_err(dev_err(format_args!("PCI info of gpu-{m}")))?;
        let memory = d
            .memory_info()
            .map_err(dev_err(format_args!("memory of gpu-{m}")))?;
        let bus_id = normalize_bus_id(&pci.bus_id);
        let model = profiles::catalog().iter().find(|c| c.product_name == name);
        let numa_node = match sysfs_numa_node(sysfs, &bus_id) {
            Some(n) => n,
            None => d.numa_node_id().ok().map(i64::from),
        };
        let mig = match self.mig_mode(g)? {
            None => None,
            Some(enabled) => {
                let mut found = self.gi_profiles(g, model)?;
                if found.is_empty()
                    && let Some(model) = model
                {
                    // Some drivers describe profiles only in MIG mode; our table knows them.
                    found = model
                        .profiles
                        .iter()
                        .map(|p| NvmlProfile {
                            index: u32::MAX,
                            profile: p.clone(),
                        })
                        .collect();
                }
                let devices = if enabled {
                    self.mig_devices(g, &found)?
                } else {
                    Vec::new()
                };
                let profiles: Vec<MigProfile> = found.into_iter().map(|p| p.profile).collect();
                Some(MigInfo {
                    enabled,
                    memory_slices: profiles
                        .iter()
                        .flat_map(|p| p.placements.iter().map(|[s, n]| s + n))
                        .max()
                        .or(model.map(|m| m.memory_slices))
                        .unwrap_or(0),
                    compute_slices: profiles
                        .iter()
                        .map(|p| p.compute_slices)
                        .max()
                        .or(model.map(|m| m.compute_slices))
                        .unwrap_or(0),
                    profiles,
                    devices,
                })
            }
        };
        Ok(Gpu {
            minor: m,
            index: g.index,
            uuid: g.uuid.clone(),
            brand: d
                .brand()
                .map(brand_name)
                .unwrap_or_else(|_| "Unknown".into()),
            architecture: architecture_name(d.architecture()),
            cuda_compute_capability: format!("{}.{}", cc.major, cc.minor),
            driver_version: driver.to_string(),
            cuda_driver_version: cuda.to_string(),
            memory_bytes: memory.total,
            // NVML does not report SMs of a whole GPU; our table does for known models.
            multiprocessors: model.map(|m| m.multiprocessors).unwrap_or(0),
            pcie_root: pcie_root_of(sysfs, &bus_id),
            pci_bus_id: bus_id,
            numa_node,
            addressing_mode: self.addressing_mode(g),
            product_name: name,
            mig,
            pci: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_lose_the_long_domain() {
        assert_eq!(normalize_bus_id("00000000:18:00.0\0"), "0000:18:00.0");
        assert_eq!(normalize_bus_id("0001:AB:00.0"), "0001:ab:00.0");
    }
}
