//! Simulated GPU nodes built from hardware profiles: stable identities and static MIG layouts.
use serde::Deserialize;
use uuid::Uuid;

use crate::inventory::{Gpu, Inventory, MigDevice, MigInfo};
use crate::profiles::{self, GpuModel, MediaEngines, MigProfile};
use crate::{Error, Result};

pub const SIM_DRIVER_VERSION: &str = "580.105.08";
pub const SIM_CUDA_DRIVER_VERSION: &str = "13.0";

/// A group of identical GPUs: `h100-80gb:8`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuGroup {
    pub profile: String,
    #[serde(default = "one")]
    pub count: u32,
    /// Overrides the node-wide MIG layout for this group.
    #[serde(default)]
    pub mig_layout: Option<String>,
}

fn one() -> u32 {
    1
}

/// The YAML form of `--hardware-file`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HardwareFile {
    pub gpus: Vec<GpuGroup>,
    #[serde(default)]
    pub driver_version: Option<String>,
    #[serde(default)]
    pub cuda_driver_version: Option<String>,
}

impl GpuGroup {
    /// Parses `profile[:count]`.
    pub fn parse(spec: &str) -> Result<Self> {
        let bad = |reason: &str| Error::InvalidHardwareSpec {
            spec: spec.to_string(),
            reason: reason.to_string(),
        };
        let (profile, count) = match spec.split_once(':') {
            Some((p, c)) => (
                p,
                c.trim()
                    .parse()
                    .map_err(|_| bad("count after ':' must be a positive integer"))?,
            ),
            None => (spec, 1),
        };
        if count == 0 || count > 64 {
            return Err(bad("count must be between 1 and 64"));
        }
        profiles::lookup(profile)?;
        Ok(GpuGroup {
            profile: profile.trim().to_string(),
            count,
            mig_layout: None,
        })
    }
}

