//! Passthrough claims in the state machine: which GPU a `gpu-vfio-<index>` is, NVIDIA's rule of
//! one VFIO config group per claim, a GPU never held as `gpu` and `vfio` at once, binding and
//! unbinding through [`PciBus`], and the spec edits.
use std::collections::BTreeSet;
use std::sync::Arc;

use gpu_dra_api::config::{DeviceConfig, VfioDeviceConfig};
use gpu_dra_api::inventory::{DeviceRef, Gpu, gpu_device_name, parse_device_name};
use gpu_dra_api::passthrough::{offers_vfio, parse_vfio_device_name, vfio_uuid};
use tracing::info;

use super::plan::{Planned, Target};
use super::{DeviceState, HardwareChange};
use crate::Error;
use crate::cdi::{DeviceEdits, Spec};
use crate::types::ClaimRef;
use crate::vfio::{PciBus, VfioPrepared, apply_to_spec, device_node, use_iommufd};

impl DeviceState {
    /// Serves `gpu-vfio-<index>` devices through `bus` (feature gate `PassthroughSupport`).
    pub fn with_pci_bus(mut self, bus: PciBus) -> Self {
        self.pci_bus = Some(bus);
        self
    }

    /// Bumped whenever a claim that holds a GPU or its passthrough device comes or goes, so the
    /// publisher can hide or restore the sibling (NVIDIA republishes after each such call).
    pub fn held_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.held_changed.subscribe()
    }

    /// The device names prepared on this node now.
    pub fn held_devices(&self) -> BTreeSet<String> {
        self.checkpoint.with_claims(|claims| {
            claims
                .values()
                .flat_map(|r| r.devices.iter().map(|d| d.device_name.clone()))
                .collect()
        })
    }

    pub(super) fn notify_held(&self) {
        if self.pci_bus.is_some() {
            self.held_changed.send_modify(|n| *n += 1);
        }
    }

    /// The GPU behind `gpu-vfio-<index>` (index in PCI address order), when this node serves it.
    pub(super) fn vfio_target(&self, name: &str) -> Option<Result<Arc<Gpu>, String>> {
        let index = parse_vfio_device_name(name)?;
        if self.pci_bus.is_none() {
            return Some(Err(
                "passthrough devices need the PassthroughSupport feature gate".into(),
            ));
        }
        let all = self.gpus();
        let mut gpus: Vec<&Arc<Gpu>> = all.iter().filter(|g| g.pci.is_some()).collect();
        gpus.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
        Some(match gpus.get(index) {
            Some(g) if offers_vfio(g) => Ok(Arc::clone(g)),
            Some(_) => Err("the GPU has MIG devices; it has no passthrough device".into()),
            None => Err("no such passthrough device on this node".into()),
        })
    }

    /// NVIDIA's rule of at most one VFIO config group per claim, and no GPU held as a whole GPU
    /// (or its MIG devices) by one claim and as a passthrough device by another.
    pub(super) fn check_vfio(&self, claim: &ClaimRef, planned: &[Planned]) -> Result<(), Error> {
        let groups: BTreeSet<&str> = planned
            .iter()
            .filter(|p| matches!(p.target, Target::Vfio(_)))
            .map(|p| p.config_at.as_str())
            .collect();
        if groups.len() > 1 {
            return Err(Error::InvalidAllocation(format!(
                "claim {} contains {} VFIO device groups ({}), but at most one is supported per \
                 claim",
                claim.key(),
                groups.len(),
                groups.into_iter().collect::<Vec<_>>().join(", ")
            )));
        }
        for p in planned {
            let (gpu, vfio) = match &p.target {
                Target::Vfio(gpu) => (gpu, true),
                Target::Gpu(gpu) | Target::StaticMig(gpu, _) | Target::DynamicMig(gpu, ..) => {
                    (gpu, false)
                }
            };
            let sibling = |name: &str| match vfio {
                true => matches!(parse_device_name(name),
                    Some(DeviceRef::Gpu { minor } | DeviceRef::Mig { parent_minor: minor, .. })
                    if minor == gpu.minor),
                false => self
                    .vfio_target(name)
                    .and_then(Result::ok)
                    .is_some_and(|g| g.minor == gpu.minor),
            };
            let busy = self.checkpoint.with_claims(|claims| {
                claims
                    .iter()
                    .filter(|(uid, _)| **uid != claim.uid)
                    .find_map(|(uid, r)| {
                        r.devices.iter().find(|d| sibling(&d.device_name)).map(|d| {
                            format!(
                                "{} for ResourceClaim {}/{} ({uid})",
                                d.device_name, r.namespace, r.name
                            )
                        })
                    })
            });
            if let Some(holder) = busy {
                return Err(Error::Busy(format!(
                    "device {}: its GPU ({}) is already prepared as {holder}",
                    p.alloc.device,
                    gpu_device_name(gpu.minor)
                )));
            }
        }
        Ok(())
    }

    /// The changes passthrough devices will make, recorded before any is made.
    pub(super) fn vfio_changes(planned: &[Planned]) -> Vec<HardwareChange> {
        planned
            .iter()
            .filter_map(|p| match &p.target {
                Target::Vfio(gpu) => Some(HardwareChange::Vfio {
                    device: p.alloc.device.clone(),
                    pci_bus_id: gpu.pci_bus_id.clone(),
                }),
                _ => None,
            })
            .collect()
    }

    /// Binds one GPU to `vfio-pci` and returns its container edits.
    pub(super) async fn bind_vfio(
        &self,
        claim: &ClaimRef,
        p: &Planned,
        gpu: &Gpu,
        created: &mut Vec<HardwareChange>,
    ) -> Result<DeviceEdits, Error> {
        let bus = self.bus()?.clone();
        let iommufd = vfio_config(&p.config).is_some_and(|c| use_iommufd(c, &bus));
        let addr = gpu.pci_bus_id.clone();
        // Recorded before the bind: a bind that fails half-way is undone back to nvidia.
        created.push(HardwareChange::Vfio {
            device: p.alloc.device.clone(),
            pci_bus_id: addr.clone(),
        });
        let node = tokio::task::spawn_blocking(move || {
            bus.configure(&addr)?;
            device_node(&bus, &addr, iommufd)
        })
        .await
        .map_err(|e| Error::Device(format!("vfio bind task: {e}")))??;
        info!(claim = %claim.key(), device = %p.alloc.device, pci = %gpu.pci_bus_id, "bound to vfio-pci");
        Ok(DeviceEdits {
            device_name: p.alloc.device.clone(),
            uuid: vfio_uuid(&gpu.pci_bus_id),
            device_nodes: vec![node],
            ..Default::default()
        })
    }

    /// Binds the GPU at `pci_bus_id` back to `nvidia`.
    pub(super) async fn unbind_vfio(&self, uid: &str, pci_bus_id: &str) -> Result<(), Error> {
        let bus = self.bus()?.clone();
        let addr = pci_bus_id.to_string();
        tokio::task::spawn_blocking(move || bus.unconfigure(&addr))
            .await
            .map_err(|e| Error::Device(format!("vfio unbind task: {e}")))??;
        info!(claimUID = uid, pci = pci_bus_id, "bound back to nvidia");
        Ok(())
    }

    /// Turns the claim's passthrough devices in `spec` into what NVIDIA's spec has.
    pub(super) fn vfio_spec(
        &self,
        spec: &mut Spec,
        claim: &ClaimRef,
        planned: &[Planned],
        edits: &[DeviceEdits],
    ) {
        let vfio: Vec<&Planned> = planned
            .iter()
            .filter(|p| matches!(p.target, Target::Vfio(_)))
            .collect();
        let (Some(first), Some(bus)) = (vfio.first(), self.pci_bus.as_ref()) else {
            return;
        };
        let config = vfio_config(&first.config).cloned().unwrap_or_default();
        let prepared: Vec<VfioPrepared> = edits
            .iter()
            .filter(|e| vfio.iter().any(|p| p.alloc.device == e.device_name))
            .map(|e| VfioPrepared {
                device_name: e.device_name.clone(),
                device_node: e.device_nodes.first().cloned().unwrap_or_default(),
            })
            .collect();
        apply_to_spec(
            spec,
            &claim.uid,
            &prepared,
            &config,
            use_iommufd(&config, bus),
        );
    }

    fn bus(&self) -> Result<&PciBus, Error> {
        self.pci_bus.as_ref().ok_or_else(|| {
            Error::Unsupported("passthrough needs the PassthroughSupport feature gate".into())
        })
    }
}

fn vfio_config(c: &DeviceConfig) -> Option<&VfioDeviceConfig> {
    match c {
        DeviceConfig::Vfio(v) => Some(v),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
