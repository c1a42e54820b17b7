//! What a device backend discovered on a node: GPUs, their MIG state, and the names we publish.
use serde::{Deserialize, Serialize};

use crate::profiles::MigProfile;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// NVML minor number: `/dev/nvidia<minor>` and the `gpu-<minor>` device name.
    pub minor: u32,
    pub index: u32,
    pub uuid: String,
    pub product_name: String,
    pub brand: String,
    pub architecture: String,
    /// `major.minor`.
    pub cuda_compute_capability: String,
    pub driver_version: String,
    /// `major.minor`.
    pub cuda_driver_version: String,
    pub memory_bytes: u64,
    pub multiprocessors: u32,
    /// `0000:18:00.0`.
    pub pci_bus_id: String,
    pub pcie_root: Option<String>,
    pub numa_node: Option<i64>,
    pub addressing_mode: Option<String>,
    pub mig: Option<MigInfo>,
    /// PCI facts for passthrough (`PassthroughSupport`); `None` where the backend has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<crate::passthrough::PciFunction>,
}

/// MIG capability and state of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigInfo {
    pub enabled: bool,
    pub memory_slices: u32,
    pub compute_slices: u32,
    pub profiles: Vec<MigProfile>,
    /// MIG devices that exist right now.
    pub devices: Vec<MigDevice>,
}

/// An existing MIG device (GPU instance plus its full compute instance).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigDevice {
    pub profile: String,
    pub gi_profile_id: u32,
    pub placement_start: u32,
    pub placement_size: u32,
    pub uuid: String,
    pub gi_id: u32,
    pub ci_id: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    pub gpus: Vec<Gpu>,
}

/// `gpu-<minor>`.
pub fn gpu_device_name(minor: u32) -> String {
    format!("gpu-{minor}")
}

/// `gpu-<minor>-mig-<profile>-<giProfileId>-<placementStart>`, NVIDIA's naming: the profile
/// without dots, then made RFC 1123-like, so `1g.10gb+me` gives `1g10gb-me` and `1g.24gb+me.all`
/// gives `1g24gb-meall` (`+me` and `-me` look alike; the profile ID keeps them apart).
pub fn mig_device_name(parent_minor: u32, profile: &str, gi_profile_id: u32, start: u32) -> String {
    let profile = rfc1123_like(&profile.replace('.', ""));
    format!("gpu-{parent_minor}-mig-{profile}-{gi_profile_id}-{start}")
}

/// Lowercase; anything but `[a-z0-9.-]` becomes `-`; no leading or trailing `-`, no trailing `.`;
/// at most 253 characters. NVIDIA's `toRFC1123Compliant`, which names devices and counter sets.
pub fn rfc1123_like(name: &str) -> String {
    let mapped: String = name
        .to_ascii_lowercase()
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '.' => c,
            _ => '-',
        })
        .collect();
    let trimmed = mapped.trim_matches('-');
    let mut out = trimmed.strip_suffix('.').unwrap_or(trimmed).to_string();
    out.truncate(253);
    out
}

/// A published device name, parsed back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceRef {
    Gpu {
        minor: u32,
    },
    Mig {
        parent_minor: u32,
        gi_profile_id: u32,
        start: u32,
    },
}

pub fn parse_device_name(name: &str) -> Option<DeviceRef> {
    let rest = name.strip_prefix("gpu-")?;
    match rest.split_once("-mig-") {
        None => rest.parse().ok().map(|minor| DeviceRef::Gpu { minor }),
        Some((minor, mig)) => {
            let mut parts = mig.rsplitn(3, '-');
            let start = parts.next()?.parse().ok()?;
            let gi_profile_id = parts.next()?.parse().ok()?;
            let profile = parts.next()?;
            (!profile.is_empty()).then_some(())?;
            Some(DeviceRef::Mig {
                parent_minor: minor.parse().ok()?,
                gi_profile_id,
                start,
            })
        }
    }
}

impl Inventory {
    pub fn gpu_by_minor(&self, minor: u32) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.minor == minor)
    }
}

impl Gpu {
    /// True when the GPU is published as MIG devices rather than as itself (static MIG).
    pub fn mig_enabled(&self) -> bool {
        self.mig.as_ref().is_some_and(|m| m.enabled)
    }

    pub fn mig_profile(&self, gi_profile_id: u32) -> Option<&MigProfile> {
        self.mig
            .as_ref()?
            .profiles
            .iter()
            .find(|p| p.gi_profile_id == gi_profile_id)
    }
}

/// Turns driver-style versions (`580.105.08`, `9.0`) into the semver a `version` attribute needs.
pub fn semver_of(v: &str) -> String {
    let mut parts: Vec<String> = v
        .split('.')
        .take(3)
        .map(|p| {
            let digits: String = p.chars().take_while(|c| c.is_ascii_digit()).collect();
            digits.parse::<u64>().unwrap_or(0).to_string()
        })
        .collect();
    while parts.len() < 3 {
        parts.push("0".into());
    }
    parts.join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_names_follow_nvidia_and_parse_back() {
        // NVIDIA cmd/gpu-kubelet-plugin/mig.go: ToCanonicalName, toRFC1123Compliant.
        let n = mig_device_name(0, "1g.10gb+me", 20, 3);
        assert_eq!(n, "gpu-0-mig-1g10gb-me-20-3");
        assert_eq!(
            mig_device_name(1, "1g.24gb+me.all", 65, 0),
            "gpu-1-mig-1g24gb-meall-65-0"
        );
        assert_eq!(
            mig_device_name(0, "1g.24gb-me", 67, 2),
            "gpu-0-mig-1g24gb-me-67-2"
        );
        assert_eq!(
            mig_device_name(0, "4g.96gb+gfx", 32, 0),
            "gpu-0-mig-4g96gb-gfx-32-0"
        );
        assert_eq!(mig_device_name(0, "3g.40gb", 9, 4), "gpu-0-mig-3g40gb-9-4");
        assert_eq!(rfc1123_like("-A_b.c-."), "a-b.c-");
        assert_eq!(
            parse_device_name(&n),
            Some(DeviceRef::Mig {
                parent_minor: 0,
                gi_profile_id: 20,
                start: 3
            })
        );
        assert_eq!(
            parse_device_name("gpu-7"),
            Some(DeviceRef::Gpu { minor: 7 })
        );
        assert_eq!(parse_device_name("gpu-x"), None);
        assert_eq!(parse_device_name("gpu-0-mig--1-2"), None);
        assert_eq!(parse_device_name("cpu-0"), None);
    }

    #[test]
    fn versions_become_semver() {
        assert_eq!(semver_of("580.105.08"), "580.105.8");
        assert_eq!(semver_of("9.0"), "9.0.0");
        assert_eq!(semver_of("13"), "13.0.0");
    }
}