impl HardwareFile {
    pub fn load(path: &std::path::Path) -> Result<Self> {
        let err = |reason: String| Error::File {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let file: HardwareFile = serde_yaml::from_str(&text).map_err(|e| err(e.to_string()))?;
        for g in &file.gpus {
            profiles::lookup(&g.profile).map_err(|e| err(format!("gpus: {e}")))?;
        }
        Ok(file)
    }
}

/// Builds the node's GPUs. Identities are derived from the node name and index, so they are stable
/// across restarts and distinct across nodes.
pub fn simulate_node(
    node: &str,
    groups: &[GpuGroup],
    default_layout: Option<&str>,
) -> Result<Inventory> {
    let total: u32 = groups.iter().map(|g| g.count).sum();
    let mut gpus = Vec::new();
    let mut index: u32 = 0;
    for group in groups {
        let model = profiles::lookup(&group.profile)?;
        let layout = group.mig_layout.as_deref().or(default_layout);
        for _ in 0..group.count {
            let mut gpu = simulated_gpu(node, index, total, model);
            if let (Some(layout), Some(mig)) = (layout, gpu.mig.as_mut()) {
                let chosen = plan_layout(model, layout)?;
                mig.enabled = !chosen.is_empty();
                mig.devices = chosen
                    .iter()
                    .zip(1u32..)
                    .map(|((p, start), gi_id)| MigDevice {
                        profile: p.name.clone(),
                        gi_profile_id: p.gi_profile_id,
                        placement_start: *start,
                        placement_size: p.memory_slices,
                        uuid: sim_mig_uuid(&gpu.uuid, p.gi_profile_id, *start),
                        gi_id,
                        ci_id: 0,
                    })
                    .collect();
            }
            gpus.push(gpu);
            index += 1;
        }
    }
    Ok(Inventory { gpus })
}

// PCI buses of an 8-GPU HGX board; larger simulated nodes continue the pattern.
const BUSES: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

fn simulated_gpu(node: &str, index: u32, total: u32, model: &GpuModel) -> Gpu {
    let bus = BUSES.get(index as usize).copied().unwrap_or(0x100 + index);
    // Two GPUs share each PCIe root complex, as on HGX boards.
    let root_bus = BUSES
        .get((index & !1) as usize)
        .copied()
        .unwrap_or(0x100 + (index & !1))
        - 3;
    let numa = if total > 1 && index >= total.div_ceil(2) {
        1
    } else {
        0
    };
    Gpu {
        minor: index,
        index,
        uuid: format!(
            "GPU-{}",
            Uuid::new_v5(
                &Uuid::NAMESPACE_OID,
                format!("gpu-dra-sim/{node}/{index}").as_bytes()
            )
        ),
        product_name: model.product_name.clone(),
        brand: model.brand.clone(),
        architecture: model.architecture.clone(),
        cuda_compute_capability: model.cuda_compute_capability.clone(),
        driver_version: SIM_DRIVER_VERSION.into(),
        cuda_driver_version: SIM_CUDA_DRIVER_VERSION.into(),
        memory_bytes: model.memory_mib << 20,
        multiprocessors: model.multiprocessors,
        pci_bus_id: format!("0000:{bus:02x}:00.0"),
        pcie_root: Some(format!("pci0000:{root_bus:02x}")),
        numa_node: Some(numa),
        addressing_mode: model.addressing_mode.clone(),
        mig: model.mig_capable.then(|| MigInfo {
            enabled: false,
            memory_slices: model.memory_slices,
            compute_slices: model.compute_slices,
            profiles: model.profiles.clone(),
            devices: Vec::new(),
        }),
        pci: Some(crate::passthrough::simulated_pci(
            index,
            model.memory_mib << 20,
            &model.pci_device_id,
        )),
    }
}

/// Stable UUID of a simulated MIG device at a placement.
pub fn sim_mig_uuid(parent_uuid: &str, gi_profile_id: u32, start: u32) -> String {
    let id = Uuid::new_v5(
        &Uuid::NAMESPACE_OID,
        format!("{parent_uuid}/{gi_profile_id}/{start}").as_bytes(),
    );
    format!("MIG-{id}")
}

/// Resolves a static layout (`disabled`, `all-<profile>`, `all-balanced`, or `p1,p2,...`) into
/// non-overlapping placements, searching with backtracking like mig-parted would.
pub fn plan_layout<'m>(model: &'m GpuModel, layout: &str) -> Result<Vec<(&'m MigProfile, u32)>> {
    let bad = |reason: String| Error::InvalidMigLayout {
        layout: layout.to_string(),
        gpu: model.key.clone(),
        reason,
    };
    let layout = layout.trim();
    if layout.is_empty() || layout == "disabled" || !model.mig_capable {
        return Ok(Vec::new());
    }
    let profile = |name: &str| {
        model.profile(name).ok_or_else(|| {
            let known: Vec<_> = model.profiles.iter().map(|p| p.name.as_str()).collect();
            bad(format!(
                "no MIG profile {name:?}; this GPU has {}",
                known.join(", ")
            ))
        })
    };
    let mut wanted: Vec<&MigProfile> = if layout == "all-balanced" {
        let by_slices = |c: u32| {
            model
                .profiles
                .iter()
                .filter(|p| p.compute_slices == c && !p.name.contains('+'))
                .min_by_key(|p| p.memory_slices)
                .ok_or_else(|| bad(format!("no plain {c}g profile")))
        };
        vec![by_slices(3)?, by_slices(2)?, by_slices(1)?, by_slices(1)?]
    } else if let Some(name) = layout.strip_prefix("all-") {
        let p = profile(name)?;
        let fit = (model.compute_slices / p.compute_slices)
            .min(p.max_instances)
            .min(u32::try_from(p.placements.len()).unwrap_or(u32::MAX));
        vec![p; fit as usize]
    } else {
        layout
            .split(',')
            .map(|n| profile(n.trim()))
            .collect::<Result<_>>()?
    };
    // Largest first keeps the search short; the result is sorted by placement afterwards.
    wanted.sort_by_key(|p| std::cmp::Reverse((p.memory_slices, p.compute_slices)));
    let mut chosen = Vec::new();
    if !place(model, &wanted, Used::default(), &mut chosen) {
        return Err(bad(
            "the profiles do not fit on one GPU at the same time".into()
        ));
    }
    chosen.sort_by_key(|(_, start)| *start);
    Ok(chosen)
}

/// What the instances placed so far take: memory slices (a bit mask), compute slices and media
/// engines.
#[derive(Default, Clone, Copy)]
struct Used {
    mem: u64,
    compute: u32,
    media: MediaEngines,
}

