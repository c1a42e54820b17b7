//! Device health: hardware events in; per GPU, the taints its devices should carry and the
//! health state the kubelet is told. Taints are described here in the driver's own terms (NVIDIA's
//! keys and effects); the plugin crate turns them into the API's `DeviceTaint`s.
//!
//! Unlike NVIDIA's driver, which keeps a taint until the plugin restarts, a GPU gets its taints
//! removed once it reports healthy again and has had no fault for a hold-down period, so a
//! flapping GPU stays tainted while it flaps.
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use gpu_dra_api::inventory::{DeviceRef, parse_device_name};
use gpu_dra_api::names::{TAINT_ECC, TAINT_GPU_LOST, TAINT_UNMONITORED, TAINT_XID};

use crate::backend::{HealthEvent, HealthEventKind};

/// XIDs that an application causes (illegal address, MMU fault of a process, ...) and that say
/// nothing about the GPU's health; NVIDIA's driver ignores the same ones by default.
pub const APPLICATION_XIDS: &[u64] = &[13, 31, 43, 45, 68, 109];

impl HealthEvent {
    /// Whether the GPU should stop taking new work.
    pub fn makes_unhealthy(&self) -> bool {
        match self.kind {
            HealthEventKind::Xid(code) => !APPLICATION_XIDS.contains(&code),
            HealthEventKind::DoubleBitEcc | HealthEventKind::GpuLost => true,
            HealthEventKind::Unmonitored | HealthEventKind::Healthy => false,
        }
    }
}

/// What the kubelet is told about a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Healthy,
    Unhealthy,
    Unknown,
}

/// A taint the devices of a GPU should carry: NVIDIA's key, value and effect, and since when
/// (whole seconds; none for a state that is not a fault).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthTaint {
    pub key: &'static str,
    pub value: Option<String>,
    pub effect: &'static str,
    pub since: Option<SystemTime>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Fault {
    value: Option<String>,
    effect: &'static str,
    /// Whole seconds, as the API stores it, so republishing compares equal.
    since: SystemTime,
}

#[derive(Debug, Clone, Default)]
struct GpuHealth {
    faults: BTreeMap<&'static str, Fault>,
    last_fault: Option<SystemTime>,
    healthy_reported: Option<SystemTime>,
    unmonitored: bool,
    message: String,
}

#[derive(Debug, Clone)]
pub struct HealthTracker {
    hold_down: Duration,
    gpus: BTreeMap<u32, GpuHealth>,
}

