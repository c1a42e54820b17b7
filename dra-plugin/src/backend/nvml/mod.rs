//! The NVML backend: the GPUs of a real node, read and changed through libnvidia-ml.
//!
//! One NVML session per process, opened on first use (so a node whose driver is not ready yet
//! makes discovery fail with the reason, and a later retry succeeds) and kept for the process
//! lifetime with the GPU handles cached. MIG geometry (GPU-instance profiles and their possible
//! placements) comes from NVML itself; our profile table only fills in what NVML cannot say.
//! Calls that NVML's safe wrapper lacks (GPU/compute instances, placements, addressing mode,
//! events) go through the `nvml-wrapper-sys` function table of the same loaded library.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpu_dra_api::inventory::{Gpu, Inventory, MigDevice, MigInfo};
use gpu_dra_api::profiles::{self, GpuModel, MigProfile};
use nvml_wrapper::enum_wrappers::device::Brand;
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;
use tracing::{info, warn};

use super::{ComputeMode, DeviceBackend, HealthEvent, HealthEventKind};
use crate::Error;

/// Where libnvidia-ml lives under a driver root, in the order tried.
const LIB_DIRS: &[&str] = &[
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib",
    "lib64",
    "lib",
];
const LIB_NAME: &str = "libnvidia-ml.so.1";

/// How the backend finds NVML and what it may change.
#[derive(Debug, Clone)]
pub struct NvmlOptions {
    /// Root of the driver installation (`/run/nvidia/driver` for operator-installed drivers);
    /// `None` loads `libnvidia-ml.so.1` through the dynamic loader's search path.
    pub driver_root: Option<PathBuf>,
    /// Where the host's sysfs is mounted (NUMA node and PCIe root of each GPU).
    pub sysfs_root: PathBuf,
    /// Whether creating a MIG device may switch a GPU into MIG mode.
    pub enable_mig_mode: bool,
}

impl NvmlOptions {
    /// Defaults, with `HOST_SYSFS_ROOT` (default `/sys`) for containers that mount the host's
    /// sysfs elsewhere.
    pub fn new(driver_root: Option<PathBuf>) -> Self {
        NvmlOptions {
            driver_root,
            sysfs_root: std::env::var_os("HOST_SYSFS_ROOT")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/sys")),
            enable_mig_mode: true,
        }
    }

    /// The library paths to try, or why there are none.
    pub fn library_candidates(&self) -> Result<Vec<PathBuf>, Error> {
        let Some(root) = &self.driver_root else {
            return Ok(vec![PathBuf::from(LIB_NAME)]);
        };
        let found: Vec<PathBuf> = LIB_DIRS
            .iter()
            .map(|d| root.join(d).join(LIB_NAME))
            .filter(|p| p.exists())
            .collect();
        if found.is_empty() {
            return Err(Error::Device(format!(
                "cannot load NVML: no {LIB_NAME} under driver root {} (looked in {}); is the NVIDIA driver installed there?",
                root.display(),
                LIB_DIRS.join(", ")
            )));
        }
        Ok(found)
    }
}

/// A raw NVML handle; NVML handles are valid for the whole session and NVML is thread-safe.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Raw<T>(T);
unsafe impl<T> Send for Raw<T> {}
unsafe impl<T> Sync for Raw<T> {}

struct CachedGpu {
    index: u32,
    minor: u32,
    uuid: String,
    handle: Raw<sys::nvmlDevice_t>,
}

/// An open NVML session and the GPUs it saw when it opened.
struct Session {
    nvml: Nvml,
    library: PathBuf,
    gpus: Vec<CachedGpu>,
}

struct Events {
    set: Raw<sys::nvmlEventSet_t>,
}

/// One long-lived NVML session; MIG changes are serialized, NVML calls run on blocking threads.
pub struct NvmlBackend {
    opts: NvmlOptions,
    session: Mutex<Option<Arc<Session>>>,
    /// Held while reading or changing MIG state, so discovery never sees half a change.
    mig: Mutex<()>,
    events: Mutex<Option<Events>>,
}

/// An NVML return code from a raw call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Status(sys::nvmlReturn_t);

impl Status {
    fn ok(code: sys::nvmlReturn_t) -> Result<(), Status> {
        if code == sys::nvmlReturn_enum_NVML_SUCCESS {
            Ok(())
        } else {
            Err(Status(code))
        }
    }

