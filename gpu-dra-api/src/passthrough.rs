//! VFIO passthrough devices (feature gate `PassthroughSupport`): one `gpu-vfio-<index>` device per
//! GPU PCI function, its name, UUID and PCI facts. Kept apart from [`crate::slices`] so the
//! plugin core (built without `slices`) shares the naming.
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::inventory::{Gpu, Inventory};

/// NVIDIA's PCI vendor ID.
pub const NVIDIA_PCI_VENDOR: u16 = 0x10de;

/// What the PCI bus says about a GPU's function, beyond what NVML reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PciFunction {
    pub vendor_id: u16,
    pub device_id: u16,
    /// `/sys/kernel/iommu_groups/<n>`; `None` without an IOMMU.
    pub iommu_group: Option<u32>,
    /// The 64-bit BARs together, rounded up to a power of two (what a VM must map).
    pub addressable_memory_bytes: u64,
    /// Whether the node has the iommufd API device (`/dev/iommu`).
    #[serde(default)]
    pub iommufd: bool,
}

/// `gpu-vfio-<index>`, where the index is the GPU's position among the node's NVIDIA GPUs in
/// PCI address order (NVIDIA's `VfioDeviceInfo.CanonicalName`).
pub fn vfio_device_name(index: usize) -> String {
    format!("gpu-vfio-{index}")
}

/// The index of a `gpu-vfio-<index>` name.
pub fn parse_vfio_device_name(name: &str) -> Option<usize> {
    let n = name.strip_prefix("gpu-vfio-")?;
    (!n.starts_with('+')).then_some(())?;
    n.parse().ok()
}

/// The UUID NVIDIA derives from the PCI address: a SHA-1 name-based UUID in the DNS namespace,
/// so the same function always gets the same UUID.
pub fn vfio_uuid(pci_bus_id: &str) -> String {
    Uuid::new_v5(&Uuid::NAMESPACE_DNS, pci_bus_id.as_bytes()).to_string()
}

/// `0x%04x`, as NVIDIA prints vendor and device IDs.
pub fn pci_id(id: u16) -> String {
    format!("0x{id:04x}")
}

/// The device ID in NVML's combined `pciDeviceId` (`0x20B710DE`: device in the high half).
pub fn device_id_of_nvml(combined: &str) -> Option<u16> {
    let hex = combined
        .trim()
        .trim_start_matches("0x")
        .trim_start_matches("0X");
    let v = u32::from_str_radix(hex, 16).ok()?;
    u16::try_from(v >> 16).ok()
}

/// The GPUs that have a passthrough device, with their VFIO index, in PCI address order. The
/// index counts every GPU with PCI facts, as NVIDIA's enumeration of the PCI bus does.
pub fn vfio_gpus(inv: &Inventory) -> Vec<(usize, &Gpu)> {
    let mut gpus: Vec<&Gpu> = inv.gpus.iter().filter(|g| g.pci.is_some()).collect();
    gpus.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
    gpus.into_iter().enumerate().collect()
}

/// The GPU behind `gpu-vfio-<index>`.
pub fn vfio_gpu<'a>(inv: &'a Inventory, device: &str) -> Option<&'a Gpu> {
    let index = parse_vfio_device_name(device)?;
    vfio_gpus(inv)
        .into_iter()
        .find(|(i, _)| *i == index)
        .map(|(_, g)| g)
}

/// Whether NVIDIA offers a passthrough device for this GPU: not while it has MIG devices
/// (`nvlib.go`: `vfioEnabled = len(migdevs) == 0`).
pub fn offers_vfio(gpu: &Gpu) -> bool {
    gpu.pci.is_some() && gpu.mig.as_ref().is_none_or(|m| m.devices.is_empty())
}

/// Deterministic PCI facts of a simulated GPU: one IOMMU group per GPU (numbered from its
/// position), BAR1 the memory rounded up to a power of two plus a 32 MiB BAR3, rounded up.
pub fn simulated_pci(index: u32, memory_bytes: u64, nvml_device_id: &str) -> PciFunction {
    let bar1 = memory_bytes.max(1).next_power_of_two();
    PciFunction {
        vendor_id: NVIDIA_PCI_VENDOR,
        device_id: device_id_of_nvml(nvml_device_id).unwrap_or(0),
        iommu_group: Some(index + 20),
        addressable_memory_bytes: (bar1 + (32 << 20)).next_power_of_two(),
        iommufd: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_uuids_match_nvidia() {
        assert_eq!(vfio_device_name(3), "gpu-vfio-3");
        assert_eq!(parse_vfio_device_name("gpu-vfio-3"), Some(3));
        assert_eq!(parse_vfio_device_name("gpu-3"), None);
        assert_eq!(parse_vfio_device_name("gpu-vfio-+3"), None);
        // uuid.NewSHA1(uuid.NameSpaceDNS, []byte(address)) in NVIDIA's nvlib.go.
        assert_eq!(
            vfio_uuid("0000:18:00.0"),
            Uuid::new_v5(&Uuid::NAMESPACE_DNS, b"0000:18:00.0").to_string()
        );
        assert_eq!(&vfio_uuid("0000:18:00.0")[14..15], "5");
    }

    #[test]
    fn ids_come_from_nvml_combined_id() {
        assert_eq!(device_id_of_nvml("0x20B710DE"), Some(0x20b7));
        assert_eq!(pci_id(0x20b7), "0x20b7");
        assert_eq!(pci_id(NVIDIA_PCI_VENDOR), "0x10de");
        let p = simulated_pci(0, 80 << 30, "0x233010DE");
        assert_eq!(p.addressable_memory_bytes, 256 << 30);
        assert_eq!(p.iommu_group, Some(20));
    }
}
