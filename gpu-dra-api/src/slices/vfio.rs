//! Passthrough devices in the published pool (feature gate `PassthroughSupport`), as NVIDIA's
//! `VfioDeviceInfo.GetDevice` (deviceinfo.go) builds them.
//!
//! A GPU is handed out either as itself or as its PCI function, never both: while a claim holds
//! one, the other is left out of the pool (NVIDIA's `RemoveSiblingDevices` on prepare, then a
//! republish). Applied to built slice contents so [`super::SliceOptions`] stays as it is.
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceCapacity};

use super::{MAX_DEVICES_PER_SLICE, SliceContent, bytes, string};
use crate::inventory::{Gpu, Inventory, gpu_device_name};
use crate::passthrough::{offers_vfio, pci_id, vfio_device_name, vfio_gpus, vfio_uuid};

/// Adds a `gpu-vfio-<index>` device for every GPU without MIG devices. `held` names the devices
/// prepared on this node right now: a held `gpu-<minor>` hides its passthrough sibling, a held
/// `gpu-vfio-<index>` hides the GPU.
pub fn add_passthrough_devices(
    contents: &mut Vec<SliceContent>,
    inv: &Inventory,
    held: &BTreeSet<String>,
) {
    let mut added = Vec::new();
    for (index, gpu) in vfio_gpus(inv) {
        if !offers_vfio(gpu) {
            continue;
        }
        let name = vfio_device_name(index);
        let whole = gpu_device_name(gpu.minor);
        if held.contains(&whole) {
            continue;
        }
        if held.contains(&name) {
            for c in contents.iter_mut() {
                c.devices.retain(|d| d.name != whole);
            }
        }
        added.push(vfio_device(&name, gpu));
    }
    for device in added {
        // Only the plain (no counters) slices take them; passthrough excludes dynamic MIG.
        match contents.iter_mut().rev().find(|c| {
            c.shared_counters.is_empty()
                && c.devices.len() < MAX_DEVICES_PER_SLICE
                && c.devices.iter().all(|d| d.consumes_counters.is_none())
        }) {
            Some(c) => c.devices.push(device),
            None => contents.push(SliceContent {
                devices: vec![device],
                shared_counters: Vec::new(),
            }),
        }
    }
}

fn vfio_device(name: &str, gpu: &Gpu) -> Device {
    let pci = gpu
        .pci
        .as_ref()
        .expect("vfio_gpus yields GPUs with PCI facts");
    let mut a = BTreeMap::from([
        ("type".to_string(), string("vfio")),
        ("uuid".into(), string(&vfio_uuid(&gpu.pci_bus_id))),
        ("deviceID".into(), string(&pci_id(pci.device_id))),
        ("vendorID".into(), string(&pci_id(pci.vendor_id))),
        ("productName".into(), string(&gpu.product_name)),
        (
            "iommuFDEnabled".into(),
            DeviceAttribute {
                bool: Some(pci.iommufd),
                ..Default::default()
            },
        ),
        (
            "resource.kubernetes.io/pciBusID".into(),
            string(&gpu.pci_bus_id),
        ),
    ]);
    if let Some(root) = &gpu.pcie_root {
        a.insert("resource.kubernetes.io/pcieRoot".into(), string(root));
    }
    if let Some(numa) = gpu.numa_node {
        a.insert(
            "resource.kubernetes.io/numaNode".into(),
            DeviceAttribute {
                int: Some(numa),
                ..Default::default()
            },
        );
    }
    Device {
        name: name.to_string(),
        attributes: Some(a),
        capacity: Some(BTreeMap::from([(
            "addressableMemory".to_string(),
            DeviceCapacity {
                value: bytes(pci.addressable_memory_bytes),
                request_policy: None,
            },
        )])),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{SliceOptions, TaintMap, build_pool};
    use super::*;
    use crate::simulated::{GpuGroup, simulate_node};

    fn pool(layout: Option<&str>, held: &[&str]) -> Vec<SliceContent> {
        let groups = [GpuGroup::parse("h100-80gb:2").unwrap()];
        let inv = simulate_node("node-a", &groups, layout).unwrap();
        let mut c = build_pool(&inv, &SliceOptions::new("node-a"), &TaintMap::new());
        let held = held.iter().map(|s| s.to_string()).collect();
        add_passthrough_devices(&mut c, &inv, &held);
        c
    }

    fn names(c: &[SliceContent]) -> Vec<String> {
        c.iter()
            .flat_map(|s| s.devices.iter().map(|d| d.name.clone()))
            .collect()
    }

    // Names, attributes and capacity as in NVIDIA's deviceinfo.go (VfioDeviceInfo.GetDevice).
    #[test]
    fn vfio_device_has_nvidias_attributes() {
        let c = pool(None, &[]);
        assert_eq!(names(&c), ["gpu-0", "gpu-1", "gpu-vfio-0", "gpu-vfio-1"]);
        let d = &c[0].devices[2];
        let a = d.attributes.as_ref().unwrap();
        let keys: Vec<&str> = a.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "deviceID",
                "iommuFDEnabled",
                "productName",
                "resource.kubernetes.io/numaNode",
                "resource.kubernetes.io/pciBusID",
                "resource.kubernetes.io/pcieRoot",
                "type",
                "uuid",
                "vendorID"
            ]
        );
        assert_eq!(a["type"].string.as_deref(), Some("vfio"));
        assert_eq!(a["vendorID"].string.as_deref(), Some("0x10de"));
        assert_eq!(a["deviceID"].string.as_deref(), Some("0x2330"));
        assert_eq!(a["iommuFDEnabled"].bool, Some(false));
        assert_eq!(
            a["uuid"].string.as_deref(),
            Some(vfio_uuid("0000:18:00.0").as_str())
        );
        let cap = d.capacity.as_ref().unwrap();
        assert_eq!(cap.keys().collect::<Vec<_>>(), ["addressableMemory"]);
        assert_eq!(cap["addressableMemory"].value.0, "256Gi");
        assert!(d.allow_multiple_allocations.is_none());
    }

    #[test]
    fn a_gpu_is_offered_as_gpu_or_vfio_never_both_while_held() {
        assert_eq!(
            names(&pool(None, &["gpu-0"])),
            ["gpu-0", "gpu-1", "gpu-vfio-1"]
        );
        assert_eq!(
            names(&pool(None, &["gpu-vfio-1"])),
            ["gpu-0", "gpu-vfio-0", "gpu-vfio-1"]
        );
    }

    #[test]
    fn gpus_with_mig_devices_get_no_passthrough_device() {
        // nvlib.go: vfioEnabled = len(migdevs) == 0; the index still counts the GPU.
        let c = pool(Some("all-1g.10gb"), &[]);
        assert!(!names(&c).iter().any(|n| n.starts_with("gpu-vfio")));
    }
}
