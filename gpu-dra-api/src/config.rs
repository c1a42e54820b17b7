//! The driver's opaque device configuration (`apiVersion: resource.nvidia.com/v1beta1`), read the
//! way NVIDIA's driver reads it, in two steps:
//!
//! 1. [`OpaqueConfig::decode`] is the strict decoder every config of the driver goes through
//!    before any is chosen: `apiVersion` and `kind` must name a config kind, fields are matched
//!    case-sensitively against NVIDIA's JSON tags, unknown fields and wrong JSON types are
//!    refused, and errors carry the path of the offending field. Values are not checked yet
//!    (NVIDIA keeps enumerations as strings), so a config that ends up applying to no device
//!    never fails on a value.
//! 2. Once a config is chosen for a device, [`OpaqueConfig::device_config`] (GPU and MIG devices)
//!    or [`OpaqueConfig::compute_domain_config`] (compute-domain devices) applies NVIDIA's
//!    `Normalize()` defaults, its `Validate()` rules and the checks its plugin makes when applying
//!    the config, and returns the effective config ([`DeviceConfig`] / [`ComputeDomainConfig`]).
//!
//! The kubelet plugin of both drivers (`gpu.nvidia.com`, `compute-domain.nvidia.com`) decodes
//! through here. The ComputeDomain controller writes its configs through the same types
//! ([`OpaqueConfig`] serializes as `opaque.parameters`).
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::gates::FeatureGates;
use crate::{Error, Result};

pub mod v1beta1;

pub const API_VERSION: &str = "resource.nvidia.com/v1beta1";

/// The kinds of NVIDIA's scheme that are not device configs: the decoder names them as such
/// rather than calling them unknown.
const NON_CONFIG_KINDS: &[&str] = &[
    "ComputeDomain",
    "ComputeDomainClique",
    "WatchEvent",
    "ListOptions",
    "GetOptions",
    "DeleteOptions",
    "CreateOptions",
    "UpdateOptions",
    "PatchOptions",
    "Status",
    "APIVersions",
    "APIGroupList",
    "APIGroup",
    "APIResourceList",
];

/// One decoded opaque config, of any kind of the API.
#[derive(Debug, Clone, PartialEq)]
pub enum OpaqueConfig {
    Gpu(v1beta1::GpuConfig),
    Mig(v1beta1::MigDeviceConfig),
    Vfio(v1beta1::VfioDeviceConfig),
    ComputeDomainChannel(v1beta1::ComputeDomainChannelConfig),
    ComputeDomainDaemon(v1beta1::ComputeDomainDaemonConfig),
}

/// What kind of `gpu.nvidia.com` device a config may be applied to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Gpu,
    Mig,
    Vfio,
}

/// What kind of `compute-domain.nvidia.com` device a config may be applied to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeDomainDeviceKind {
    Channel,
    Daemon,
}

fn config_err(path: String, reason: impl Into<String>) -> Error {
    Error::Config {
        path,
        reason: reason.into(),
    }
}

