//! The shaper's view of the pool: nodes and GPUs as their MigLayouts describe them, MIG geometry
//! rules (which placements are free), and the ResourceSlices a node would publish in a layout.
use std::collections::BTreeSet;

use gpu_dra_api::inventory::{DeviceRef, Inventory, MigDevice, parse_device_name};
use gpu_dra_api::miglayout::{MigLayout, MigPlacement};
use gpu_dra_api::profiles::{self, GpuModel, MediaEngines, MigProfile};
use gpu_dra_api::simulated::{GpuGroup, sim_mig_uuid, simulate_node};
use gpu_dra_api::slices::{SliceOptions, TaintMap, build_pool, to_resource_slices};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::ResourceExt;

/// One node in on-demand MIG mode: its MigLayout, read.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeState {
    pub name: String,
    pub gpus: Vec<GpuState>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GpuState {
    pub uuid: String,
    pub minor: u32,
    /// The catalog model of the GPU's product name; `None`: unknown, never shaped.
    pub model: Option<&'static GpuModel>,
    pub mig_capable: bool,
    /// The MIG devices that exist now (status).
    pub existing: Vec<MigPlacement>,
    /// The MIG devices the spec asks for; `None`: the GPU is not managed (not in the spec).
    pub wanted: Option<Vec<MigPlacement>>,
}

impl GpuState {
    /// The layout the GPU has or is about to have: the spec's when managed, else what exists.
    pub fn layout(&self) -> &[MigPlacement] {
        self.wanted.as_deref().unwrap_or(&self.existing)
    }

    /// Every MIG device that exists or is wanted: none of them may be destroyed while allocated.
    pub fn all_devices(&self) -> BTreeSet<&MigPlacement> {
        self.existing.iter().chain(self.layout()).collect()
    }

    /// The model when the GPU can be shaped at all.
    pub fn shapeable(&self) -> Option<&'static GpuModel> {
        self.model.filter(|m| self.mig_capable && m.mig_capable)
    }
}

/// The catalog model whose product name the driver reported.
pub fn model_of(product_name: &str) -> Option<&'static GpuModel> {
    profiles::catalog()
        .iter()
        .find(|m| m.product_name == product_name)
}

impl NodeState {
    /// Whether a GPU's spec asks for other MIG devices than exist (the plugin has work to do).
    pub fn changing(&self) -> bool {
        self.gpus.iter().any(|g| {
            g.wanted.as_ref().is_some_and(|w| {
                w.iter().collect::<BTreeSet<_>>() != g.existing.iter().collect::<BTreeSet<_>>()
            })
        })
    }

    /// Reads a MigLayout; a GPU listed in the spec but absent from the status is skipped (the
    /// plugin has not reported it, so nothing is known of it).
    pub fn from_layout(ml: &MigLayout) -> Self {
        let status = ml.status.as_ref().map(|s| s.gpus.as_slice()).unwrap_or(&[]);
        let gpus = status
            .iter()
            .map(|g| GpuState {
                uuid: g.uuid.clone(),
                minor: g.minor,
                model: model_of(&g.product_name),
                mig_capable: g.mig_capable,
                existing: g.devices.clone(),
                wanted: ml
                    .spec
                    .gpus
                    .iter()
                    .find(|w| w.uuid == g.uuid)
                    .map(|w| w.devices.clone()),
            })
            .collect();
        Self {
            name: ml.name_any(),
            gpus,
        }
    }
}

/// Whether `a` and `b` share a memory slice.
fn overlaps(model: &GpuModel, a: &MigPlacement, b: &MigPlacement) -> bool {
    let size = |p: &MigPlacement| model.profile(&p.profile).map_or(0, |p| p.memory_slices);
    a.start < b.start + size(b) && b.start < a.start + size(a)
}