fn place<'m>(
    model: &GpuModel,
    wanted: &[&'m MigProfile],
    used: Used,
    chosen: &mut Vec<(&'m MigProfile, u32)>,
) -> bool {
    let Some((first, rest)) = wanted.split_first() else {
        return true;
    };
    if used.compute + first.compute_slices > model.compute_slices {
        return false;
    }
    let media = used.media.plus(MediaEngines::of(first));
    if media
        .short_of(MediaEngines::of_gpu(&model.profiles))
        .is_some()
    {
        return false;
    }
    let count_same = chosen.iter().filter(|(p, _)| p.name == first.name).count();
    if count_same >= first.max_instances as usize {
        return false;
    }
    for [start, size] in &first.placements {
        let mask = ((1u64 << size) - 1) << start;
        if used.mem & mask != 0 {
            continue;
        }
        chosen.push((first, *start));
        let next = Used {
            mem: used.mem | mask,
            compute: used.compute + first.compute_slices,
            media,
        };
        if place(model, rest, next, chosen) {
            return true;
        }
        chosen.pop();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(model: &str, layout: &str) -> Vec<(String, u32)> {
        let m = profiles::lookup(model).unwrap();
        plan_layout(m, layout)
            .unwrap()
            .into_iter()
            .map(|(p, s)| (p.name.clone(), s))
            .collect()
    }

    #[test]
    fn layouts_resolve_to_real_placements() {
        assert_eq!(
            names("h100-80gb", "all-3g.40gb"),
            vec![("3g.40gb".into(), 0), ("3g.40gb".into(), 4)]
        );
        assert_eq!(names("h100-80gb", "all-1g.10gb").len(), 7);
        let balanced = names("h100-80gb", "all-balanced");
        assert_eq!(balanced.len(), 4);
        assert!(balanced.contains(&("3g.40gb".into(), 4)), "{balanced:?}");
        assert!(
            names("l4", "all-1g.10gb").is_empty(),
            "non-MIG GPUs ignore layouts"
        );
        assert!(names("h100-80gb", "disabled").is_empty());
    }

    #[test]
    fn impossible_layouts_are_refused_with_the_reason() {
        let m = profiles::lookup("h100-80gb").unwrap();
        let e = plan_layout(m, "7g.80gb,1g.10gb").unwrap_err().to_string();
        assert!(e.contains("do not fit"), "{e}");
        let e = plan_layout(m, "9g.1tb").unwrap_err().to_string();
        assert!(e.contains("9g.1tb") && e.contains("3g.40gb"), "{e}");
    }

    #[test]
    fn layouts_share_the_media_engines() {
        // +me.all owns all four decoders and encoders; -me instances own none.
        let rtx = profiles::lookup("rtx-pro-6000").unwrap();
        assert!(plan_layout(rtx, "1g.24gb+me.all,1g.24gb").is_err());
        assert_eq!(
            names("rtx-pro-6000", "1g.24gb+me.all,1g.24gb-me,2g.48gb-me").len(),
            3
        );
        // One OFA engine: two +me instances never fit, one +me and plain 1g do.
        let h100 = profiles::lookup("h100-80gb").unwrap();
        assert!(plan_layout(h100, "1g.10gb+me,1g.10gb+me").is_err());
        assert_eq!(names("h100-80gb", "1g.10gb+me,1g.10gb,3g.40gb").len(), 3);
    }

    #[test]
    fn nodes_get_stable_distinct_identities() {
        let groups = [
            GpuGroup::parse("h100-80gb:8").unwrap(),
            GpuGroup::parse("l4:2").unwrap(),
        ];
        let a = simulate_node("n1", &groups, Some("all-3g.40gb")).unwrap();
        let b = simulate_node("n1", &groups, Some("all-3g.40gb")).unwrap();
        let c = simulate_node("n2", &groups, None).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.gpus.len(), 10);
        assert_ne!(a.gpus[0].uuid, c.gpus[0].uuid);
        assert_eq!(a.gpus[0].mig.as_ref().unwrap().devices.len(), 2);
        assert!(a.gpus[9].mig.is_none());
        assert_eq!(a.gpus[0].pcie_root, a.gpus[1].pcie_root);
        assert_ne!(a.gpus[1].pcie_root, a.gpus[2].pcie_root);
        assert!(GpuGroup::parse("h100-80gb:0").is_err());
        assert!(GpuGroup::parse("h100-80gb:x").is_err());
        assert!(
            GpuGroup::parse("nope:1")
                .unwrap_err()
                .to_string()
                .contains("nope")
        );
    }
}