fn whole_seconds(t: SystemTime) -> SystemTime {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

impl HealthTracker {
    pub fn new(hold_down: Duration) -> Self {
        HealthTracker {
            hold_down,
            gpus: BTreeMap::new(),
        }
    }

    /// Records an event; returns whether taints or health changed.
    pub fn apply(&mut self, ev: &HealthEvent, now: SystemTime) -> bool {
        let g = self.gpus.entry(ev.minor).or_default();
        let before = (g.faults.clone(), g.unmonitored);
        let fault = |g: &mut GpuHealth,
                     key: &'static str,
                     value: Option<String>,
                     effect: &'static str,
                     message: String| {
            let since = g
                .faults
                .get(key)
                .filter(|f| f.value == value && f.effect == effect)
                .map(|f| f.since)
                .unwrap_or(whole_seconds(now));
            g.faults.insert(
                key,
                Fault {
                    value,
                    effect,
                    since,
                },
            );
            g.last_fault = Some(now);
            g.healthy_reported = None;
            g.message = message;
        };
        match ev.kind {
            HealthEventKind::Xid(code) => {
                let effect = if APPLICATION_XIDS.contains(&code) {
                    "None"
                } else {
                    "NoSchedule"
                };
                fault(
                    g,
                    TAINT_XID,
                    Some(code.to_string()),
                    effect,
                    format!("XID {code}"),
                );
            }
            HealthEventKind::DoubleBitEcc => fault(
                g,
                TAINT_ECC,
                Some("uncorrectable".into()),
                "NoSchedule",
                "uncorrectable ECC error".into(),
            ),
            HealthEventKind::GpuLost => {
                fault(g, TAINT_GPU_LOST, None, "NoSchedule", "GPU is lost".into())
            }
            HealthEventKind::Unmonitored => {
                g.unmonitored = true;
                g.message = "health events cannot be watched".into();
            }
            HealthEventKind::Healthy => {
                g.unmonitored = false;
                g.healthy_reported = Some(now);
            }
        }
        let changed = (g.faults.clone(), g.unmonitored) != before;
        self.expire(now) || changed
    }

    /// Lifts the faults of GPUs that reported healthy and stayed fault-free for the hold-down.
    pub fn expire(&mut self, now: SystemTime) -> bool {
        let mut changed = false;
        for g in self.gpus.values_mut() {
            let (Some(last), Some(_)) = (g.last_fault, g.healthy_reported) else {
                continue;
            };
            if !g.faults.is_empty()
                && now.duration_since(last).unwrap_or_default() >= self.hold_down
            {
                g.faults.clear();
                g.message.clear();
                changed = true;
            }
        }
        changed
    }

    pub fn health(&self, minor: u32) -> Health {
        match self.gpus.get(&minor) {
            None => Health::Healthy,
            Some(g) if g.faults.values().any(|f| f.effect != "None") => Health::Unhealthy,
            Some(g) if g.unmonitored => Health::Unknown,
            Some(_) => Health::Healthy,
        }
    }

    pub fn message(&self, minor: u32) -> String {
        self.gpus
            .get(&minor)
            .map(|g| g.message.clone())
            .unwrap_or_default()
    }

    /// The taints of the devices of GPU `minor` (the GPU and its MIG devices); none when healthy.
    pub fn taints(&self, minor: u32) -> Vec<HealthTaint> {
        let Some(g) = self.gpus.get(&minor) else {
            return Vec::new();
        };
        let mut taints: Vec<HealthTaint> = g
            .faults
            .iter()
            .map(|(key, f)| HealthTaint {
                key,
                value: f.value.clone(),
                effect: f.effect,
                since: Some(f.since),
            })
            .collect();
        if g.unmonitored {
            taints.push(HealthTaint {
                key: TAINT_UNMONITORED,
                value: None,
                effect: "None",
                since: None,
            });
        }
        taints
    }
}

/// The GPU minor a published device name belongs to.
pub fn gpu_of(device: &str) -> Option<u32> {
    match parse_device_name(device)? {
        DeviceRef::Gpu { minor } => Some(minor),
        DeviceRef::Mig { parent_minor, .. } => Some(parent_minor),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(minor: u32, kind: HealthEventKind) -> HealthEvent {
        HealthEvent {
            minor,
            uuid: format!("GPU-{minor}"),
            kind,
            mig: None,
        }
    }

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    #[test]
    fn events_map_to_nvidia_taints() {
        let mut h = HealthTracker::new(Duration::from_secs(60));
        assert!(h.apply(&ev(0, HealthEventKind::Xid(79)), t(0)));
        assert!(h.apply(&ev(1, HealthEventKind::Xid(13)), t(0)));
        assert!(h.apply(&ev(2, HealthEventKind::GpuLost), t(0)));
        assert!(h.apply(&ev(3, HealthEventKind::Unmonitored), t(0)));
        assert!(h.apply(&ev(4, HealthEventKind::DoubleBitEcc), t(0)));
        let x = &h.taints(0)[0];
        assert_eq!(
            (x.key, x.value.as_deref(), x.effect),
            (TAINT_XID, Some("79"), "NoSchedule")
        );
        assert_eq!(
            h.taints(1)[0].effect,
            "None",
            "application XIDs do not stop scheduling"
        );
        assert_eq!(h.taints(2)[0].key, TAINT_GPU_LOST);
        assert_eq!(h.taints(3)[0].key, TAINT_UNMONITORED);
        assert_eq!(h.taints(4)[0].key, TAINT_ECC);
        assert_eq!(
            [0, 1, 2, 3, 4, 5].map(|m| h.health(m)),
            [
                Health::Unhealthy,
                Health::Healthy,
                Health::Unhealthy,
                Health::Unknown,
                Health::Unhealthy,
                Health::Healthy
            ]
        );
        assert!(
            !h.apply(&ev(0, HealthEventKind::Xid(79)), t(1)),
            "a repeat changes nothing"
        );
        assert_eq!(h.taints(0)[0].since, Some(t(0)), "first occurrence kept");
    }

    #[test]
    fn recovery_waits_for_healthy_and_the_hold_down() {
        let mut h = HealthTracker::new(Duration::from_secs(60));
        h.apply(&ev(0, HealthEventKind::Xid(79)), t(0));
        assert!(!h.expire(t(120)), "no healthy report yet: stays tainted");
        h.apply(&ev(0, HealthEventKind::Healthy), t(130));
        assert_eq!(
            h.health(0),
            Health::Healthy,
            "the report itself lifts the fault once the hold-down since the fault passed"
        );
        assert!(h.taints(0).is_empty());

        // Flapping: each fault restarts the hold-down.
        h.apply(&ev(0, HealthEventKind::Xid(48)), t(200));
        h.apply(&ev(0, HealthEventKind::Healthy), t(210));
        assert!(!h.expire(t(230)));
        h.apply(&ev(0, HealthEventKind::Xid(48)), t(240));
        h.apply(&ev(0, HealthEventKind::Healthy), t(250));
        assert!(
            !h.expire(t(290)),
            "60 s after the last fault have not passed"
        );
        assert_eq!(h.health(0), Health::Unhealthy);
        assert!(h.expire(t(300)));
        assert_eq!(h.health(0), Health::Healthy);
    }
}
