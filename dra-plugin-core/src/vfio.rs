//! VFIO passthrough on the PCI bus (feature gate `PassthroughSupport`): moving a GPU's PCI
//! function between the `nvidia` and `vfio-pci` drivers through sysfs, and what a container needs
//! to reach it (`/dev/vfio/<group>`, or the iommufd cdev).
//!
//! The driver change is NVIDIA's (`vfio-device.go: changeDriver`, go-nvlib's `nvpassthrough`):
//! clear `driver_override`, write the address to the current driver's `unbind`, set
//! `driver_override` to the new driver, write the address to its `bind`. Unprepare always goes
//! back to `nvidia`, as NVIDIA's `Unconfigure` does. The sysfs and /dev roots are configurable so
//! a test can hand in a fake tree; after each write we wait for the `driver` link to follow,
//! which a real kernel has done by the time the write returns and a test's fake kernel does soon.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpu_dra_api::config::{IommuBackendPolicy, VfioDeviceConfig};
use gpu_dra_api::passthrough::PciFunction;

use crate::Error;
use crate::cdi::{ContainerEdits, DeviceNode, Spec};

pub const NVIDIA_DRIVER: &str = "nvidia";
pub const VFIO_PCI_DRIVER: &str = "vfio-pci";
/// NVIDIA's `driverChangeTimeout`: a driver change stuck in the kernel fails the call after this.
pub const DRIVER_CHANGE_TIMEOUT: Duration = Duration::from_secs(15);

/// The host's PCI bus and device nodes, as the plugin sees them.
#[derive(Debug, Clone)]
pub struct PciBus {
    /// `/sys`, or where the host's sysfs is mounted.
    pub sysfs: PathBuf,
    /// `/dev`, or where the host's device nodes are.
    pub dev: PathBuf,
    pub settle_timeout: Duration,
}

impl PciBus {
    pub fn new(sysfs: impl Into<PathBuf>, dev: impl Into<PathBuf>) -> Self {
        PciBus {
            sysfs: sysfs.into(),
            dev: dev.into(),
            settle_timeout: DRIVER_CHANGE_TIMEOUT,
        }
    }

    pub fn device_dir(&self, addr: &str) -> PathBuf {
        self.sysfs.join("bus/pci/devices").join(addr)
    }

    pub fn driver_dir(&self, driver: &str) -> PathBuf {
        self.sysfs.join("bus/pci/drivers").join(driver)
    }

    /// The driver the function is bound to; `None` when unbound.
    pub fn driver_of(&self, addr: &str) -> Result<Option<String>, Error> {
        let link = self.device_dir(addr).join("driver");
        match std::fs::read_link(&link) {
            Ok(target) => Ok(target.file_name().map(|n| n.to_string_lossy().into_owned())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("reading the driver link", &link, e)),
        }
    }

