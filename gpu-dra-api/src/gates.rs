//! Feature gates: the gate set of NVIDIA's binaries (`gpu-kubelet-plugin`,
//! `compute-domain-kubelet-plugin`, `compute-domain-controller`), so their `--feature-gates` /
//! `FEATURE_GATES` strings and Helm `featureGates` values carry over unchanged.
//!
//! NVIDIA registers its driver gates and the Kubernetes logging gates in one Kubernetes
//! (`component-base`) feature gate, emulating Kubernetes 1.36. This module reads the same strings
//! the same way:
//!
//! * `Name=value` pairs separated by commas; empty items are skipped, names and values are
//!   trimmed; a later pair for the same name wins;
//! * values are Go booleans: `true`, `True`, `TRUE`, `t`, `T`, `1` and the `false` forms;
//! * an unknown name is an error (`unrecognized feature gate`);
//! * `AllAlpha=<bool>` / `AllBeta=<bool>` set every alpha / beta gate that is not named
//!   explicitly (NVIDIA's binaries set `ContextualLogging=true` themselves at startup, so the
//!   `All*` switches leave it alone);
//! * then the dependency rules NVIDIA's binaries check at startup ([`RULES`]); a violation is an
//!   error naming both gates.
//!
//! Gates this project does not implement are accepted with NVIDIA's defaults;
//! [`FeatureGates::without_effect`] lists the ones a binary should warn about.
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::{Error, Result};

/// Kubernetes' maturity of a gate at NVIDIA's emulation version; `AllAlpha` / `AllBeta` act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Alpha,
    Beta,
}

/// The binaries of NVIDIA's driver that read gates, by what they do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// `gpu-kubelet-plugin`; here `dra-plugin run` for `gpu.nvidia.com`.
    GpuPlugin,
    /// `compute-domain-kubelet-plugin`; here `dra-plugin run --driver-name compute-domain.nvidia.com`.
    ComputeDomainPlugin,
    /// `compute-domain-controller` (and the `compute-domain-daemon` it starts).
    ComputeDomainController,
}

/// Where a gate comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// NVIDIA's own gates (`pkg/featuregates`).
    Driver,
    /// The Kubernetes logging gates (`k8s.io/component-base/logs/api/v1`).
    Logging,
    /// `AllAlpha` / `AllBeta`.
    Switch,
}

/// What this project does with a gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Implemented with NVIDIA's meaning.
    Implemented,
    /// Accepted (with NVIDIA's default) so NVIDIA's settings start the binaries, but it switches
    /// nothing here; the text says why.
    NoEffect(&'static str),
}

/// One gate of NVIDIA's set.
#[derive(Debug, Clone, Copy)]
pub struct Gate {
    pub name: &'static str,
    pub default: bool,
    pub stage: Stage,
    pub origin: Origin,
    /// NVIDIA's binaries whose behaviour the gate changes.
    pub used_by: &'static [Component],
    pub support: Support,
}

use Component::{ComputeDomainController as Ctl, ComputeDomainPlugin as Cd, GpuPlugin as Gpu};

const EVERY_BINARY: &[Component] = &[Gpu, Cd, Ctl];
const LOGGING: Support = Support::NoEffect(
    "it guards klog options; logging here is set with -v and --logging-format (LOG_VERBOSITY, \
     LOGGING_FORMAT)",
);