impl OpaqueConfig {
    /// Decodes `opaque.parameters` strictly (see the module docs). `at` names where the parameters
    /// came from; error paths extend it.
    pub fn decode(parameters: &serde_json::Value, at: &str) -> Result<Self> {
        let obj = parameters
            .as_object()
            .ok_or_else(|| config_err(at.into(), "parameters must be a JSON object"))?;
        match obj.get("apiVersion") {
            Some(serde_json::Value::String(v)) if v == API_VERSION => {}
            Some(serde_json::Value::String(other)) => {
                return Err(config_err(
                    format!("{at}.apiVersion"),
                    format!("unsupported apiVersion {other:?}, want {API_VERSION:?}"),
                ));
            }
            Some(other) => {
                return Err(config_err(
                    format!("{at}.apiVersion"),
                    format!("must be the string {API_VERSION:?}, not {other}"),
                ));
            }
            None => {
                return Err(config_err(
                    format!("{at}.apiVersion"),
                    format!("required, want {API_VERSION:?}"),
                ));
            }
        }
        let kind = match obj.get("kind") {
            Some(serde_json::Value::String(k)) => k.as_str(),
            Some(other) => {
                return Err(config_err(
                    format!("{at}.kind"),
                    format!("must be a string, not {other}"),
                ));
            }
            None => return Err(config_err(format!("{at}.kind"), "required")),
        };
        let mut body = obj.clone();
        body.remove("apiVersion");
        body.remove("kind");
        let body = serde_json::Value::Object(body);
        fn strict<T: serde::de::DeserializeOwned>(v: serde_json::Value, at: &str) -> Result<T> {
            serde_path_to_error::deserialize(v).map_err(|e| {
                let path = e.path().to_string();
                Error::Config {
                    path: if path == "." {
                        at.to_string()
                    } else {
                        format!("{at}.{path}")
                    },
                    reason: e.into_inner().to_string(),
                }
            })
        }
        Ok(match kind {
            "GpuConfig" => OpaqueConfig::Gpu(strict(body, at)?),
            "MigDeviceConfig" => OpaqueConfig::Mig(strict(body, at)?),
            "VfioDeviceConfig" => OpaqueConfig::Vfio(strict(body, at)?),
            "ComputeDomainChannelConfig" => OpaqueConfig::ComputeDomainChannel(strict(body, at)?),
            "ComputeDomainDaemonConfig" => OpaqueConfig::ComputeDomainDaemon(strict(body, at)?),
            other if NON_CONFIG_KINDS.contains(&other) => {
                return Err(config_err(
                    format!("{at}.kind"),
                    format!("{other} is not a device configuration"),
                ));
            }
            other => {
                return Err(config_err(
                    format!("{at}.kind"),
                    format!(
                        "unknown kind {other:?}; want GpuConfig, MigDeviceConfig, VfioDeviceConfig, \
                         ComputeDomainChannelConfig or ComputeDomainDaemonConfig"
                    ),
                ));
            }
        })
    }

