//! Hardware profiles of NVIDIA GPU models (whole-GPU facts and MIG geometry), embedded at build time.
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuModel {
    pub key: String,
    pub product_name: String,
    pub pci_device_id: String,
    pub architecture: String,
    /// `major.minor`, as NVML reports it.
    pub cuda_compute_capability: String,
    pub brand: String,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    pub multiprocessors: u32,
    pub mig_capable: bool,
    #[serde(default)]
    pub addressing_mode: Option<String>,
    #[serde(default)]
    pub memory_slices: u32,
    #[serde(default)]
    pub compute_slices: u32,
    #[serde(default)]
    pub profiles: Vec<MigProfile>,
}

/// One GPU-instance profile (with its full-size compute instance) and where it may be placed.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MigProfile {
    pub name: String,
    pub gi_profile_id: u32,
    pub compute_slices: u32,
    pub memory_slices: u32,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    pub multiprocessors: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpeg_engines: u32,
    pub ofa_engines: u32,
    pub max_instances: u32,
    /// `[start, size]` in memory-slice units.
    pub placements: Vec<[u32; 2]>,
    /// Values scaled from the smallest profile rather than taken from a capture.
    #[serde(default)]
    pub inferred: Vec<String>,
}

/// The media engines a GPU instance owns. They are physical: the instances on one GPU share the
/// GPU's set, which NVIDIA's counters (and so the scheduler) take to be the most any one profile
/// has. `+me` profiles take the single OFA engine; `+me.all` takes every decoder and encoder.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MediaEngines {
    pub decoders: u32,
    pub encoders: u32,
    pub jpeg_engines: u32,
    pub ofa_engines: u32,
}

impl MediaEngines {
    pub fn of(p: &MigProfile) -> Self {
        MediaEngines {
            decoders: p.decoders,
            encoders: p.encoders,
            jpeg_engines: p.jpeg_engines,
            ofa_engines: p.ofa_engines,
        }
    }

    /// What a GPU with these profiles has: per engine, the most any profile owns.
    pub fn of_gpu(profiles: &[MigProfile]) -> Self {
        profiles
            .iter()
            .map(Self::of)
            .fold(Self::default(), |a, b| a.zip(b, u32::max))
    }

    pub fn plus(self, other: Self) -> Self {
        self.zip(other, u32::saturating_add)
    }

    /// The first engine of which `self` needs more than `have`, by its counter name.
    pub fn short_of(self, have: Self) -> Option<&'static str> {
        [
            (self.decoders > have.decoders, "decoders"),
            (self.encoders > have.encoders, "encoders"),
            (self.jpeg_engines > have.jpeg_engines, "jpeg-engines"),
            (self.ofa_engines > have.ofa_engines, "ofa-engines"),
        ]
        .into_iter()
        .find_map(|(short, name)| short.then_some(name))
    }

    /// Why `wanted` cannot be added next to instances of the `existing` GI profile ids on a GPU
    /// with `profiles`: the engine it would lack, worded alike by every backend.
    pub fn refusal(
        profiles: &[MigProfile],
        existing: impl IntoIterator<Item = u32>,
        wanted: &MigProfile,
    ) -> Option<String> {
        let used = existing
            .into_iter()
            .filter_map(|id| profiles.iter().find(|p| p.gi_profile_id == id))
            .fold(Self::default(), |sum, p| sum.plus(Self::of(p)));
        let engine = used
            .plus(Self::of(wanted))
            .short_of(Self::of_gpu(profiles))?;
        Some(format!(
            "insufficient resources: {} needs {engine} that the GPU's other MIG devices hold",
            wanted.name
        ))
    }

    fn zip(self, o: Self, f: fn(u32, u32) -> u32) -> Self {
        MediaEngines {
            decoders: f(self.decoders, o.decoders),
            encoders: f(self.encoders, o.encoders),
            jpeg_engines: f(self.jpeg_engines, o.jpeg_engines),
            ofa_engines: f(self.ofa_engines, o.ofa_engines),
        }
    }
}

#[derive(Deserialize)]
struct Catalog {
    gpus: Vec<GpuModel>,
}

/// Every known GPU model.
pub fn catalog() -> &'static [GpuModel] {
    static CATALOG: OnceLock<Vec<GpuModel>> = OnceLock::new();
    CATALOG.get_or_init(|| {
        let c: Catalog = serde_yaml::from_str(include_str!("../data/gpus.yaml"))
            .expect("embedded data/gpus.yaml is valid (checked by tests)");
        c.gpus
    })
}

