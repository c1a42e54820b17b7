//! The driver's opaque device configuration (`apiVersion: resource.nvidia.com/v1beta1`), decoded
//! strictly: unknown kinds and fields are rejected with the path of the offending field.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::gates::FeatureGates;
use crate::{Error, Result};

pub const API_VERSION: &str = "resource.nvidia.com/v1beta1";

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
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IommuConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_policy: Option<IommuBackendPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
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

/// What kind of device a config may be applied to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Gpu,
    Mig,
    Vfio,
}

impl DeviceConfig {
    /// Decodes `opaque.parameters`. `at` names where the parameters came from, for error paths.
    pub fn decode(parameters: &serde_json::Value, at: &str) -> Result<Self> {
        let err = |path: String, reason: String| Error::Config { path, reason };
        let obj = parameters
            .as_object()
            .ok_or_else(|| err(at.into(), "parameters must be an object".into()))?;
        match obj.get("apiVersion").and_then(|v| v.as_str()) {
            Some(API_VERSION) => {}
            Some(other) => {
                return Err(err(
                    format!("{at}.apiVersion"),
                    format!("unsupported apiVersion {other:?}, want {API_VERSION:?}"),
                ));
            }
            None => {
                return Err(err(
                    format!("{at}.apiVersion"),
                    format!("required, want {API_VERSION:?}"),
                ));
            }
        }
        let kind = obj
            .get("kind")
            .and_then(|v| v.as_str())
            .ok_or_else(|| err(format!("{at}.kind"), "required".into()))?;
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
            "GpuConfig" => DeviceConfig::Gpu(strict(body, at)?),
            "MigDeviceConfig" => DeviceConfig::Mig(strict(body, at)?),
            "VfioDeviceConfig" => DeviceConfig::Vfio(strict(body, at)?),
            other => {
                return Err(err(
                    format!("{at}.kind"),
                    format!(
                        "unknown kind {other:?}; want GpuConfig, MigDeviceConfig or VfioDeviceConfig"
                    ),
                ));
            }
        })
    }

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

    /// Fills implied defaults so equal intents compare equal.
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

    /// Checks values and that the chosen strategy's feature gate is on. `at` prefixes error paths.
    pub fn validate(&self, gates: &FeatureGates, at: &str) -> Result<()> {
        let err = |path: &str, reason: String| Error::Config {
            path: format!("{at}.{path}"),
            reason,
        };
        if matches!(self, DeviceConfig::Vfio(_)) && !gates.enabled("PassthroughSupport") {
            return Err(err(
                "kind",
                "VfioDeviceConfig needs the PassthroughSupport feature gate".into(),
            ));
        }
        let Some(s) = self.sharing() else {
            return Ok(());
        };
        match s.strategy {
            SharingStrategy::TimeSlicing => {
                if !gates.enabled("TimeSlicingSettings") {
                    return Err(err(
                        "sharing.strategy",
                        "TimeSlicing needs the TimeSlicingSettings feature gate".into(),
                    ));
                }
                if s.mps_config.is_some() {
                    return Err(err(
                        "sharing.mpsConfig",
                        "only allowed with strategy MPS".into(),
                    ));
                }
                if matches!(self, DeviceConfig::Mig(_)) && s.time_slicing_config.is_some() {
                    return Err(err(
                        "sharing.timeSlicingConfig",
                        "MIG devices cannot change their time slice".into(),
                    ));
                }
            }
            SharingStrategy::Mps => {
                if !gates.enabled("MPSSupport") {
                    return Err(err(
                        "sharing.strategy",
                        "MPS needs the MPSSupport feature gate".into(),
                    ));
                }
                if s.time_slicing_config.is_some() {
                    return Err(err(
                        "sharing.timeSlicingConfig",
                        "only allowed with strategy TimeSlicing".into(),
                    ));
                }
                if let Some(m) = &s.mps_config {
                    if let Some(p) = m.default_active_thread_percentage
                        && !(0..=100).contains(&p)
                    {
                        return Err(err(
                            "sharing.mpsConfig.defaultActiveThreadPercentage",
                            format!("{p} is not within 0..100"),
                        ));
                    }
                    let check = |path: String, q: &str| -> Result<()> {
                        let bytes = crate::quantity::parse_int(q)
                            .map_err(|_| err(&path, format!("{q:?} is not a quantity")))?;
                        if bytes < 1 << 20 {
                            return Err(err(&path, format!("{q} is below the 1Mi minimum")));
                        }
                        Ok(())
                    };
                    if let Some(q) = &m.default_pinned_device_memory_limit {
                        check("sharing.mpsConfig.defaultPinnedDeviceMemoryLimit".into(), q)?;
                    }
                    for (dev, q) in m.default_per_device_pinned_memory_limit.iter().flatten() {
                        check(
                            format!("sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[{dev}]"),
                            q,
                        )?;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn gates(s: &str) -> FeatureGates {
        FeatureGates::parse(s).unwrap()
    }

    #[test]
    fn decodes_each_kind() {
        let c = DeviceConfig::decode(&json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}}), "p").unwrap();
        let s = c.sharing().unwrap();
        assert_eq!(s.strategy, SharingStrategy::TimeSlicing);
        assert_eq!(
            s.time_slicing_config.as_ref().unwrap().interval,
            Some(TimeSliceInterval::Short)
        );
        let c = DeviceConfig::decode(
            &json!({"apiVersion": API_VERSION, "kind": "MigDeviceConfig"}),
            "p",
        )
        .unwrap();
        assert_eq!(c.kind(), DeviceKind::Mig);
        let c = DeviceConfig::decode(&json!({"apiVersion": API_VERSION, "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": "PreferIommuFD"}}), "p").unwrap();
        assert_eq!(c.kind(), DeviceKind::Vfio);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (json!({"kind": "GpuConfig"}), "p.apiVersion"),
            (
                json!({"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"}),
                "p.apiVersion",
            ),
            (json!({"apiVersion": API_VERSION}), "p.kind"),
            (
                json!({"apiVersion": API_VERSION, "kind": "TpuConfig"}),
                "p.kind",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharng": {}}),
                "p.sharng",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "Sometimes"}}),
                "p.sharing.strategy",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"bogus": 1}}}),
                "p.sharing.mpsConfig.bogus",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}}),
                "p.sharing.timeSlicingConfig.interval",
            ),
            (json!([1]), "p"),
        ];
        for (input, path) in cases {
            match DeviceConfig::decode(&input, "p") {
                Err(Error::Config { path: got, reason }) => {
                    assert_eq!(got, path, "{input} -> {reason}")
                }
                other => panic!("{input}: {other:?}"),
            }
        }
        let e = DeviceConfig::decode(
            &json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharng": {}}),
            "p",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("sharng"), "{e}");
    }

    #[test]
    fn validation_checks_gates_and_values() {
        let ts = DeviceConfig::decode(&json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}), "p").unwrap();
        let e = ts.validate(&gates(""), "p").unwrap_err().to_string();
        assert!(
            e.contains("TimeSlicingSettings") && e.contains("p.sharing.strategy"),
            "{e}"
        );
        ts.validate(&gates("TimeSlicingSettings=true"), "p")
            .unwrap();

        let mps = |cfg: serde_json::Value| {
            DeviceConfig::decode(&json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": cfg}}), "p").unwrap()
        };
        let on = gates("MPSSupport=true");
        assert!(
            mps(json!({}))
                .validate(&gates(""), "p")
                .unwrap_err()
                .to_string()
                .contains("MPSSupport")
        );
        mps(json!({"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"}))
            .validate(&on, "p")
            .unwrap();
        let e = mps(json!({"defaultActiveThreadPercentage": 150}))
            .validate(&on, "p")
            .unwrap_err()
            .to_string();
        assert!(e.contains("defaultActiveThreadPercentage"), "{e}");
        let e = mps(json!({"defaultPinnedDeviceMemoryLimit": "10Ki"}))
            .validate(&on, "p")
            .unwrap_err()
            .to_string();
        assert!(e.contains("1Mi"), "{e}");
        let e = mps(json!({"defaultPerDevicePinnedMemoryLimit": {"0": "lots"}}))
            .validate(&on, "p")
            .unwrap_err()
            .to_string();
        assert!(e.contains("defaultPerDevicePinnedMemoryLimit[0]"), "{e}");
    }

    #[test]
    fn normalize_makes_equal_intents_equal() {
        let mut a = DeviceConfig::decode(&json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}), "p").unwrap();
        let mut b = DeviceConfig::decode(&json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}}), "p").unwrap();
        a.normalize();
        b.normalize();
        assert_eq!(a, b);
    }

    #[test]
    fn time_slicing_on_mig_is_an_accepted_no_op_but_an_interval_is_refused() {
        let on = gates("TimeSlicingSettings=true");
        let mut c = DeviceConfig::decode(&json!({"apiVersion": API_VERSION, "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}}), "p").unwrap();
        c.normalize();
        assert_eq!(c.sharing().unwrap().time_slicing_config, None);
        c.validate(&on, "p").unwrap();
        let mut c = DeviceConfig::decode(&json!({"apiVersion": API_VERSION, "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}}), "p").unwrap();
        c.normalize();
        let e = c.validate(&on, "p").unwrap_err().to_string();
        assert!(e.contains("p.sharing.timeSlicingConfig"), "{e}");
        let mut gpu = DeviceConfig::decode(&json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}), "p").unwrap();
        gpu.normalize();
        assert_eq!(
            gpu.sharing()
                .unwrap()
                .time_slicing_config
                .as_ref()
                .unwrap()
                .interval,
            Some(TimeSliceInterval::Default)
        );
    }
}
