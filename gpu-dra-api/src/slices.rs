//! The ResourceSlices a node publishes: NVIDIA-compatible names, attributes, capacities and counters.
use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CounterSet, Device, DeviceAttribute, DeviceCapacity, DeviceTaint, ResourcePool, ResourceSlice,
    ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::inventory::{Gpu, Inventory, gpu_device_name, mig_device_name, semver_of};
use crate::names::GPU_DRIVER;
use crate::profiles::MigProfile;

mod node;
mod vfio;
pub use node::{SimulatedNode, simulated_node_slices};
pub use vfio::add_passthrough_devices;

/// API limits on one slice.
pub const MAX_DEVICES_PER_SLICE: usize = 128;
pub const MAX_DEVICES_WITH_COUNTERS_OR_TAINTS: usize = 64;
pub const MAX_COUNTER_SETS_PER_SLICE: usize = 8;
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;

#[derive(Debug, Clone)]
pub struct SliceOptions {
    pub driver: String,
    pub node_name: String,
    /// Advertise every MIG placement as a partitionable device (feature gate `DynamicMIG`).
    pub dynamic_mig: bool,
    /// Clusters >= 1.35 need counters and devices in separate slices; 1.34 needs them together.
    pub split_counters: bool,
}

impl SliceOptions {
    pub fn new(node_name: &str) -> Self {
        SliceOptions {
            driver: GPU_DRIVER.into(),
            node_name: node_name.into(),
            dynamic_mig: false,
            split_counters: true,
        }
    }
}

/// The content of one slice, before pool bookkeeping is added.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SliceContent {
    pub devices: Vec<Device>,
    pub shared_counters: Vec<CounterSet>,
}

/// Taints to attach, by device name (health).
pub type TaintMap = BTreeMap<String, Vec<DeviceTaint>>;

/// Splits the node's devices into slices that respect the API limits. Deterministic: the same
/// inventory always yields the same slices in the same order.
pub fn build_pool(inv: &Inventory, opts: &SliceOptions, taints: &TaintMap) -> Vec<SliceContent> {
    let mut counter_sets = Vec::new();
    let mut per_gpu: Vec<(Vec<Device>, Option<CounterSet>)> = Vec::new();
    for gpu in &inv.gpus {
        let (mut devices, counters) = gpu_devices(gpu, opts);
        for d in &mut devices {
            if let Some(t) = taints.get(&d.name) {
                d.taints = Some(t.clone());
            }
        }
        devices.sort_by(|a, b| a.name.cmp(&b.name));
        if opts.split_counters {
            counter_sets.extend(counters.clone());
        }
        per_gpu.push((devices, counters));
    }
    let mut slices = Vec::new();
    for chunk in counter_sets.chunks(MAX_COUNTER_SETS_PER_SLICE) {
        slices.push(SliceContent {
            devices: Vec::new(),
            shared_counters: chunk.to_vec(),
        });
    }
    let has_partitions = per_gpu.iter().any(|(_, c)| c.is_some());
    if has_partitions {
        // One slice per GPU keeps a GPU's partitions (and, on 1.34, its counters) together.
        for (devices, counters) in per_gpu {
            let limit = device_limit(&devices, true);
            let counters: Vec<_> = counters
                .into_iter()
                .filter(|_| !opts.split_counters)
                .collect();
            let mut chunks = devices.chunks(limit).peekable();
            if chunks.peek().is_none() {
                continue;
            }
            for (i, chunk) in chunks.enumerate() {
                slices.push(SliceContent {
                    devices: chunk.to_vec(),
                    shared_counters: if i == 0 { counters.clone() } else { Vec::new() },
                });
            }
        }
    } else {
        let devices: Vec<Device> = per_gpu.into_iter().flat_map(|(d, _)| d).collect();
        let limit = device_limit(&devices, false);
        for chunk in devices.chunks(limit) {
            slices.push(SliceContent {
                devices: chunk.to_vec(),
                shared_counters: Vec::new(),
            });
        }
    }
    if slices.is_empty() {
        // "Up, no devices" must be distinguishable from "absent".
        slices.push(SliceContent::default());
    }
    slices
}

fn device_limit(devices: &[Device], counters: bool) -> usize {
    if counters
        || devices
            .iter()
            .any(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()))
    {
        MAX_DEVICES_WITH_COUNTERS_OR_TAINTS
    } else {
        MAX_DEVICES_PER_SLICE
    }
}

/// Wraps slice contents into ResourceSlice objects of the node's pool.
pub fn to_resource_slices(
    contents: Vec<SliceContent>,
    opts: &SliceOptions,
    generation: i64,
    owner: Option<OwnerReference>,
) -> Vec<ResourceSlice> {
    let count = i64::try_from(contents.len()).unwrap_or(i64::MAX);
    contents
        .into_iter()
        .enumerate()
        .map(|(i, c)| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(&opts.node_name, &opts.driver, i)),
                owner_references: owner.clone().map(|o| vec![o]),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: opts.driver.clone(),
                node_name: Some(opts.node_name.clone()),
                pool: ResourcePool {
                    name: opts.node_name.clone(),
                    generation,
                    resource_slice_count: count,
                },
                devices: (!c.devices.is_empty() || c.shared_counters.is_empty())
                    .then_some(c.devices),
                shared_counters: (!c.shared_counters.is_empty()).then_some(c.shared_counters),
                ..Default::default()
            },
        })
        .collect()
}