    pub fn kind_name(&self) -> &'static str {
        match self {
            OpaqueConfig::Gpu(_) => "GpuConfig",
            OpaqueConfig::Mig(_) => "MigDeviceConfig",
            OpaqueConfig::Vfio(_) => "VfioDeviceConfig",
            OpaqueConfig::ComputeDomainChannel(_) => "ComputeDomainChannelConfig",
            OpaqueConfig::ComputeDomainDaemon(_) => "ComputeDomainDaemonConfig",
        }
    }

    /// The `gpu.nvidia.com` device kind this config is for (none for compute-domain configs).
    pub fn device_kind(&self) -> Option<DeviceKind> {
        match self {
            OpaqueConfig::Gpu(_) => Some(DeviceKind::Gpu),
            OpaqueConfig::Mig(_) => Some(DeviceKind::Mig),
            OpaqueConfig::Vfio(_) => Some(DeviceKind::Vfio),
            _ => None,
        }
    }

    /// The `compute-domain.nvidia.com` device kind this config is for (none for GPU configs).
    pub fn compute_domain_kind(&self) -> Option<ComputeDomainDeviceKind> {
        match self {
            OpaqueConfig::ComputeDomainChannel(_) => Some(ComputeDomainDeviceKind::Channel),
            OpaqueConfig::ComputeDomainDaemon(_) => Some(ComputeDomainDeviceKind::Daemon),
            _ => None,
        }
    }

    /// The effective config of a GPU, MIG or VFIO device: NVIDIA's `Normalize()`, `Validate()` and
    /// the checks its plugin makes when applying a config. `at` prefixes error paths.
    pub fn device_config(&self, gates: &FeatureGates, at: &str) -> Result<DeviceConfig> {
        match self {
            OpaqueConfig::Gpu(c) => Ok(DeviceConfig::Gpu(GpuConfig {
                sharing: c
                    .sharing
                    .as_ref()
                    .map(|s| gpu_sharing(s, gates, at))
                    .transpose()?,
            })),
            OpaqueConfig::Mig(c) => Ok(DeviceConfig::Mig(MigDeviceConfig {
                sharing: c
                    .sharing
                    .as_ref()
                    .map(|s| mig_sharing(s, gates, at))
                    .transpose()?,
            })),
            OpaqueConfig::Vfio(c) => {
                if !gates.enabled("PassthroughSupport") {
                    return Err(config_err(
                        format!("{at}.kind"),
                        "VfioDeviceConfig needs the PassthroughSupport feature gate",
                    ));
                }
                let iommu = c.iommu.clone().unwrap_or_default();
                let backend_policy = match iommu.backend_policy.as_str() {
                    "" | "LegacyOnly" => IommuBackendPolicy::LegacyOnly,
                    "PreferIommuFD" => IommuBackendPolicy::PreferIommuFD,
                    other => {
                        return Err(config_err(
                            format!("{at}.iommu.backendPolicy"),
                            format!(
                                "unknown IOMMU backend policy {other:?}; supported: LegacyOnly, \
                                 PreferIommuFD"
                            ),
                        ));
                    }
                };
                Ok(DeviceConfig::Vfio(VfioDeviceConfig {
                    iommu: Some(IommuConfig {
                        backend_policy: Some(backend_policy),
                        enable_api_device: Some(iommu.enable_api_device.unwrap_or(false)),
                    }),
                }))
            }
            other => Err(config_err(
                format!("{at}.kind"),
                format!(
                    "a {} is not a configuration of this driver's devices",
                    other.kind_name()
                ),
            )),
        }
    }

    /// The effective config of a compute-domain channel or daemon device. `at` prefixes error paths.
    pub fn compute_domain_config(&self, at: &str) -> Result<ComputeDomainConfig> {
        let domain = |id: &str| {
            if id.is_empty() {
                Err(config_err(format!("{at}.domainID"), "cannot be empty"))
            } else {
                Ok(id.to_string())
            }
        };
        match self {
            OpaqueConfig::ComputeDomainChannel(c) => Ok(ComputeDomainConfig::Channel {
                domain_id: domain(&c.domain_id)?,
                all_channels: c.allocation_mode == "All",
            }),
            OpaqueConfig::ComputeDomainDaemon(c) => Ok(ComputeDomainConfig::Daemon {
                domain_id: domain(&c.domain_id)?,
            }),
            other => Err(config_err(
                format!("{at}.kind"),
                format!(
                    "a {} is not a configuration of compute-domain devices",
                    other.kind_name()
                ),
            )),
        }
    }
}

/// The strategy check of NVIDIA's `Validate()`: known, exact spelling, and its gate on.
fn strategy(s: &str, gates: &FeatureGates, at: &str) -> Result<SharingStrategy> {
    let (strategy, gate) = match s {
        "TimeSlicing" => (SharingStrategy::TimeSlicing, "TimeSlicingSettings"),
        "MPS" => (SharingStrategy::Mps, "MPSSupport"),
        other => {
            return Err(config_err(
                format!("{at}.sharing.strategy"),
                format!("unknown GPU sharing strategy {other:?}; supported: TimeSlicing, MPS"),
            ));
        }
    };
    if !gates.enabled(gate) {
        return Err(config_err(
            format!("{at}.sharing.strategy"),
            format!(
                "{s} is selected as the GPU sharing strategy, but the {gate} feature gate is not enabled"
            ),
        ));
    }
    Ok(strategy)
}

