//! On-demand MIG: the controller side. Nodes publish the GPUs and MIG devices they have and report
//! them in their MigLayout; the shaper watches claims that nothing published can serve, decides
//! per node and GPU which new MIG device would serve them, and writes the wanted geometry into the
//! MigLayout's spec for the node's plugin to carry out. Idle GPUs go back to whole after a
//! hold-down. `decide` is the pure core; `run` the Kubernetes wiring.
pub mod decide;
pub mod demand;
pub mod gate;
pub mod model;
mod precarve;
pub mod run;
pub mod unmet;

#[cfg(test)]
mod tests;

use std::time::Duration;

use crate::controller::crd::{MigPolicy, OnDemandMigSpec, PreCarve};

pub use decide::{Change, ChangeKind, Decision, PendingClaim, State, Unmet, decide};
pub use unmet::UnmetReason;

/// The GPUCluster's `onDemandMig` settings, parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    pub placement: MigPolicy,
    pub hold_down: Duration,
    pub pre_carve: Vec<PreCarve>,
}

impl Policy {
    /// `None` when the hold-down is not a duration (the CRD's pattern should have refused it).
    pub fn from_spec(spec: &OnDemandMigSpec) -> Option<Self> {
        Some(Self {
            placement: spec.policy,
            hold_down: parse_duration(&spec.hold_down)?,
            pre_carve: spec.pre_carve.clone(),
        })
    }
}

/// A Go-style duration of `h`, `m`, `s` and `ms` parts: `90s`, `5m`, `1h30m`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = s.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(n), 2)
        } else {
            let secs = match rest.chars().next()? {
                'h' => n.checked_mul(3600)?,
                'm' => n.checked_mul(60)?,
                's' => n,
                _ => return None,
            };
            (Duration::from_secs(secs), 1)
        };
        total = total.checked_add(unit)?;
        rest = &rest[len..];
    }
    Some(total)
}
