//! Planning a prepare: what each allocated device is on this node, its resolved config, and
//! whether another claim holds it.
use std::sync::Arc;

use gpu_dra_api::config::{DeviceConfig, DeviceKind, SharingStrategy, TimeSliceInterval};
use gpu_dra_api::inventory::{DeviceRef, Gpu, MigDevice, parse_device_name};

use super::{DeviceState, HardwareChange, known_changes};
use crate::Error;
use crate::checkpoint::ClaimRecord;
use crate::configs;
use crate::types::{AllocatedDevice, ClaimAllocation, ClaimRef};

/// What an allocated device is on this node. GPUs are shared with the inventory (a prepare
/// copies no hardware description).
pub(super) enum Target {
    Gpu(Arc<Gpu>),
    /// an existing MIG device: its index in the GPU's MIG devices
    StaticMig(Arc<Gpu>, usize),
    /// a MIG device to create: GI profile ID and placement start
    DynamicMig(Arc<Gpu>, u32, u32),
    /// the GPU's PCI function, to bind to vfio-pci (`gpu-vfio-<index>`)
    Vfio(Arc<Gpu>),
}

pub(super) fn static_mig(gpu: &Gpu, index: usize) -> &MigDevice {
    &gpu.mig
        .as_ref()
        .expect("a static MIG target's GPU has MIG state")
        .devices[index]
}

pub(super) struct Planned {
    pub(super) alloc: AllocatedDevice,
    pub(super) target: Target,
    /// The resolved, normalized and validated config.
    pub(super) config: DeviceConfig,
    /// Where it came from (for errors).
    pub(super) config_at: String,
}

impl Planned {
    pub(super) fn strategy(&self) -> Option<SharingStrategy> {
        self.config.sharing().map(|s| s.strategy)
    }

    /// The interval a TimeSlicing config sets on a whole GPU (MIG devices: none, a no-op).
    pub(super) fn time_slice(&self) -> Option<(u32, TimeSliceInterval)> {
        match (&self.target, self.config.sharing()) {
            (Target::Gpu(gpu), Some(s)) if s.strategy == SharingStrategy::TimeSlicing => Some((
                gpu.minor,
                s.time_slicing_config
                    .as_ref()
                    .and_then(|t| t.interval)
                    .unwrap_or_default(),
            )),
            _ => None,
        }
    }

    pub(super) fn involves_sharing(&self) -> bool {
        self.config.sharing().is_some() || self.alloc.share_id.is_some()
    }
}

impl DeviceState {
    pub(super) fn plan(&self, alloc: &ClaimAllocation) -> Result<Vec<Planned>, Error> {
        if alloc.devices.is_empty() {
            return Err(Error::InvalidAllocation(format!(
                "ResourceClaim {} has no devices of this driver in pool {}",
                alloc.claim.key(),
                self.pool
            )));
        }
        alloc
            .devices
            .iter()
            .map(|d| {
                let target = self.target(d)?;
                let kind = match target {
                    Target::Gpu(_) => DeviceKind::Gpu,
                    Target::Vfio(_) => DeviceKind::Vfio,
                    _ => DeviceKind::Mig,
                };
                let (config, config_at) =
                    configs::resolve_with_source(d, kind, &alloc.configs, &self.gates)?;
                let planned = Planned {
                    alloc: d.clone(),
                    target,
                    config,
                    config_at,
                };
                if planned.strategy() == Some(SharingStrategy::Mps) && d.share_id.is_some() {
                    return Err(Error::Unsupported(format!(
                        "{}: MPS cannot be combined with consumable shares (the device is \
                         allocated as share {}); use a whole device for MPS",
                        d.device,
                        d.share_id.as_deref().unwrap_or_default()
                    )));
                }
                Ok(planned)
            })
            .collect()
    }