fn gpu_sharing(s: &v1beta1::GpuSharing, gates: &FeatureGates, at: &str) -> Result<Sharing> {
    match strategy(&s.strategy, gates, at)? {
        SharingStrategy::TimeSlicing => {
            if s.mps_config.is_some() {
                return Err(config_err(
                    format!("{at}.sharing.mpsConfig"),
                    "cannot be used with the TimeSlicing strategy",
                ));
            }
            let interval = match &s.time_slicing_config {
                // Normalize(): no timeSlicingConfig means the Default interval.
                None => TimeSliceInterval::Default,
                Some(t) => match t.interval.as_deref() {
                    Some("Default") => TimeSliceInterval::Default,
                    Some("Short") => TimeSliceInterval::Short,
                    Some("Medium") => TimeSliceInterval::Medium,
                    Some("Long") => TimeSliceInterval::Long,
                    Some(other) => {
                        return Err(config_err(
                            format!("{at}.sharing.timeSlicingConfig.interval"),
                            format!(
                                "unknown time-slice interval {other:?}; supported: Default, Short, \
                                 Medium, Long"
                            ),
                        ));
                    }
                    None => {
                        return Err(config_err(
                            format!("{at}.sharing.timeSlicingConfig.interval"),
                            "required when timeSlicingConfig is given (leave out timeSlicingConfig \
                             for the Default interval)",
                        ));
                    }
                },
            };
            Ok(Sharing {
                strategy: SharingStrategy::TimeSlicing,
                time_slicing_config: Some(TimeSlicingConfig {
                    interval: Some(interval),
                }),
                mps_config: None,
            })
        }
        SharingStrategy::Mps => {
            if s.time_slicing_config.is_some() {
                return Err(config_err(
                    format!("{at}.sharing.timeSlicingConfig"),
                    "cannot be used with the MPS strategy",
                ));
            }
            Ok(Sharing {
                strategy: SharingStrategy::Mps,
                time_slicing_config: None,
                mps_config: Some(mps_config(s.mps_config.as_ref(), at)?),
            })
        }
    }
}

/// TimeSlicing on a MIG device is accepted and does nothing, whatever else it carries (NVIDIA
/// neither reads nor checks a MIG device's `mpsConfig` under TimeSlicing).
fn mig_sharing(s: &v1beta1::MigDeviceSharing, gates: &FeatureGates, at: &str) -> Result<Sharing> {
    Ok(match strategy(&s.strategy, gates, at)? {
        SharingStrategy::TimeSlicing => Sharing {
            strategy: SharingStrategy::TimeSlicing,
            time_slicing_config: None,
            mps_config: None,
        },
        SharingStrategy::Mps => Sharing {
            strategy: SharingStrategy::Mps,
            time_slicing_config: None,
            mps_config: Some(mps_config(s.mps_config.as_ref(), at)?),
        },
    })
}

/// `MpsConfig.Validate()` plus the limit checks NVIDIA makes when it starts the MPS daemon: each
/// limit must come to at least one whole MiB.
fn mps_config(m: Option<&v1beta1::MpsConfig>, at: &str) -> Result<MpsConfig> {
    let Some(m) = m else {
        return Ok(MpsConfig::default());
    };
    if let Some(p) = m.default_active_thread_percentage {
        let path = format!("{at}.sharing.mpsConfig.defaultActiveThreadPercentage");
        if p < 0 {
            return Err(config_err(path, format!("{p} must not be negative")));
        }
        if p > 100 {
            return Err(config_err(
                path,
                format!("{p} must not be greater than 100"),
            ));
        }
    }
    let limit = |path: String, q: &v1beta1::Quantity| -> Result<String> {
        let bytes = q
            .value()
            .map_err(|_| config_err(path.clone(), format!("{:?} is not a quantity", q.0)))?;
        if bytes >> 20 <= 0 {
            return Err(config_err(
                path,
                format!("{} is below the 1Mi minimum", q.0),
            ));
        }
        Ok(q.0.clone())
    };
    Ok(MpsConfig {
        default_active_thread_percentage: m.default_active_thread_percentage,
        default_pinned_device_memory_limit: m
            .default_pinned_device_memory_limit
            .as_ref()
            .map(|q| {
                limit(
                    format!("{at}.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit"),
                    q,
                )
            })
            .transpose()?,
        default_per_device_pinned_memory_limit: m
            .default_per_device_pinned_memory_limit
            .as_ref()
            .map(|per| {
                per.iter()
                    .map(|(dev, q)| {
                        Ok((
                            dev.clone(),
                            limit(
                                format!(
                                    "{at}.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[{dev}]"
                                ),
                                q,
                            )?,
                        ))
                    })
                    .collect::<Result<BTreeMap<_, _>>>()
            })
            .transpose()?,
        multi_user: m.multi_user,
    })
}

/// The effective config of a compute-domain device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ComputeDomainConfig {
    Channel {
        domain_id: String,
        /// `allocationMode: All`: every IMEX channel instead of channel 0.
        all_channels: bool,
    },
    Daemon {
        domain_id: String,
    },
}

