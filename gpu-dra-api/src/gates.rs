//! Feature gates, with NVIDIA's names so `FEATURE_GATES` strings carry over unchanged.
use std::collections::BTreeMap;
use std::fmt;

use crate::{Error, Result};

/// (name, default). Defaults follow NVIDIA's driver: new behaviour is opt-in.
const KNOWN: &[(&str, bool)] = &[
    ("TimeSlicingSettings", false),
    ("MPSSupport", false),
    ("IMEXDaemonsWithDNSNames", true),
    ("PassthroughSupport", false),
    ("DynamicMIG", false),
    ("NVMLDeviceHealthCheck", false),
    ("ComputeDomainCliques", true),
    ("CrashOnNVLinkFabricErrors", true),
    ("DeviceMetadata", false),
    ("DRAListTypeAttributes", false),
    ("FabricManagerPartitioning", false),
    ("HostManagedIMEXDaemon", false),
    ("ConsumableShares", false),
];

/// Pairs that cannot be enabled together.
const EXCLUSIVE: &[(&str, &str)] = &[
    ("DynamicMIG", "PassthroughSupport"),
    ("DynamicMIG", "MPSSupport"),
    ("PassthroughSupport", "NVMLDeviceHealthCheck"),
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureGates(BTreeMap<&'static str, bool>);

impl Default for FeatureGates {
    fn default() -> Self {
        FeatureGates(KNOWN.iter().copied().collect())
    }
}

impl FeatureGates {
    /// Parses `Name=true,Other=false`; unknown names and bad values are errors naming them.
    pub fn parse(spec: &str) -> Result<Self> {
        let mut gates = FeatureGates::default();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, value) = item
                .split_once('=')
                .ok_or_else(|| Error::FeatureGates(format!("{item:?} is not Name=true|false")))?;
            let (name, value) = (name.trim(), value.trim());
            let key = KNOWN
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(k, _)| *k)
                .ok_or_else(|| {
                    let known: Vec<_> = KNOWN.iter().map(|(k, _)| *k).collect();
                    Error::FeatureGates(format!(
                        "unknown feature gate {name:?}; known: {}",
                        known.join(", ")
                    ))
                })?;
            let on = match value.to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                _ => {
                    return Err(Error::FeatureGates(format!(
                        "{name}={value:?}: value must be true or false"
                    )));
                }
            };
            gates.0.insert(key, on);
        }
        for (a, b) in EXCLUSIVE {
            if gates.enabled(a) && gates.enabled(b) {
                return Err(Error::FeatureGates(format!(
                    "{a} and {b} cannot be enabled together"
                )));
            }
        }
        Ok(gates)
    }

    pub fn enabled(&self, name: &str) -> bool {
        self.0.get(name).copied().unwrap_or(false)
    }

    pub fn dynamic_mig(&self) -> bool {
        self.enabled("DynamicMIG")
    }
}

impl fmt::Display for FeatureGates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let items: Vec<_> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        f.write_str(&items.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nvidia_gate_strings() {
        let g = FeatureGates::parse("DynamicMIG=true, MPSSupport=false").unwrap();
        assert!(g.dynamic_mig());
        assert!(!g.enabled("MPSSupport"));
        assert!(g.enabled("ComputeDomainCliques"), "defaults kept");
        assert_eq!(FeatureGates::parse("").unwrap(), FeatureGates::default());
    }

    #[test]
    fn rejects_unknown_malformed_and_conflicting_gates() {
        let e = FeatureGates::parse("DynamicMig=true")
            .unwrap_err()
            .to_string();
        assert!(e.contains("DynamicMig") && e.contains("DynamicMIG"), "{e}");
        assert!(FeatureGates::parse("DynamicMIG").is_err());
        assert!(
            FeatureGates::parse("DynamicMIG=yes")
                .unwrap_err()
                .to_string()
                .contains("yes")
        );
        let e = FeatureGates::parse("DynamicMIG=true,MPSSupport=true")
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot be enabled together"), "{e}");
    }
}