    fn is(self, code: sys::nvmlReturn_t) -> bool {
        self.0 == code
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = match self.0 {
            sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => "uninitialized",
            sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => "invalid argument",
            sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => "not supported",
            sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => "insufficient permissions",
            sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND => "not found",
            sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => "insufficient size",
            sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT => "timeout",
            sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => "GPU is lost",
            sys::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED => "GPU reset required",
            sys::nvmlReturn_enum_NVML_ERROR_IN_USE => "in use",
            sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES => "insufficient resources",
            sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH => {
                "argument version mismatch"
            }
            _ => "error",
        };
        write!(f, "{text} (NVML return code {})", self.0)
    }
}

fn dev_err(what: impl std::fmt::Display) -> impl Fn(NvmlError) -> Error {
    move |e| Error::Device(format!("NVML {what}: {e}"))
}

fn raw_err(what: impl std::fmt::Display) -> impl Fn(Status) -> Error {
    move |s| Error::Device(format!("NVML {what}: {s}"))
}

/// A function of the loaded library; a missing one is an error, never a panic.
fn func<'a, T>(f: &'a Result<T, impl std::fmt::Display>, name: &str) -> Result<&'a T, Error> {
    f.as_ref().map_err(|e| {
        Error::Device(format!(
            "the loaded libnvidia-ml has no {name} ({e}); the driver is too old for this plugin"
        ))
    })
}