/// Whether `profile` at `start` fits next to `devices`: a placement NVIDIA allows, no shared
/// memory slice, enough compute slices, instances and media engines left.
pub fn fits(model: &GpuModel, devices: &[MigPlacement], profile: &MigProfile, start: u32) -> bool {
    if !profile.placements.iter().any(|[s, _]| *s == start) {
        return false;
    }
    let new = MigPlacement {
        profile: profile.name.clone(),
        start,
    };
    if devices.iter().any(|d| overlaps(model, d, &new)) {
        return false;
    }
    let used: Vec<&MigProfile> = devices
        .iter()
        .filter_map(|d| model.profile(&d.profile))
        .collect();
    let compute: u32 = used.iter().map(|p| p.compute_slices).sum();
    let same = used.iter().filter(|p| p.name == profile.name).count();
    compute + profile.compute_slices <= model.compute_slices
        && same < profile.max_instances as usize
        && MediaEngines::refusal(
            &model.profiles,
            used.iter().map(|p| p.gi_profile_id),
            profile,
        )
        .is_none()
}

/// The starts at which `profile` fits next to `devices`, lowest first.
pub fn free_starts(model: &GpuModel, devices: &[MigPlacement], profile: &MigProfile) -> Vec<u32> {
    let mut starts: Vec<u32> = profile
        .placements
        .iter()
        .map(|[s, _]| *s)
        .filter(|s| fits(model, devices, profile, *s))
        .collect();
    starts.sort_unstable();
    starts.dedup();
    starts
}

/// Memory slices the devices take.
pub fn used_slices(model: &GpuModel, devices: &[MigPlacement]) -> u32 {
    devices
        .iter()
        .filter_map(|d| model.profile(&d.profile))
        .map(|p| p.memory_slices)
        .sum()
}

/// The placement a published MIG device name stands for, on a GPU of `model`.
pub fn placement_of(model: &GpuModel, device: &str) -> Option<(u32, MigPlacement)> {
    match parse_device_name(device)? {
        DeviceRef::Mig {
            parent_minor,
            gi_profile_id,
            start,
        } => {
            let p = model
                .profiles
                .iter()
                .find(|p| p.gi_profile_id == gi_profile_id)?;
            Some((
                parent_minor,
                MigPlacement {
                    profile: p.name.clone(),
                    start,
                },
            ))
        }
        DeviceRef::Gpu { .. } => None,
    }
}

/// The slices `node` publishes when each GPU has the layout `layout_of` gives it: whole GPUs and
/// existing MIG devices as plain devices, named as the plugin names them. GPUs of unknown models
/// are left out (the allocator is never asked to place on them here).
pub fn node_slices<'a>(
    node: &'a NodeState,
    layout_of: impl Fn(&'a GpuState) -> &'a [MigPlacement],
) -> Vec<ResourceSlice> {
    let mut inv = Inventory::default();
    for g in &node.gpus {
        let Some(model) = g.model else { continue };
        let group = GpuGroup {
            profile: model.key.clone(),
            count: 1,
            mig_layout: None,
        };
        let Ok(mut sim) = simulate_node(&node.name, &[group], None) else {
            continue;
        };
        let Some(mut gpu) = sim.gpus.pop() else {
            continue;
        };
        gpu.minor = g.minor;
        gpu.index = g.minor;
        gpu.uuid = g.uuid.clone();
        if let Some(mig) = gpu.mig.as_mut() {
            mig.devices = mig_devices(model, &g.uuid, layout_of(g));
            mig.enabled = !mig.devices.is_empty();
        }
        inv.gpus.push(gpu);
    }
    let opts = SliceOptions::new(&node.name);
    to_resource_slices(build_pool(&inv, &opts, &TaintMap::new()), &opts, 1, None)
}

fn mig_devices(model: &GpuModel, uuid: &str, layout: &[MigPlacement]) -> Vec<MigDevice> {
    layout
        .iter()
        .filter_map(|d| model.profile(&d.profile).map(|p| (p, d)))
        .zip(1u32..)
        .map(|((p, d), gi_id)| MigDevice {
            profile: p.name.clone(),
            gi_profile_id: p.gi_profile_id,
            placement_start: d.start,
            placement_size: p.memory_slices,
            uuid: sim_mig_uuid(uuid, p.gi_profile_id, d.start),
            gi_id,
            ci_id: 0,
        })
        .collect()
}
