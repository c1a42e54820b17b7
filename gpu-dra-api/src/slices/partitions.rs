//! Dynamic MIG (KEP-4815 partitionable devices): the whole GPU, every MIG placement, and the one
//! counter set per GPU they consume from, with NVIDIA v0.5's names and values.
use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    Counter, CounterSet, Device, DeviceCapacity, DeviceCounterConsumption,
};

use super::{mig_attributes, mig_capacity, quantity};
use crate::inventory::{Gpu, MigInfo, mig_device_name, rfc1123_like};

/// Name of the per-GPU counter set: `gpu-<minor>-counter-set`.
pub fn counter_set_name(minor: u32) -> String {
    rfc1123_like(&format!("gpu-{minor}-counter-set"))
}

/// How Dynamic MIG publishes one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Partitioning {
    /// Not at all: the whole GPU as without the gate.
    None,
    /// The whole GPU and every placement (Hopper and newer turn MIG mode on and off without a
    /// reset).
    WholeAndPlacements,
    /// Only the placements: MIG mode is on, and Ampere cannot turn it off without a reset.
    PlacementsOnly,
}

pub(super) fn partitioning(gpu: &Gpu) -> Partitioning {
    match &gpu.mig {
        None => Partitioning::None,
        Some(_) if toggles_mig_without_reset(&gpu.architecture) => Partitioning::WholeAndPlacements,
        Some(mig) if mig.enabled => Partitioning::PlacementsOnly,
        Some(_) => Partitioning::None,
    }
}

/// Hopper and newer; NVIDIA compares the NVML architecture with `DEVICE_ARCH_HOPPER`.
fn toggles_mig_without_reset(architecture: &str) -> bool {
    const OLDER: [&str; 8] = [
        "Kepler",
        "Maxwell",
        "Pascal",
        "Volta",
        "Turing",
        "Ampere",
        "Ada",
        "Ada Lovelace",
    ];
    !OLDER.contains(&architecture)
}

/// Per capacity, the most any profile has: what the whole GPU offers, and the counters' totals.
/// (Not the GPU's own totals: the 7g profile of an A100 has 98 of its 108 SMs.)
pub(super) fn max_capacities(mig: &MigInfo) -> BTreeMap<String, DeviceCapacity> {
    let mut max: BTreeMap<String, (u128, DeviceCapacity)> = BTreeMap::new();
    for p in mig.profiles.iter().filter(|p| !p.placements.is_empty()) {
        for (name, cap) in mig_capacity(p) {
            let v = crate::quantity::parse_int(&cap.value.0).unwrap_or(0);
            if max.get(&name).is_none_or(|(cur, _)| v > *cur) {
                max.insert(name, (v, cap));
            }
        }
    }
    max.into_iter().map(|(k, (_, c))| (k, c)).collect()
}

/// The largest placement size: NVIDIA takes it for the GPU's memory slice count.
fn memory_slice_count(mig: &MigInfo) -> u32 {
    mig.profiles
        .iter()
        .flat_map(|p| p.placements.iter().map(|[_, size]| *size))
        .max()
        .unwrap_or(0)
}

/// One counter per capacity (named in DNS style) plus `memory-slice-<i>` = 1 for each slice in
/// `slices`.
fn counters(
    caps: &BTreeMap<String, DeviceCapacity>,
    slices: std::ops::Range<u32>,
) -> BTreeMap<String, Counter> {
    let mut c: BTreeMap<String, Counter> = caps
        .iter()
        .map(|(k, v)| {
            (
                camel_to_dns(k),
                Counter {
                    value: v.value.clone(),
                },
            )
        })
        .collect();
    for i in slices {
        c.insert(format!("memory-slice-{i}"), Counter { value: quantity(1) });
    }
    c
}

/// `copyEngines` -> `copy-engines`: a dash where a word starts, then RFC 1123 cleaning.
pub(super) fn camel_to_dns(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            let after_word = prev.is_ascii_lowercase() || prev.is_ascii_digit();
            if after_word || (prev.is_ascii_uppercase() && next_lower) {
                out.push('-');
            }
        }
        out.push(c);
    }
    rfc1123_like(&out)
}

/// The devices of one GPU under Dynamic MIG, and its counter set. `whole` is the whole-GPU
/// device as published without the gate; its capacity is replaced by the profiles' maxima.
pub(super) fn partitioned_devices(gpu: &Gpu, whole: Device) -> (Vec<Device>, Option<CounterSet>) {
    let mode = partitioning(gpu);
    let Some(mig) = gpu.mig.as_ref().filter(|_| mode != Partitioning::None) else {
        return (vec![whole], None);
    };
    let set = counter_set_name(gpu.minor);
    let max = max_capacities(mig);
    let totals = counters(&max, 0..memory_slice_count(mig));
    let consume = |counters| {
        Some(vec![DeviceCounterConsumption {
            counter_set: set.clone(),
            counters,
            ..Default::default()
        }])
    };
    let mut devices = Vec::new();
    if mode == Partitioning::WholeAndPlacements {
        devices.push(Device {
            capacity: Some(max.clone()),
            consumes_counters: consume(totals.clone()),
            ..whole
        });
    }
    for p in &mig.profiles {
        let capacity = mig_capacity(p);
        for [start, size] in &p.placements {
            devices.push(Device {
                name: mig_device_name(gpu.minor, &p.name, p.gi_profile_id, *start),
                attributes: Some(mig_attributes(gpu, p)),
                consumes_counters: consume(counters(&capacity, *start..start + size)),
                capacity: Some(capacity.clone()),
                ..Default::default()
            });
        }
    }
    let set = CounterSet {
        name: set.clone(),
        counters: totals,
    };
    (devices, Some(set))
}
