//! The NVML backend: the GPUs of a real node, read and changed through libnvidia-ml.
//!
//! One NVML session per process, opened on first use (so a node whose driver is not ready yet
//! makes discovery fail with the reason, and a later retry succeeds) and kept for the process
//! lifetime with the GPU handles cached. MIG geometry (GPU-instance profiles and their possible
//! placements) comes from NVML itself; our profile table only fills in what NVML cannot say.
//! Calls that NVML's safe wrapper lacks (GPU/compute instances, placements, addressing mode,
//! events) go through the `nvml-wrapper-sys` function table of the same loaded library.
//!
//! `discovery` reads GPUs and MIG state into the inventory, `mig` creates and destroys MIG
//! devices, `events` watches health; this file holds the session and the port's implementation.
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dra_plugin_core::Error;
use dra_plugin_core::backend::{ComputeMode, DeviceBackend, HealthEvent};
use gpu_dra_api::inventory::{Inventory, MigDevice};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;
use tracing::info;

mod discovery;
mod events;
mod mig;

use events::Events;

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
        .map(|c| c.to_ne_bytes()[0])
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

const fn struct_version<T>(v: u32) -> u32 {
    let size = std::mem::size_of::<T>();
    assert!(
        size < 1 << 24,
        "NVML keeps a struct's size in the low 24 bits"
    );
    #[allow(
        clippy::cast_possible_truncation,
        reason = "below 2^24, asserted just above (`u32::try_from` is not const)"
    )]
    let size = size as u32;
    size | (v << 24)
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
}

impl DeviceBackend for NvmlBackend {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn discover(&self) -> Result<Inventory, Error> {
        self.discover_gpus()
    }

    fn create_mig(
        &self,
        parent_minor: u32,
        gi_profile_id: u32,
        placement_start: u32,
    ) -> Result<MigDevice, Error> {
        self.create_mig_device(parent_minor, gi_profile_id, placement_start)
    }

    fn destroy_mig(
        &self,
        parent_minor: u32,
        gi_profile_id: u32,
        placement_start: u32,
    ) -> Result<(), Error> {
        self.destroy_mig_device(parent_minor, gi_profile_id, placement_start)
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

    /// The driver root NVML was loaded from; `/` when the loader's search path found it.
    fn driver_root(&self) -> Option<PathBuf> {
        Some(
            self.opts
                .driver_root
                .clone()
                .unwrap_or_else(|| PathBuf::from("/")),
        )
    }

    fn health_events(&self, timeout: Duration) -> Result<Vec<HealthEvent>, Error> {
        self.wait_health_events(timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