    /// The function's IOMMU group, from its `iommu_group` link.
    pub fn iommu_group(&self, addr: &str) -> Result<u32, Error> {
        let link = self.device_dir(addr).join("iommu_group");
        let target = std::fs::read_link(&link)
            .map_err(|e| Error::io("reading the IOMMU group", &link, e))?;
        target
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| {
                Error::Device(format!(
                    "{}: points at {}, not at an IOMMU group number",
                    link.display(),
                    target.display()
                ))
            })
    }

    /// The iommufd cdev (`vfioN`) the kernel made for a function bound to a VFIO driver.
    pub fn iommufd_cdev(&self, addr: &str) -> Result<String, Error> {
        let dir = self.device_dir(addr).join("vfio-dev");
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| Error::io("reading the vfio-dev directory", &dir, e))?;
        entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with("vfio"))
            .ok_or_else(|| Error::Device(format!("{}: missing iommufd cdev", dir.display())))
    }

    /// The function's PCI facts from sysfs (`vendor`, `device`, `iommu_group`, `resource`), as
    /// go-nvlib's nvpci reads them; `None` when the device directory is missing.
    pub fn pci_function(&self, addr: &str) -> Option<PciFunction> {
        let dev = self.device_dir(addr);
        let hex = |f: &str| {
            let s = std::fs::read_to_string(dev.join(f)).ok()?;
            u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
        };
        // 64-bit memory BARs (flags bit 2) among the first six resources, rounded up together.
        let bars: u64 = std::fs::read_to_string(dev.join("resource"))
            .unwrap_or_default()
            .lines()
            .take(6)
            .filter_map(|l| {
                let v: Vec<u64> = l
                    .split_whitespace()
                    .filter_map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).ok())
                    .collect();
                (v.len() == 3 && v[2] & 0x6 == 0x4 && v[1] > v[0]).then(|| v[1] - v[0] + 1)
            })
            .sum();
        Some(PciFunction {
            vendor_id: hex("vendor")?,
            device_id: hex("device")?,
            iommu_group: self.iommu_group(addr).ok(),
            addressable_memory_bytes: if bars == 0 {
                0
            } else {
                bars.next_power_of_two()
            },
            iommufd: self.iommufd_enabled(),
        })
    }

    /// Whether the node has the iommufd API device, NVIDIA's test for iommufd support.
    pub fn iommufd_enabled(&self) -> bool {
        self.dev.join("iommu").exists()
    }

    /// Binds the function to `vfio-pci` (NVIDIA's `Configure`): only from `nvidia` or unbound (a
    /// change cut short), never with SR-IOV VFs enabled.
    pub fn configure(&self, addr: &str) -> Result<(), Error> {
        let vfio = self.driver_dir(VFIO_PCI_DRIVER);
        if !vfio.is_dir() {
            return Err(Error::Device(format!(
                "{}: no such driver directory; is the vfio-pci module loaded?",
                vfio.display()
            )));
        }
        match self.driver_of(addr)?.as_deref() {
            Some(VFIO_PCI_DRIVER) => return Ok(()),
            None | Some(NVIDIA_DRIVER) => {}
            Some(other) => {
                return Err(Error::Device(format!(
                    "GPU {addr} is bound to {other:?} ({}), expected {VFIO_PCI_DRIVER:?} or \
                     {NVIDIA_DRIVER:?}",
                    self.device_dir(addr).join("driver").display()
                )));
            }
        }
        self.check_no_vfs(addr)?;
        self.change_driver(addr, VFIO_PCI_DRIVER)
    }

    /// Binds the function back to `nvidia` (NVIDIA's `Unconfigure`); already there is fine.
    pub fn unconfigure(&self, addr: &str) -> Result<(), Error> {
        self.change_driver(addr, NVIDIA_DRIVER)
    }

    fn check_no_vfs(&self, addr: &str) -> Result<(), Error> {
        let path = self.device_dir(addr).join("sriov_numvfs");
        let vfs = match std::fs::read_to_string(&path) {
            Ok(s) => s.trim().parse::<u32>().unwrap_or(0),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(Error::io("reading the VF count", &path, e)),
        };
        match vfs {
            0 => Ok(()),
            n => Err(Error::Device(format!(
                "{}: GPU {addr} has {n} VFs, cannot unbind",
                path.display()
            ))),
        }
    }

    /// NVIDIA's `changeDriver`: unbind from the current driver (if any), then bind to `driver`.
    fn change_driver(&self, addr: &str, driver: &str) -> Result<(), Error> {
        let dev = self.device_dir(addr);
        if !dev.is_dir() {
            return Err(Error::Device(format!(
                "{}: no such PCI device",
                dev.display()
            )));
        }
        let current = self.driver_of(addr)?;
        if current.as_deref() == Some(driver) {
            return Ok(());
        }
        let override_path = dev.join("driver_override");
        if current.is_some() {
            write(&override_path, "\n", "clearing driver_override")?;
            write(&dev.join("driver/unbind"), addr, "unbinding the GPU")?;
            self.settle(addr, None)?;
        }
        write(&override_path, driver, "setting driver_override")?;
        write(
            &self.driver_dir(driver).join("bind"),
            addr,
            "binding the GPU",
        )?;
        self.settle(addr, Some(driver))
    }

    /// Waits until the `driver` link says `want`.
    fn settle(&self, addr: &str, want: Option<&str>) -> Result<(), Error> {
        let deadline = Instant::now() + self.settle_timeout;
        loop {
            let now = self.driver_of(addr)?;
            if now.as_deref() == want {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Device(format!(
                    "{}: still {:?} after {:?}, want {:?}; check the kernel log",
                    self.device_dir(addr).join("driver").display(),
                    now,
                    self.settle_timeout,
                    want
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn write(path: &Path, value: &str, what: &'static str) -> Result<(), Error> {
    std::fs::write(path, value).map_err(|e| Error::io(what, path, e))
}

/// How one passthrough device of a claim was prepared: what its CDI device needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfioPrepared {
    pub device_name: String,
    /// `/dev/vfio/<group>` or `/dev/vfio/devices/vfioN`.
    pub device_node: String,
}

/// Whether the claim's config picks iommufd and the node has it (NVIDIA's `PreferIommuFD`).
pub fn use_iommufd(config: &VfioDeviceConfig, bus: &PciBus) -> bool {
    config
        .iommu
        .as_ref()
        .and_then(|i| i.backend_policy)
        .is_some_and(|p| p == IommuBackendPolicy::PreferIommuFD)
        && bus.iommufd_enabled()
}

/// The device node of one bound function (`vfio-cdi.go: GetDeviceSpecsByPCIBusID`).
pub fn device_node(bus: &PciBus, addr: &str, iommufd: bool) -> Result<String, Error> {
    Ok(match iommufd {
        true => format!("/dev/vfio/devices/{}", bus.iommufd_cdev(addr)?),
        false => format!("/dev/vfio/{}", bus.iommu_group(addr)?),
    })
}

/// Makes a claim's spec what NVIDIA's is for passthrough devices (`vfio-cdi.go`): each VFIO
/// device carries only its node; the spec-wide edits become `NVIDIA_VISIBLE_DEVICES=void` plus
/// the IOMMU API device when `enableAPIDevice` asks (`/dev/iommu` with iommufd, else
/// `/dev/vfio/vfio`). A claim that also holds GPUs keeps their control nodes.
pub fn apply_to_spec(
    spec: &mut Spec,
    claim_uid: &str,
    vfio: &[VfioPrepared],
    config: &VfioDeviceConfig,
    iommufd: bool,
) {
    if vfio.is_empty() {
        return;
    }
    for p in vfio {
        let name = format!("{claim_uid}-{}", p.device_name);
        if let Some(d) = spec.devices.iter_mut().find(|d| d.name == name) {
            d.container_edits = ContainerEdits {
                device_nodes: vec![DeviceNode {
                    path: p.device_node.clone(),
                }],
                ..Default::default()
            };
        }
    }
    let all_vfio = spec.devices.len() == vfio.len();
    let common = &mut spec.container_edits;
    if all_vfio {
        *common = ContainerEdits {
            env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
            ..Default::default()
        };
    }
    let api = config
        .iommu
        .as_ref()
        .and_then(|i| i.enable_api_device)
        .unwrap_or(false);
    if api {
        let path = if iommufd {
            "/dev/iommu"
        } else {
            "/dev/vfio/vfio"
        };
        common.device_nodes.push(DeviceNode { path: path.into() });
    }
}

#[cfg(test)]
pub(crate) mod tests;
