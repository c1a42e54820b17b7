//! The opaque config kinds of `resource.nvidia.com/v1beta1` as they arrive in a claim, shaped like
//! NVIDIA's Go types so the same JSON decodes the same way:
//!
//! * field names are the Go JSON tags, matched case-sensitively; unknown fields are refused;
//! * Go pointers are `Option`s (`null` and absent are both "not set"); Go strings that are not
//!   pointers read `null` and absent as the empty string;
//! * enumerations (`strategy`, `interval`, `backendPolicy`, `allocationMode`) stay strings, as in
//!   Go: a value outside the enumeration decodes, and is refused only when the config is applied
//!   to a device (see [`super::OpaqueConfig::device_config`]);
//! * memory limits are [`Quantity`]s, which take a JSON string or a JSON number like
//!   `resource.Quantity` does.
use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A `null` or absent non-pointer Go string decodes as `""`.
fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

fn is_empty(s: &str) -> bool {
    s.is_empty()
}

/// `GpuConfig`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<GpuSharing>,
}

/// `GpuConfig.sharing`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSharing {
    /// `TimeSlicing` or `MPS` (exact spelling).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub strategy: String,
    #[serde(
        rename = "timeSlicingConfig",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub time_slicing_config: Option<TimeSlicingConfig>,
    #[serde(rename = "mpsConfig", default, skip_serializing_if = "Option::is_none")]
    pub mps_config: Option<MpsConfig>,
}

/// `MigDeviceConfig`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigDeviceConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<MigDeviceSharing>,
}

/// `MigDeviceConfig.sharing`: no `timeSlicingConfig` (a MIG device has no time slice of its own).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigDeviceSharing {
    #[serde(default, deserialize_with = "null_as_empty")]
    pub strategy: String,
    #[serde(rename = "mpsConfig", default, skip_serializing_if = "Option::is_none")]
    pub mps_config: Option<MpsConfig>,
}

/// `timeSlicingConfig`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeSlicingConfig {
    /// `Default`, `Short`, `Medium` or `Long` (exact spelling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
}

/// `mpsConfig`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MpsConfig {
    /// A JSON integer (Go `*int`): `50.0` and `5e1` are refused.
    #[serde(
        rename = "defaultActiveThreadPercentage",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub default_active_thread_percentage: Option<i64>,
    #[serde(
        rename = "defaultPinnedDeviceMemoryLimit",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub default_pinned_device_memory_limit: Option<Quantity>,
    /// Keyed by device index or UUID; a `null` value reads as a zero quantity, as in Go.
    #[serde(
        rename = "defaultPerDevicePinnedMemoryLimit",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub default_per_device_pinned_memory_limit: Option<BTreeMap<String, Quantity>>,
    #[serde(rename = "multiUser", default, skip_serializing_if = "Option::is_none")]
    pub multi_user: Option<bool>,
}

/// `VfioDeviceConfig`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VfioDeviceConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu: Option<IommuConfig>,
}

/// `VfioDeviceConfig.iommu`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IommuConfig {
    /// `LegacyOnly` or `PreferIommuFD` (exact spelling); empty means `LegacyOnly`.
    #[serde(
        rename = "backendPolicy",
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "is_empty"
    )]
    pub backend_policy: String,
    #[serde(
        rename = "enableAPIDevice",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub enable_api_device: Option<bool>,
}

/// `ComputeDomainChannelConfig`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComputeDomainChannelConfig {
    #[serde(rename = "domainID", default, deserialize_with = "null_as_empty")]
    pub domain_id: String,
    /// Exactly `All` injects every IMEX channel; any other string (`Single`, `all`, empty, ...)
    /// one, as NVIDIA's plugin reads it.
    #[serde(
        rename = "allocationMode",
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "is_empty"
    )]
    pub allocation_mode: String,
}

/// `ComputeDomainDaemonConfig`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComputeDomainDaemonConfig {
    #[serde(rename = "domainID", default, deserialize_with = "null_as_empty")]
    pub domain_id: String,
}

/// A `resource.Quantity` field: the text as given (a JSON string with surrounding whitespace
/// trimmed, or a JSON number's digits), checked against Kubernetes' quantity grammar when decoded.
/// `null` (where Go has no pointer to leave nil) reads as `0`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantity(pub String);

