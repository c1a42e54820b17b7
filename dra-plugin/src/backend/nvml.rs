//! The NVML backend: the GPUs of a real node, read through libnvidia-ml.
use std::path::PathBuf;
use std::sync::Mutex;

use gpu_dra_api::inventory::{Gpu, Inventory, MigDevice, MigInfo};
use gpu_dra_api::profiles;
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::Brand;
use nvml_wrapper::enums::device::DeviceArchitecture;

use super::DeviceBackend;
use crate::Error;

/// One long-lived NVML session; NVML calls are serialized here and run on blocking threads.
pub struct NvmlBackend {
    nvml: Mutex<Nvml>,
}

impl NvmlBackend {
    /// Loads `libnvidia-ml.so.1` from `driver_root` (e.g. `/run/nvidia/driver`) or the default path.
    pub fn new(driver_root: Option<PathBuf>) -> Result<Self, Error> {
        let candidates: Vec<PathBuf> = match &driver_root {
            Some(root) => [
                "usr/lib64",
                "usr/lib/x86_64-linux-gnu",
                "usr/lib/aarch64-linux-gnu",
                "usr/lib",
                "lib64",
                "lib",
            ]
            .iter()
            .map(|d| root.join(d).join("libnvidia-ml.so.1"))
            .collect(),
            None => vec![PathBuf::from("libnvidia-ml.so.1")],
        };
        let mut last = String::from("no candidate library path");
        for lib in candidates {
            if driver_root.is_some() && !lib.exists() {
                continue;
            }
            match Nvml::builder().lib_path(lib.as_os_str()).init() {
                Ok(nvml) => {
                    return Ok(NvmlBackend {
                        nvml: Mutex::new(nvml),
                    });
                }
                Err(e) => last = format!("{}: {e}", lib.display()),
            }
        }
        Err(Error::Device(format!("cannot initialise NVML ({last})")))
    }
}

fn nvml_err(what: &str) -> impl Fn(nvml_wrapper::error::NvmlError) -> Error + '_ {
    move |e| Error::Device(format!("NVML {what}: {e}"))
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

/// The PCIe root complex a device hangs off, from sysfs (`/sys/bus/pci/devices/<id>` links into
/// `/sys/devices/pci<domain>:<bus>/...`).
fn pcie_root_of(bus_id: &str) -> Option<String> {
    let target = std::fs::canonicalize(format!("/sys/bus/pci/devices/{bus_id}")).ok()?;
    target
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .find(|c| c.starts_with("pci"))
        .map(str::to_string)
}

impl DeviceBackend for NvmlBackend {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn discover(&self) -> Result<Inventory, Error> {
        let nvml = self.nvml.lock().expect("nvml lock");
        let driver_version = nvml
            .sys_driver_version()
            .map_err(nvml_err("driver version"))?;
        let cuda = nvml
            .sys_cuda_driver_version()
            .map_err(nvml_err("CUDA driver version"))?;
        let cuda_driver_version = format!("{}.{}", cuda / 1000, (cuda % 1000) / 10);
        let count = nvml.device_count().map_err(nvml_err("device count"))?;
        let mut gpus = Vec::new();
        for index in 0..count {
            let d = nvml
                .device_by_index(index)
                .map_err(nvml_err("device handle"))?;
            let name = d.name().map_err(nvml_err("name"))?;
            let cc = d
                .cuda_compute_capability()
                .map_err(nvml_err("compute capability"))?;
            let pci = d.pci_info().map_err(nvml_err("PCI info"))?;
            let memory = d.memory_info().map_err(nvml_err("memory info"))?;
            let architecture = match d.architecture() {
                Ok(DeviceArchitecture::Ada) => "Ada Lovelace".to_string(),
                Ok(a) => a.to_string(),
                Err(_) => "Unknown".to_string(),
            };
            // MIG geometry comes from our profiles of the same product; the live MIG devices
            // come from the GPU itself.
            let model = profiles::catalog().iter().find(|m| m.product_name == name);
            let mig = match (d.mig_mode(), model) {
                (Ok(mode), Some(m)) if m.mig_capable => Some(MigInfo {
                    enabled: mode.current == 1,
                    memory_slices: m.memory_slices,
                    compute_slices: m.compute_slices,
                    profiles: m.profiles.clone(),
                    devices: Vec::<MigDevice>::new(),
                }),
                _ => None,
            };
            let bus_id = pci.bus_id.trim_end_matches('\0').to_ascii_lowercase();
            // NVML prints an 8-digit domain; the standard attribute uses 4.
            let bus_id = match bus_id.split_once(':') {
                Some((domain, rest)) if domain.len() == 8 => format!("{}:{rest}", &domain[4..]),
                _ => bus_id,
            };
            gpus.push(Gpu {
                minor: d.minor_number().map_err(nvml_err("minor number"))?,
                index,
                uuid: d.uuid().map_err(nvml_err("UUID"))?,
                product_name: name,
                brand: d
                    .brand()
                    .map(brand_name)
                    .unwrap_or_else(|_| "Unknown".into()),
                architecture,
                cuda_compute_capability: format!("{}.{}", cc.major, cc.minor),
                driver_version: driver_version.clone(),
                cuda_driver_version: cuda_driver_version.clone(),
                memory_bytes: memory.total,
                multiprocessors: model.map(|m| m.multiprocessors).unwrap_or(0),
                pcie_root: pcie_root_of(&bus_id),
                pci_bus_id: bus_id,
                numa_node: None,
                addressing_mode: None,
                mig,
            });
        }
        Ok(Inventory { gpus })
    }

    fn create_mig(
        &self,
        parent_minor: u32,
        gi_profile_id: u32,
        placement_start: u32,
    ) -> Result<MigDevice, Error> {
        Err(Error::Device(format!(
            "creating MIG devices through NVML is not available in this build (gpu-{parent_minor}, profile {gi_profile_id} at {placement_start})"
        )))
    }

    fn destroy_mig(
        &self,
        parent_minor: u32,
        gi_profile_id: u32,
        placement_start: u32,
    ) -> Result<(), Error> {
        Err(Error::Device(format!(
            "destroying MIG devices through NVML is not available in this build (gpu-{parent_minor}, profile {gi_profile_id} at {placement_start})"
        )))
    }
}