/// Slice names sort in publishing order, which is the order the scheduler searches them.
pub fn slice_name(node: &str, driver: &str, index: usize) -> String {
    format!("{node}-{driver}-{index:05x}")
}

fn string(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.to_string()),
        ..Default::default()
    }
}

fn version(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(semver_of(s)),
        ..Default::default()
    }
}

fn quantity(n: u64) -> Quantity {
    Quantity(n.to_string())
}

fn bytes(n: u64) -> Quantity {
    Quantity(crate::quantity::format_bytes(n))
}

/// Attributes every device of a GPU carries (the whole GPU and its MIG devices).
fn common_attributes(gpu: &Gpu) -> BTreeMap<String, DeviceAttribute> {
    let mut a = BTreeMap::new();
    a.insert("productName".into(), string(&gpu.product_name));
    a.insert("brand".into(), string(&gpu.brand));
    a.insert("architecture".into(), string(&gpu.architecture));
    a.insert(
        "cudaComputeCapability".into(),
        version(&gpu.cuda_compute_capability),
    );
    a.insert("driverVersion".into(), version(&gpu.driver_version));
    a.insert(
        "cudaDriverVersion".into(),
        version(&gpu.cuda_driver_version),
    );
    a.insert(
        "resource.kubernetes.io/pciBusID".into(),
        string(&gpu.pci_bus_id),
    );
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
    if let Some(mode) = &gpu.addressing_mode {
        a.insert("addressingMode".into(), string(mode));
    }
    a
}

fn mig_capacity(p: &MigProfile) -> BTreeMap<String, DeviceCapacity> {
    let cap = |q| DeviceCapacity {
        value: q,
        request_policy: None,
    };
    BTreeMap::from([
        (
            "multiprocessors".into(),
            cap(quantity(p.multiprocessors.into())),
        ),
        ("copyEngines".into(), cap(quantity(p.copy_engines.into()))),
        ("decoders".into(), cap(quantity(p.decoders.into()))),
        ("encoders".into(), cap(quantity(p.encoders.into()))),
        ("jpegEngines".into(), cap(quantity(p.jpeg_engines.into()))),
        ("ofaEngines".into(), cap(quantity(p.ofa_engines.into()))),
        ("memory".into(), cap(bytes(p.memory_mib << 20))),
    ])
}

fn mig_attributes(gpu: &Gpu, p: &MigProfile) -> BTreeMap<String, DeviceAttribute> {
    let mut a = common_attributes(gpu);
    a.insert("type".into(), string("mig"));
    a.insert("profile".into(), string(&p.name));
    a.insert("parentUUID".into(), string(&gpu.uuid));
    a
}

fn gpu_devices(gpu: &Gpu, opts: &SliceOptions) -> (Vec<Device>, Option<CounterSet>) {
    let whole = || {
        let mut attributes = common_attributes(gpu);
        attributes.insert("type".into(), string("gpu"));
        attributes.insert("uuid".into(), string(&gpu.uuid));
        Device {
            name: gpu_device_name(gpu.minor),
            attributes: Some(attributes),
            capacity: Some(BTreeMap::from([(
                "memory".to_string(),
                DeviceCapacity {
                    value: bytes(gpu.memory_bytes),
                    request_policy: None,
                },
            )])),
            ..Default::default()
        }
    };
    if opts.dynamic_mig {
        return partitions::partitioned_devices(gpu, whole());
    }
    match &gpu.mig {
        Some(mig) if mig.enabled => {
            let devices = mig
                .devices
                .iter()
                .filter_map(|d| {
                    let p = mig
                        .profiles
                        .iter()
                        .find(|p| p.gi_profile_id == d.gi_profile_id)?;
                    let mut attributes = mig_attributes(gpu, p);
                    attributes.insert("uuid".into(), string(&d.uuid));
                    let mut capacity = mig_capacity(p);
                    for slice in d.placement_start..d.placement_start + d.placement_size {
                        capacity.insert(
                            format!("memorySlice{slice}"),
                            DeviceCapacity {
                                value: quantity(1),
                                request_policy: None,
                            },
                        );
                    }
                    Some(Device {
                        name: mig_device_name(
                            gpu.minor,
                            &d.profile,
                            d.gi_profile_id,
                            d.placement_start,
                        ),
                        attributes: Some(attributes),
                        capacity: Some(capacity),
                        ..Default::default()
                    })
                })
                .collect();
            (devices, None)
        }
        _ => (vec![whole()], None),
    }
}

mod partitions;
mod shares;
pub use partitions::counter_set_name;
pub use shares::{CONSUMABLE_SHARES_ENV, ConsumableShares, enable_consumable_shares};

#[cfg(test)]
mod tests;