fn c_name(buf: &[std::os::raw::c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

const fn struct_version<T>(v: u32) -> u32 {
    std::mem::size_of::<T>() as u32 | (v << 24)
}

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
    let same = existing
        .iter()
        .filter(|d| d.gi_profile_id == profile.gi_profile_id)
        .count() as u32;
    if same >= profile.max_instances {
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

/// A GPU-instance profile as NVML reports it.
#[derive(Debug, Clone)]
struct NvmlProfile {
    /// `NVML_GPU_INSTANCE_PROFILE_*`, what GetGpuInstanceProfileInfo takes.
    #[allow(dead_code)]
    index: u32,
    profile: MigProfile,
}

/// A GPU instance that exists, with the MIG device of its first compute instance.
struct LiveInstance {
    handle: Raw<sys::nvmlGpuInstance_t>,
    gi_id: u32,
    profile_id: u32,
    start: u32,
    size: u32,
}

impl NvmlBackend {
    /// Loads `libnvidia-ml.so.1` from `driver_root` (or the loader's search path) on first use.
    /// Never fails: a missing or broken driver shows up as a discovery error with the reason,
    /// which the caller retries.
    pub fn new(driver_root: Option<PathBuf>) -> Result<Self, Error> {
        Ok(Self::with_options(NvmlOptions::new(driver_root)))
    }

    pub fn with_options(opts: NvmlOptions) -> Self {
        NvmlBackend {
            opts,
            session: Mutex::new(None),
            mig: Mutex::new(()),
            events: Mutex::new(None),
        }
    }

    /// Opens the session now (for callers that want to fail fast, e.g. `slices`).
    pub fn connect(&self) -> Result<PathBuf, Error> {
        Ok(self.session()?.library.clone())
    }

    fn session(&self) -> Result<Arc<Session>, Error> {
        let mut slot = self.session.lock().expect("nvml session lock");
        if let Some(s) = slot.as_ref() {
            return Ok(s.clone());
        }
        let s = Arc::new(self.open()?);
        info!(library = %s.library.display(), gpus = s.gpus.len(), "NVML session open");
        *slot = Some(s.clone());
        Ok(s)
    }

    fn open(&self) -> Result<Session, Error> {
        let mut failures = Vec::new();
        for lib in self.opts.library_candidates()? {
            match Nvml::builder().lib_path(lib.as_os_str()).init() {
                Ok(nvml) => {
                    let gpus = cache_gpus(&nvml)?;
                    if gpus.is_empty() {
                        return Err(Error::Device(format!(
                            "NVML ({}) sees no GPUs; not publishing an empty pool",
                            lib.display()
                        )));
                    }
                    return Ok(Session {
                        nvml,
                        library: lib,
                        gpus,
                    });
                }
                Err(e) => failures.push(format!("{}: {e}", lib.display())),
            }
        }
        Err(Error::Device(format!(
            "cannot initialise NVML ({})",
            failures.join("; ")
        )))
    }
}

fn cache_gpus(nvml: &Nvml) -> Result<Vec<CachedGpu>, Error> {
    let count = nvml.device_count().map_err(dev_err("device count"))?;
    let mut gpus = Vec::new();
    for index in 0..count {
        let d = nvml
            .device_by_index(index)
            .map_err(dev_err(format_args!("device {index}")))?;
        gpus.push(CachedGpu {
            index,
            minor: d
                .minor_number()
                .map_err(dev_err(format_args!("minor number of device {index}")))?,
            uuid: d
                .uuid()
                .map_err(dev_err(format_args!("UUID of device {index}")))?,
            // SAFETY: the handle stays valid for the session, which owns `nvml`.
            handle: Raw(unsafe { d.handle() }),
        });
    }
    Ok(gpus)
}

impl Session {
    fn device(&self, g: &CachedGpu) -> Device<'_> {
        // SAFETY: the handle came from this session's NVML.
        unsafe { Device::new(g.handle.0, &self.nvml) }
    }

    fn gpu(&self, minor: u32) -> Result<&CachedGpu, Error> {
        self.gpus
            .iter()
            .find(|g| g.minor == minor)
            .ok_or_else(|| Error::Device(format!("no GPU with minor {minor}")))
    }

    fn lib(&self) -> &sys::NvmlLib {
        self.nvml.lib()
    }

    /// `Some(current)` for MIG-capable GPUs, `None` for the others.
    fn mig_mode(&self, g: &CachedGpu) -> Result<Option<bool>, Error> {
        match self.device(g).mig_mode() {
            Ok(m) => Ok(Some(m.current == sys::NVML_DEVICE_MIG_ENABLE)),
            Err(NvmlError::NotSupported) => Ok(None),
            Err(e) => Err(dev_err(format_args!("MIG mode of gpu-{}", g.minor))(e)),
        }
    }

    fn addressing_mode(&self, g: &CachedGpu) -> Option<String> {
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
    fn gi_profiles(
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
    fn gpu_instances(
        &self,
        g: &CachedGpu,
        profile: &MigProfile,
    ) -> Result<Vec<LiveInstance>, Error> {
        let lib = self.lib();
        let list = func(&lib.nvmlDeviceGetGpuInstances, "nvmlDeviceGetGpuInstances")?;
        let get_info = func(&lib.nvmlGpuInstanceGetInfo, "nvmlGpuInstanceGetInfo")?;
        let mut handles: Vec<sys::nvmlGpuInstance_t> =
            vec![std::ptr::null_mut(); profile.max_instances.max(1) as usize];
        let mut count = handles.len() as u32;
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
    fn mig_uuids(&self, g: &CachedGpu) -> Result<BTreeMap<(u32, u32), String>, Error> {
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
    fn mig_devices(
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

    fn discover_gpu(
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
        })
    }

    /// Switches MIG mode on, if it is not on already.
    fn ensure_mig_mode(&self, g: &CachedGpu, allowed: bool) -> Result<(), Error> {
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
    fn leave_mig_mode_if_unused(
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
    fn full_ci_profile(&self, gi: sys::nvmlGpuInstance_t, slices: u32) -> Result<u32, Error> {
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
    fn create_ci(&self, gi: sys::nvmlGpuInstance_t, slices: u32) -> Result<u32, Error> {
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
    fn destroy_instance(&self, gi: sys::nvmlGpuInstance_t) -> Result<(), Error> {
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
            let mut cis: Vec<sys::nvmlComputeInstance_t> = vec![std::ptr::null_mut(); 8];
            let mut count = cis.len() as u32;
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

impl DeviceBackend for NvmlBackend {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn discover(&self) -> Result<Inventory, Error> {
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

    fn create_mig(
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

    fn destroy_mig(
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

    fn set_compute_mode(&self, gpu_minor: u32, mode: ComputeMode) -> Result<(), Error> {
        use nvml_wrapper::enum_wrappers::device::ComputeMode as Nvml;
        let s = self.session()?;
        let g = s.gpu(gpu_minor)?;
        let mut d = s.device(g);
        let want = match mode {
            ComputeMode::Default => Nvml::Default,
            ComputeMode::ExclusiveProcess => Nvml::ExclusiveProcess,
        };
        if d.compute_mode().is_ok_and(|m| m == want) {
            return Ok(());
        }
        d.set_compute_mode(want).map_err(dev_err(format_args!(
            "setting compute mode {mode:?} on gpu-{gpu_minor}"
        )))?;
        info!(gpu = gpu_minor, ?mode, "compute mode set");
        Ok(())
    }

    fn health_events(&self, timeout: Duration) -> Result<Vec<HealthEvent>, Error> {
        let s = self.session()?;
        let mut events = self.events.lock().expect("events lock");
        let mut out = Vec::new();
        if events.is_none() {
            *events = Some(self.register_events(&s, &mut out)?);
        }
        let set = events.as_ref().expect("just set").set;
        let wait = func(&s.lib().nvmlEventSetWait_v2, "nvmlEventSetWait_v2")?;
        let mut ms = timeout.as_millis().min(u32::MAX as u128) as u32;
        loop {
            // SAFETY: zeroed out-struct, event set from this session.
            let mut data: sys::nvmlEventData_t = unsafe { std::mem::zeroed() };
            match Status::ok(unsafe { wait(set.0, &mut data, ms) }) {
                Ok(()) => {
                    let Some(g) = s.gpus.iter().find(|g| g.handle.0 == data.device) else {
                        continue;
                    };
                    let kind = match data.eventType {
                        t if t == u64::from(sys::nvmlEventTypeXidCriticalError) => {
                            HealthEventKind::Xid(data.eventData)
                        }
                        t if t == u64::from(sys::nvmlEventTypeDoubleBitEccError) => {
                            HealthEventKind::DoubleBitEcc
                        }
                        _ => continue,
                    };
                    let mig = (data.gpuInstanceId != u32::MAX
                        && data.computeInstanceId != u32::MAX)
                        .then_some((data.gpuInstanceId, data.computeInstanceId));
                    out.push(HealthEvent {
                        minor: g.minor,
                        uuid: g.uuid.clone(),
                        kind,
                        mig,
                    });
                    ms = 0; // drain what is queued, then return
                }
                Err(st) if st.is(sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT) => return Ok(out),
                Err(st) if st.is(sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST) => {
                    let lost: Vec<&CachedGpu> = s
                        .gpus
                        .iter()
                        .filter(|g| matches!(s.device(g).uuid(), Err(NvmlError::GpuLost)))
                        .collect();
                    // NVML did not say which: all of them are suspect.
                    let lost = if lost.is_empty() {
                        s.gpus.iter().collect()
                    } else {
                        lost
                    };
                    out.extend(lost.into_iter().map(|g| HealthEvent {
                        minor: g.minor,
                        uuid: g.uuid.clone(),
                        kind: HealthEventKind::GpuLost,
                        mig: None,
                    }));
                    return Ok(out);
                }
                Err(st) => return Err(raw_err("waiting for events")(st)),
            }
        }
    }
}

impl NvmlBackend {
    fn register_events(&self, s: &Session, early: &mut Vec<HealthEvent>) -> Result<Events, Error> {
        let lib = s.lib();
        let create = func(&lib.nvmlEventSetCreate, "nvmlEventSetCreate")?;
        let supported = func(
            &lib.nvmlDeviceGetSupportedEventTypes,
            "nvmlDeviceGetSupportedEventTypes",
        )?;
        let register = func(&lib.nvmlDeviceRegisterEvents, "nvmlDeviceRegisterEvents")?;
        let mut set: sys::nvmlEventSet_t = std::ptr::null_mut();
        // SAFETY: out-pointer.
        Status::ok(unsafe { create(&mut set) }).map_err(raw_err("creating an event set"))?;
        let wanted =
            u64::from(sys::nvmlEventTypeXidCriticalError | sys::nvmlEventTypeDoubleBitEccError);
        for g in &s.gpus {
            let mut types = 0u64;
            // SAFETY: valid handle and out-pointer.
            let r = Status::ok(unsafe { supported(g.handle.0, &mut types) })
                .and_then(|_| Status::ok(unsafe { register(g.handle.0, types & wanted, set) }));
            match r {
                Ok(()) => {}
                Err(st) if st.is(sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST) => {
                    early.push(HealthEvent {
                        minor: g.minor,
                        uuid: g.uuid.clone(),
                        kind: HealthEventKind::GpuLost,
                        mig: None,
                    });
                }
                Err(st) => {
                    warn!(gpu = g.minor, error = %st, "cannot watch this GPU's health");
                    early.push(HealthEvent {
                        minor: g.minor,
                        uuid: g.uuid.clone(),
                        kind: HealthEventKind::Unmonitored,
                        mig: None,
                    });
                }
            }
        }
        Ok(Events { set: Raw(set) })
    }
}

impl Drop for NvmlBackend {
    fn drop(&mut self) {
        if let (Ok(Some(ev)), Ok(Some(s))) = (self.events.get_mut(), self.session.get_mut())
            && let Ok(free) = s.lib().nvmlEventSetFree.as_ref()
        {
            // SAFETY: the set belongs to this session and is not used after this.
            unsafe { free(ev.set.0) };
        }
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

    #[test]
    fn a_missing_driver_root_says_where_it_looked() {
        let dir = tempfile::tempdir().unwrap();
        let b = NvmlBackend::new(Some(dir.path().join("nope"))).unwrap();
        let e = b.discover().unwrap_err().to_string();
        assert!(
            e.contains("no libnvidia-ml.so.1 under driver root") && e.contains("usr/lib64"),
            "{e}"
        );
        assert!(b.create_mig(0, 19, 0).is_err());
    }

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