/// Every gate NVIDIA's binaries accept, with NVIDIA's defaults (driver v0.5, Kubernetes 1.36).
pub const GATES: &[Gate] = &[
    Gate {
        name: "TimeSlicingSettings",
        default: false,
        stage: Stage::Alpha,
        origin: Origin::Driver,
        used_by: &[Gpu],
        support: Support::Implemented,
    },
    Gate {
        name: "MPSSupport",
        default: false,
        stage: Stage::Alpha,
        origin: Origin::Driver,
        used_by: &[Gpu],
        support: Support::Implemented,
    },
    Gate {
        name: "IMEXDaemonsWithDNSNames",
        default: true,
        stage: Stage::Beta,
        origin: Origin::Driver,
        used_by: &[Cd, Ctl],
        support: Support::Implemented,
    },
    Gate {
        name: "PassthroughSupport",
        default: false,
        stage: Stage::Alpha,
        origin: Origin::Driver,
        used_by: &[Gpu],
        support: Support::Implemented,
    },
    Gate {
        name: "DynamicMIG",
        default: false,
        stage: Stage::Alpha,
        origin: Origin::Driver,
        used_by: &[Gpu],
        support: Support::Implemented,
    },
    Gate {
        name: "NVMLDeviceHealthCheck",
        default: false,
        stage: Stage::Alpha,
        origin: Origin::Driver,
        used_by: &[Gpu],
        support: Support::Implemented,
    },
    Gate {
        name: "ComputeDomainCliques",
        default: true,
        stage: Stage::Beta,
        origin: Origin::Driver,
        used_by: &[Cd, Ctl],
        support: Support::Implemented,
    },
    Gate {
        name: "CrashOnNVLinkFabricErrors",
        default: true,
        stage: Stage::Beta,
        origin: Origin::Driver,
        used_by: &[Cd],
        support: Support::NoEffect("the compute-domain plugin does not read NVLink fabric state"),
    },
    Gate {
        name: "DeviceMetadata",
        default: false,
        stage: Stage::Alpha,
        origin: Origin::Driver,
        used_by: &[Gpu],
        support: Support::Implemented,
    },
    Gate {
        name: "DRAListTypeAttributes",
        default: false,
        stage: Stage::Alpha,
        origin: Origin::Driver,
        used_by: &[Gpu],
        support: Support::NoEffect("resource.kubernetes.io/numaNode is always published as an int"),
    },
    Gate {
        name: "FabricManagerPartitioning",
        default: false,
        stage: Stage::Alpha,
        origin: Origin::Driver,
        used_by: &[Gpu],
        support: Support::NoEffect("Fabric Manager partitions are neither published nor activated"),
    },
    Gate {
        name: "HostManagedIMEXDaemon",
        default: false,
        stage: Stage::Alpha,
        origin: Origin::Driver,
        used_by: &[Cd, Ctl],
        support: Support::NoEffect(
            "there is no host-managed IMEX mode; the driver runs the daemons",
        ),
    },
    Gate {
        name: "ConsumableShares",
        default: false,
        stage: Stage::Alpha,
        origin: Origin::Driver,
        used_by: &[Gpu],
        support: Support::Implemented,
    },
    Gate {
        name: "ContextualLogging",
        default: true,
        stage: Stage::Beta,
        origin: Origin::Logging,
        used_by: EVERY_BINARY,
        support: LOGGING,
    },
    Gate {
        name: "LoggingAlphaOptions",
        default: false,
        stage: Stage::Alpha,
        origin: Origin::Logging,
        used_by: EVERY_BINARY,
        support: LOGGING,
    },
    Gate {
        name: "LoggingBetaOptions",
        default: true,
        stage: Stage::Beta,
        origin: Origin::Logging,
        used_by: EVERY_BINARY,
        support: LOGGING,
    },
    Gate {
        name: "AllAlpha",
        default: false,
        stage: Stage::Alpha,
        origin: Origin::Switch,
        used_by: EVERY_BINARY,
        support: Support::Implemented,
    },
    Gate {
        name: "AllBeta",
        default: false,
        stage: Stage::Beta,
        origin: Origin::Switch,
        used_by: EVERY_BINARY,
        support: Support::Implemented,
    },
];

/// Gates NVIDIA's binaries set explicitly at startup, before the user's string: `AllAlpha` /
/// `AllBeta` do not change them (only naming them does).
const SET_BY_BINARY: &[&str] = &["ContextualLogging"];

/// A startup rule between two gates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The first gate needs the second.
    Requires(&'static str, &'static str),
    /// The two gates cannot both be on.
    Excludes(&'static str, &'static str),
}

/// NVIDIA's startup rules (`ValidateFeatureGates`), checked by every binary whatever its role.
///
/// NVIDIA's `main` at 95932046 also refused `DynamicMIG` with `NVMLDeviceHealthCheck`; its PR
/// #1266 lifts that, and health checking here covers dynamic MIG devices, so the pair is allowed.
pub const RULES: &[Rule] = &[
    Rule::Requires("ComputeDomainCliques", "IMEXDaemonsWithDNSNames"),
    Rule::Excludes("DynamicMIG", "PassthroughSupport"),
    Rule::Excludes("DynamicMIG", "MPSSupport"),
    Rule::Excludes("PassthroughSupport", "NVMLDeviceHealthCheck"),
    Rule::Requires("DeviceMetadata", "PassthroughSupport"),
];

/// A gate that is set (or on) but does nothing here, for a startup warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoEffect {
    pub gate: &'static str,
    pub value: bool,
    pub reason: &'static str,
}

impl fmt::Display for NoEffect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "feature gate {}={} is accepted for compatibility with NVIDIA's driver but has no \
             effect here: {}",
            self.gate, self.value, self.reason
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureGates {
    values: BTreeMap<&'static str, bool>,
    /// Gates the string set: by name, or through `AllAlpha` / `AllBeta`.
    set: BTreeSet<&'static str>,
}