    fn target(&self, d: &AllocatedDevice) -> Result<Target, Error> {
        let invalid = |why: String| {
            Error::InvalidAllocation(format!("device {}/{}: {why}", d.pool, d.device))
        };
        if d.pool != self.pool {
            return Err(invalid(format!("this node serves pool {}", self.pool)));
        }
        let gpus = self.gpus();
        let gpu_of = |minor: u32| {
            gpus.iter()
                .find(|g| g.minor == minor)
                .cloned()
                .ok_or_else(|| invalid("no such GPU on this node".into()))
        };
        if let Some(gpu) = self.vfio_target(&d.device) {
            return gpu.map(Target::Vfio).map_err(invalid);
        }
        match parse_device_name(&d.device)
            .ok_or_else(|| invalid("not a device name this driver publishes".into()))?
        {
            DeviceRef::Gpu { minor } => {
                let gpu = gpu_of(minor)?;
                if gpu.mig_enabled() && !self.gates.dynamic_mig() {
                    return Err(invalid(
                        "the GPU is in MIG mode; only its MIG devices can be allocated".into(),
                    ));
                }
                Ok(Target::Gpu(gpu))
            }
            DeviceRef::Mig {
                parent_minor,
                gi_profile_id,
                start,
            } => {
                let gpu = gpu_of(parent_minor)?;
                if self.gates.dynamic_mig() {
                    if !gpu
                        .mig_profile(gi_profile_id)
                        .is_some_and(|p| p.placements.iter().any(|[s, _]| *s == start))
                    {
                        return Err(invalid("no such MIG placement on this GPU".into()));
                    }
                    return Ok(Target::DynamicMig(gpu, gi_profile_id, start));
                }
                let index = gpu
                    .mig
                    .as_ref()
                    .and_then(|m| {
                        m.devices.iter().position(|m| {
                            m.gi_profile_id == gi_profile_id && m.placement_start == start
                        })
                    })
                    .ok_or_else(|| invalid("no such MIG device exists on this GPU".into()))?;
                Ok(Target::StaticMig(gpu, index))
            }
        }
    }

    /// A device belongs to one claim at a time, except for admin access and consumable shares;
    /// claims sharing a device (each with its own share ID) must have equal normalized configs.
    pub(super) fn check_not_in_use(
        &self,
        claim: &ClaimRef,
        planned: &[Planned],
    ) -> Result<(), Error> {
        self.checkpoint
            .with_claims(|others| Self::check_against(others, claim, planned))
    }

    fn check_against(
        others: &std::collections::BTreeMap<String, ClaimRecord>,
        claim: &ClaimRef,
        planned: &[Planned],
    ) -> Result<(), Error> {
        for p in planned.iter().filter(|p| !p.alloc.admin_access) {
            for (uid, r) in others.iter().filter(|(uid, _)| **uid != claim.uid) {
                let Some(held) = r.devices.iter().find(|d| d.device_name == p.alloc.device) else {
                    continue;
                };
                if p.alloc.share_id.is_none() || held.share_id.is_none() {
                    return Err(Error::Busy(format!(
                        "device {} is already prepared for ResourceClaim {}/{} ({uid})",
                        p.alloc.device, r.namespace, r.name
                    )));
                }
                let theirs = known_changes(r)
                    .find_map(|c| match c {
                        HardwareChange::SharedDevice { device, config }
                            if device == p.alloc.device =>
                        {
                            serde_json::from_value::<DeviceConfig>(config).ok()
                        }
                        _ => None,
                    })
                    .unwrap_or_else(|| {
                        let mut d = DeviceConfig::default_for(p.config.kind());
                        d.normalize();
                        d
                    });
                if theirs != p.config {
                    return Err(Error::Busy(format!(
                        "device {} is shared with ResourceClaim {}/{} ({uid}) under a different \
                         config; claims sharing a device must configure it equally (this claim: \
                         {}, theirs: {})",
                        p.alloc.device,
                        r.namespace,
                        r.name,
                        serde_json::to_string(&p.config).unwrap_or_default(),
                        serde_json::to_string(&theirs).unwrap_or_default(),
                    )));
                }
            }
        }
        Ok(())
    }
}