impl Quantity {
    /// The value rounded up to a whole number (`Quantity.Value()`).
    pub fn value(&self) -> crate::Result<i128> {
        crate::quantity::value(&self.0)
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl V {
            fn checked<E: de::Error>(s: &str) -> Result<Quantity, E> {
                crate::quantity::value(s).map_err(|_| {
                    E::custom(format!(
                        "{s:?} is not a quantity (like 1Gi, 512M or 1073741824)"
                    ))
                })?;
                Ok(Quantity(s.to_string()))
            }
        }
        impl<'de> Visitor<'de> for V {
            type Value = Quantity;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a quantity: a string like \"1Gi\" or a number")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Quantity, E> {
                Self::checked(v.trim())
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quantity, E> {
                Self::checked(&v.to_string())
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quantity, E> {
                Self::checked(&v.to_string())
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Quantity, E> {
                Self::checked(&v.to_string())
            }
            fn visit_unit<E: de::Error>(self) -> Result<Quantity, E> {
                Ok(Quantity("0".into()))
            }
            fn visit_none<E: de::Error>(self) -> Result<Quantity, E> {
                Ok(Quantity("0".into()))
            }
        }
        d.deserialize_any(V)
    }
}

/// The config as `opaque.parameters`: `apiVersion` and `kind`, then the kind's own fields. What
/// the controller writes into claim templates, so writer and reader share these types.
impl Serialize for super::OpaqueConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Tagged<'a, T> {
            #[serde(rename = "apiVersion")]
            api_version: &'static str,
            kind: &'static str,
            #[serde(flatten)]
            body: &'a T,
        }
        fn tagged<T: Serialize, S: Serializer>(
            kind: &'static str,
            body: &T,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            Tagged {
                api_version: super::API_VERSION,
                kind,
                body,
            }
            .serialize(s)
        }
        use super::OpaqueConfig as C;
        let kind = self.kind_name();
        match self {
            C::Gpu(c) => tagged(kind, c, s),
            C::Mig(c) => tagged(kind, c, s),
            C::Vfio(c) => tagged(kind, c, s),
            C::ComputeDomainChannel(c) => tagged(kind, c, s),
            C::ComputeDomainDaemon(c) => tagged(kind, c, s),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::OpaqueConfig;
    use super::*;

    #[test]
    fn compute_domain_configs_serialize_as_the_controller_writes_them() {
        let channel = OpaqueConfig::ComputeDomainChannel(ComputeDomainChannelConfig {
            domain_id: "uid-1".into(),
            allocation_mode: "Single".into(),
        });
        let v = serde_json::to_value(&channel).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig",
                   "domainID": "uid-1", "allocationMode": "Single"})
        );
        assert_eq!(OpaqueConfig::decode(&v, "p").unwrap(), channel);

        let daemon = OpaqueConfig::ComputeDomainDaemon(ComputeDomainDaemonConfig {
            domain_id: "uid-1".into(),
        });
        let v = serde_json::to_value(&daemon).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainDaemonConfig",
                   "domainID": "uid-1"})
        );
        assert_eq!(OpaqueConfig::decode(&v, "p").unwrap(), daemon);
    }

    #[test]
    fn every_kind_round_trips_through_the_decoder() {
        let gpu = OpaqueConfig::Gpu(GpuConfig {
            sharing: Some(GpuSharing {
                strategy: "MPS".into(),
                time_slicing_config: None,
                mps_config: Some(MpsConfig {
                    default_active_thread_percentage: Some(50),
                    default_pinned_device_memory_limit: Some(Quantity("1Gi".into())),
                    ..Default::default()
                }),
            }),
        });
        let vfio = OpaqueConfig::Vfio(VfioDeviceConfig {
            iommu: Some(IommuConfig {
                backend_policy: "PreferIommuFD".into(),
                enable_api_device: Some(true),
            }),
        });
        for c in [gpu, vfio, OpaqueConfig::Mig(MigDeviceConfig::default())] {
            let v = serde_json::to_value(&c).unwrap();
            assert_eq!(OpaqueConfig::decode(&v, "p").unwrap(), c, "{v}");
        }
    }
}