impl Default for FeatureGates {
    fn default() -> Self {
        FeatureGates {
            values: GATES.iter().map(|g| (g.name, g.default)).collect(),
            set: BTreeSet::new(),
        }
    }
}

fn gate(name: &str) -> Option<&'static Gate> {
    GATES.iter().find(|g| g.name == name)
}

/// Go's `strconv.ParseBool`.
fn go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

impl FeatureGates {
    /// Parses a `--feature-gates` / `FEATURE_GATES` string and checks [`RULES`].
    pub fn parse(spec: &str) -> Result<Self> {
        let gates = Self::parse_unchecked(spec)?;
        gates.check_rules()?;
        Ok(gates)
    }

    /// Parses without checking [`RULES`].
    pub fn parse_unchecked(spec: &str) -> Result<Self> {
        // As component-base does: every value is read first, then every name is looked up.
        let mut pairs: Vec<(&str, bool)> = Vec::new();
        for item in spec.split(',').filter(|s| !s.is_empty()) {
            let Some((name, value)) = item.split_once('=') else {
                return Err(Error::FeatureGates(format!(
                    "missing bool value for {}",
                    item.trim()
                )));
            };
            let (name, value) = (name.trim(), value.trim());
            let on = go_bool(value).ok_or_else(|| {
                Error::FeatureGates(format!(
                    "invalid value of {name}={value}: want true or false (also accepted: 1, t, T, \
                     TRUE, True, 0, f, F, FALSE, False)"
                ))
            })?;
            pairs.push((name, on));
        }
        let mut named: BTreeMap<&'static str, bool> = BTreeMap::new();
        for (name, on) in pairs {
            let g = gate(name).ok_or_else(|| {
                let known: Vec<_> = GATES.iter().map(|g| g.name).collect();
                Error::FeatureGates(format!(
                    "unrecognized feature gate: {name} (known: {})",
                    known.join(", ")
                ))
            })?;
            named.insert(g.name, on);
        }
        let mut gates = FeatureGates::default();
        for g in GATES {
            let switch = match g.stage {
                Stage::Alpha => "AllAlpha",
                Stage::Beta => "AllBeta",
            };
            let value = if let Some(v) = named.get(g.name) {
                Some(*v)
            } else if g.origin != Origin::Switch && !SET_BY_BINARY.contains(&g.name) {
                named.get(switch).copied()
            } else {
                None
            };
            if let Some(v) = value {
                gates.values.insert(g.name, v);
                gates.set.insert(g.name);
            }
        }
        Ok(gates)
    }

    /// NVIDIA's startup rules; every violation is reported, each naming both gates.
    pub fn check_rules(&self) -> Result<()> {
        let broken: Vec<String> = RULES
            .iter()
            .filter_map(|rule| match *rule {
                Rule::Requires(a, b) if self.enabled(a) && !self.enabled(b) => {
                    Some(format!("feature gate {a} requires {b} to also be enabled"))
                }
                Rule::Excludes(a, b) if self.enabled(a) && self.enabled(b) => {
                    Some(format!("feature gates {a} and {b} are mutually exclusive"))
                }
                _ => None,
            })
            .collect();
        if broken.is_empty() {
            Ok(())
        } else {
            Err(Error::FeatureGates(broken.join("; ")))
        }
    }

    pub fn enabled(&self, name: &str) -> bool {
        debug_assert!(gate(name).is_some(), "{name} is not a feature gate");
        self.values.get(name).copied().unwrap_or(false)
    }

    /// Whether the string set the gate (by name, or through `AllAlpha` / `AllBeta`).
    pub fn is_set(&self, name: &str) -> bool {
        self.set.contains(name)
    }

    pub fn dynamic_mig(&self) -> bool {
        self.enabled("DynamicMIG")
    }

    /// Gates that change `component`'s behaviour in NVIDIA's driver but not here, and that the
    /// operator asked for: set by the string, or (driver gates) on by default.
    pub fn without_effect(&self, component: Component) -> Vec<NoEffect> {
        GATES
            .iter()
            .filter(|g| g.used_by.contains(&component))
            .filter_map(|g| {
                let Support::NoEffect(reason) = g.support else {
                    return None;
                };
                let value = self.enabled(g.name);
                let asked = self.is_set(g.name) || (g.origin == Origin::Driver && value);
                asked.then_some(NoEffect {
                    gate: g.name,
                    value,
                    reason,
                })
            })
            .collect()
    }
}

impl fmt::Display for FeatureGates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let items: Vec<_> = self
            .values
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        f.write_str(&items.join(","))
    }
}

#[cfg(test)]
mod tests;