/// The effective, normalized and validated config of a GPU, MIG or VFIO device (what prepare acts
/// on and what the checkpoint records for shared devices).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub enum DeviceConfig {
    #[serde(rename = "GpuConfig")]
    Gpu(GpuConfig),
    #[serde(rename = "MigDeviceConfig")]
    Mig(MigDeviceConfig),
    #[serde(rename = "VfioDeviceConfig")]
    Vfio(VfioDeviceConfig),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigDeviceConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VfioDeviceConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu: Option<IommuConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IommuConfig {
    #[serde(
        rename = "backendPolicy",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub backend_policy: Option<IommuBackendPolicy>,
    #[serde(
        rename = "enableAPIDevice",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub enable_api_device: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum IommuBackendPolicy {
    LegacyOnly,
    PreferIommuFD,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Sharing {
    pub strategy: SharingStrategy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing_config: Option<TimeSlicingConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_config: Option<MpsConfig>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SharingStrategy {
    TimeSlicing,
    #[serde(rename = "MPS")]
    Mps,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimeSlicingConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<TimeSliceInterval>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeSliceInterval {
    #[default]
    Default,
    Short,
    Medium,
    Long,
}

/// Limits are quantity strings that passed [`OpaqueConfig::device_config`] (at least 1Mi each).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MpsConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_active_thread_percentage: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_pinned_device_memory_limit: Option<String>,
    /// Keyed by device index or UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_per_device_pinned_memory_limit: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multi_user: Option<bool>,
}

impl DeviceConfig {
    pub fn kind(&self) -> DeviceKind {
        match self {
            DeviceConfig::Gpu(_) => DeviceKind::Gpu,
            DeviceConfig::Mig(_) => DeviceKind::Mig,
            DeviceConfig::Vfio(_) => DeviceKind::Vfio,
        }
    }

    /// The built-in default for a device kind (what applies when no config matches).
    pub fn default_for(kind: DeviceKind) -> Self {
        match kind {
            DeviceKind::Gpu => DeviceConfig::Gpu(GpuConfig::default()),
            DeviceKind::Mig => DeviceConfig::Mig(MigDeviceConfig::default()),
            DeviceKind::Vfio => DeviceConfig::Vfio(VfioDeviceConfig::default()),
        }
    }

    pub fn sharing(&self) -> Option<&Sharing> {
        match self {
            DeviceConfig::Gpu(c) => c.sharing.as_ref(),
            DeviceConfig::Mig(c) => c.sharing.as_ref(),
            DeviceConfig::Vfio(_) => None,
        }
    }

    /// Fills implied defaults so equal intents compare equal (configs from
    /// [`OpaqueConfig::device_config`] are already normalized; this is for built-in defaults and
    /// configs read back from a checkpoint).
    ///
    /// TimeSlicing on a MIG device is accepted and does nothing (as NVIDIA's driver): MIG devices
    /// have no time slice, so no `timeSlicingConfig` is filled in for them.
    pub fn normalize(&mut self) {
        let mig = matches!(self, DeviceConfig::Mig(_));
        let sharing = match self {
            DeviceConfig::Gpu(c) => c.sharing.as_mut(),
            DeviceConfig::Mig(c) => c.sharing.as_mut(),
            DeviceConfig::Vfio(c) => {
                let iommu = c.iommu.get_or_insert_with(IommuConfig::default);
                iommu
                    .backend_policy
                    .get_or_insert(IommuBackendPolicy::LegacyOnly);
                iommu.enable_api_device.get_or_insert(false);
                None
            }
        };
        if let Some(s) = sharing {
            match s.strategy {
                SharingStrategy::TimeSlicing if mig => {}
                SharingStrategy::TimeSlicing => {
                    s.time_slicing_config
                        .get_or_insert_with(Default::default)
                        .interval
                        .get_or_insert_with(Default::default);
                }
                SharingStrategy::Mps => {
                    s.mps_config.get_or_insert_with(Default::default);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
