//! Consumable shares (feature gate `ConsumableShares` plus NVIDIA's `--consumable-shares` /
//! `CONSUMABLE_SHARES`): GPU and MIG devices that several claims may be allocated at once, each
//! taking part of the device's `memory` (and, in the integer mode, of its `shares`). The scheduler
//! does the accounting; prepare only checks that the sharing claims configure a device equally.
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, DeviceCapacity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{SliceContent, bytes};
use crate::gates::FeatureGates;

/// The environment variable NVIDIA's chart sets from its `consumableShares` value.
pub const CONSUMABLE_SHARES_ENV: &str = "CONSUMABLE_SHARES";

/// How devices are shared, NVIDIA's values: `disabled` | `memory` | `unlimited` | `<N>`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ConsumableShares {
    /// Nothing is shared (the default, even with the gate on).
    #[default]
    Disabled,
    /// By memory: a claim that names no memory takes all of it.
    Memory,
    /// Without limit: a claim that names no memory takes none.
    Unlimited,
    /// As `Unlimited`, plus a `shares` capacity of N; each claim takes one unless it asks for
    /// more.
    Shares(i64),
}

impl FromStr for ConsumableShares {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "disabled" => Ok(Self::Disabled),
            "memory" => Ok(Self::Memory),
            "unlimited" => Ok(Self::Unlimited),
            n => match n.parse::<i64>() {
                Ok(n) if n > 0 => Ok(Self::Shares(n)),
                _ => Err(format!(
                    "invalid value for --consumable-shares: {s:?} (must be 'disabled', \
                     'memory', 'unlimited', or a positive integer)"
                )),
            },
        }
    }
}

impl fmt::Display for ConsumableShares {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Disabled => f.write_str("disabled"),
            Self::Memory => f.write_str("memory"),
            Self::Unlimited => f.write_str("unlimited"),
            Self::Shares(n) => write!(f, "{n}"),
        }
    }
}

impl ConsumableShares {
    /// Refuses a mode other than `disabled` without the gate, as NVIDIA's plugin does at startup.
    pub fn check_gate(self, gates: &FeatureGates) -> Result<(), String> {
        if self != Self::Disabled && !gates.enabled("ConsumableShares") {
            return Err(
                "--consumable-shares requires feature gate ConsumableShares to be enabled".into(),
            );
        }
        Ok(())
    }

    /// Whether devices are published shareable: the gate is on and the mode is not `disabled`.
    pub fn active(self, gates: &FeatureGates) -> bool {
        self != Self::Disabled && gates.enabled("ConsumableShares")
    }
}

/// Makes every GPU and MIG device (not VFIO devices) shareable in `mode`: allowed to several
/// claims at once, `memory` rounded down to whole MiB with a request policy in steps of 1Mi, and
/// in the integer mode a `shares` capacity. Applied to built slice contents.
pub fn enable_consumable_shares(contents: &mut [SliceContent], mode: ConsumableShares) {
    if mode == ConsumableShares::Disabled {
        return;
    }
    for d in contents.iter_mut().flat_map(|c| c.devices.iter_mut()) {
        let kind = d.attributes.as_ref().and_then(|a| a.get("type"));
        if kind.and_then(|t| t.string.as_deref()) == Some("vfio") {
            continue;
        }
        d.allow_multiple_allocations = Some(true);
        let Some(capacity) = d.capacity.as_mut() else {
            continue;
        };
        let Some(memory) = capacity.get_mut("memory") else {
            continue;
        };
        let Ok(total) = crate::quantity::parse_int(&memory.value.0) else {
            continue;
        };
        const MI: u64 = 1 << 20;
        let max = bytes((u64::try_from(total).unwrap_or(u64::MAX) / MI) * MI);
        memory.value = max.clone();
        let (default, min) = match mode {
            ConsumableShares::Memory => (max.clone(), Quantity("1Mi".into())),
            _ => (Quantity("0".into()), Quantity("0".into())),
        };
        memory.request_policy = Some(policy(default, min, max, Quantity("1Mi".into())));
        if let ConsumableShares::Shares(n) = mode {
            let one = || decimal(1);
            capacity.insert(
                "shares".into(),
                DeviceCapacity {
                    value: decimal(n),
                    request_policy: Some(policy(one(), one(), decimal(n), one())),
                },
            );
        }
    }
}

fn policy(
    default: Quantity,
    min: Quantity,
    max: Quantity,
    step: Quantity,
) -> CapacityRequestPolicy {
    CapacityRequestPolicy {
        default: Some(default),
        valid_range: Some(CapacityRequestPolicyRange {
            min,
            max: Some(max),
            step: Some(step),
        }),
        valid_values: None,
    }
}

/// A count in Kubernetes' canonical DecimalSI form: `4`, `1k`, `2M`.
fn decimal(n: i64) -> Quantity {
    const SUFFIXES: [&str; 6] = ["k", "M", "G", "T", "P", "E"];
    let (mut v, mut suffix) = (n, "");
    for s in SUFFIXES {
        if v == 0 || v % 1000 != 0 {
            break;
        }
        v /= 1000;
        suffix = s;
    }
    Quantity(format!("{v}{suffix}"))
}

#[cfg(test)]
mod tests;