/// Short names users type, mapped to catalog keys.
const ALIASES: &[(&str, &str)] = &[
    ("a30", "A30-24GB"),
    ("a100-40gb", "A100-SXM4-40GB"),
    ("a100-80gb", "A100-SXM4-80GB"),
    ("h100", "H100-SXM5-80GB"),
    ("h100-80gb", "H100-SXM5-80GB"),
    ("h100-nvl", "H100-NVL-94GB"),
    ("h200", "H200-SXM-141GB"),
    ("h200-141gb", "H200-SXM-141GB"),
    ("h200-nvl", "H200-NVL-141GB"),
    ("b200", "B200-180GB"),
    ("b200-180gb", "B200-180GB"),
    ("gb200", "GB200"),
    ("rtx-pro-6000", "RTX-PRO-6000-Blackwell-Server"),
    ("l4", "L4"),
    ("l40s", "L40S"),
];

/// Names accepted by [`lookup`], for error messages and `--help`.
pub fn known_names() -> String {
    ALIASES
        .iter()
        .map(|(a, _)| *a)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Finds a model by alias (`h100-80gb`) or catalog key (`H100-SXM5-80GB`), case-insensitively.
pub fn lookup(name: &str) -> Result<&'static GpuModel> {
    let wanted = name.trim().to_ascii_lowercase();
    let key = ALIASES
        .iter()
        .find(|(alias, _)| *alias == wanted)
        .map(|(_, key)| key.to_ascii_lowercase())
        .unwrap_or(wanted);
    catalog()
        .iter()
        .find(|m| m.key.to_ascii_lowercase() == key)
        .ok_or_else(|| Error::UnknownProfile {
            name: name.to_string(),
            known: known_names(),
        })
}

impl GpuModel {
    pub fn profile(&self, name: &str) -> Option<&MigProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_parses_and_is_consistent() {
        assert!(catalog().len() >= 8);
        for m in catalog() {
            assert!(m.memory_mib > 0, "{}", m.key);
            for p in &m.profiles {
                assert!(p.memory_mib <= m.memory_mib, "{} {}", m.key, p.name);
                assert!(
                    p.multiprocessors <= m.multiprocessors,
                    "{} {}",
                    m.key,
                    p.name
                );
                for [start, size] in &p.placements {
                    assert!(start + size <= m.memory_slices, "{} {}", m.key, p.name);
                }
            }
        }
    }

    #[test]
    fn every_alias_resolves() {
        for (alias, _) in ALIASES {
            lookup(alias).unwrap();
        }
        assert_eq!(
            lookup("H100-SXM5-80GB").unwrap().product_name,
            "NVIDIA H100 80GB HBM3"
        );
        let err = lookup("h900").unwrap_err().to_string();
        assert!(err.contains("h900") && err.contains("h100-80gb"), "{err}");
    }

    #[test]
    fn media_engines_are_shared_by_the_instances_of_a_gpu() {
        let rtx = lookup("rtx-pro-6000").unwrap();
        let gpu = MediaEngines::of_gpu(&rtx.profiles);
        assert_eq!((gpu.decoders, gpu.encoders, gpu.ofa_engines), (4, 4, 1));
        let all = MediaEngines::of(rtx.profile("1g.24gb+me.all").unwrap());
        let plain = MediaEngines::of(rtx.profile("1g.24gb").unwrap());
        let none = MediaEngines::of(rtx.profile("1g.24gb-me").unwrap());
        assert_eq!(all.short_of(gpu), None);
        assert_eq!(all.plus(plain).short_of(gpu), Some("decoders"));
        assert_eq!(all.plus(none).short_of(gpu), None);
        let h100 = lookup("h100-80gb").unwrap();
        let me = MediaEngines::of(h100.profile("1g.10gb+me").unwrap());
        let h100_gpu = MediaEngines::of_gpu(&h100.profiles);
        assert_eq!(me.plus(me).short_of(h100_gpu), Some("ofa-engines"));
    }

    #[test]
    fn h100_geometry_matches_the_facts() {
        let h100 = lookup("h100-80gb").unwrap();
        assert_eq!(h100.memory_slices, 8);
        let p = h100.profile("3g.40gb").unwrap();
        assert_eq!(
            (p.gi_profile_id, p.memory_mib, p.placements.len()),
            (9, 40448, 2)
        );
        assert!(!lookup("l4").unwrap().mig_capable);
    }
}
