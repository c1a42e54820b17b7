//! The simulated backend: GPUs from hardware profiles, MIG devices kept in memory.
use std::sync::Mutex;

use gpu_dra_api::inventory::{Inventory, MigDevice};
use gpu_dra_api::simulated::{GpuGroup, sim_mig_uuid, simulate_node};

use super::DeviceBackend;
use crate::Error;

pub struct SimulatedBackend {
    inventory: Mutex<Inventory>,
}

impl SimulatedBackend {
    pub fn new(node: &str, groups: &[GpuGroup], mig_layout: Option<&str>) -> Result<Self, Error> {
        let inventory = simulate_node(node, groups, mig_layout)?;
        Ok(SimulatedBackend {
            inventory: Mutex::new(inventory),
        })
    }

    pub fn from_inventory(inventory: Inventory) -> Self {
        SimulatedBackend {
            inventory: Mutex::new(inventory),
        }
    }
}

impl DeviceBackend for SimulatedBackend {
    fn kind(&self) -> &'static str {
        "simulated"
    }

    fn discover(&self) -> Result<Inventory, Error> {
        Ok(self.inventory.lock().expect("inventory lock").clone())
    }

    fn create_mig(
        &self,
        parent_minor: u32,
        gi_profile_id: u32,
        placement_start: u32,
    ) -> Result<MigDevice, Error> {
        let mut inv = self.inventory.lock().expect("inventory lock");
        let gpu = inv
            .gpus
            .iter_mut()
            .find(|g| g.minor == parent_minor)
            .ok_or_else(|| Error::Device(format!("no GPU with minor {parent_minor}")))?;
        let parent_uuid = gpu.uuid.clone();
        let mig = gpu
            .mig
            .as_mut()
            .ok_or_else(|| Error::Device(format!("gpu-{parent_minor} cannot do MIG")))?;
        let profile = mig
            .profiles
            .iter()
            .find(|p| p.gi_profile_id == gi_profile_id)
            .ok_or_else(|| {
                Error::Device(format!(
                    "gpu-{parent_minor} has no GI profile {gi_profile_id}"
                ))
            })?;
        if !profile
            .placements
            .iter()
            .any(|[s, _]| *s == placement_start)
        {
            return Err(Error::Device(format!(
                "{} cannot start at memory slice {placement_start}",
                profile.name
            )));
        }
        let size = profile.memory_slices;
        let wanted = placement_start..placement_start + size;
        if let Some(existing) = mig
            .devices
            .iter()
            .find(|d| d.placement_start == placement_start && d.gi_profile_id == gi_profile_id)
        {
            return Ok(existing.clone());
        }
        if let Some(clash) = mig.devices.iter().find(|d| {
            let other = d.placement_start..d.placement_start + d.placement_size;
            wanted.start < other.end && other.start < wanted.end
        }) {
            return Err(Error::Device(format!(
                "insufficient resources: placement {placement_start}+{size} overlaps {} at {}",
                clash.profile, clash.placement_start
            )));
        }
        let same = mig
            .devices
            .iter()
            .filter(|d| d.gi_profile_id == gi_profile_id)
            .count() as u32;
        if same >= profile.max_instances {
            return Err(Error::Device(format!(
                "insufficient resources: {} allows {} instances per GPU",
                profile.name, profile.max_instances
            )));
        }
        let used_compute: u32 = mig
            .devices
            .iter()
            .filter_map(|d| {
                mig.profiles
                    .iter()
                    .find(|p| p.gi_profile_id == d.gi_profile_id)
            })
            .map(|p| p.compute_slices)
            .sum();
        if used_compute + profile.compute_slices > mig.compute_slices {
            return Err(Error::Device(format!(
                "insufficient resources: {} needs {} compute slices, {} of {} are free",
                profile.name,
                profile.compute_slices,
                mig.compute_slices - used_compute,
                mig.compute_slices
            )));
        }
        let gi_id = (1..)
            .find(|id| !mig.devices.iter().any(|d| d.gi_id == *id))
            .expect("a free id");
        let device = MigDevice {
            profile: profile.name.clone(),
            gi_profile_id,
            placement_start,
            placement_size: size,
            uuid: sim_mig_uuid(&parent_uuid, gi_profile_id, placement_start),
            gi_id,
            ci_id: 0,
        };
        mig.enabled = true;
        mig.devices.push(device.clone());
        Ok(device)
    }

    fn destroy_mig(
        &self,
        parent_minor: u32,
        gi_profile_id: u32,
        placement_start: u32,
    ) -> Result<(), Error> {
        let mut inv = self.inventory.lock().expect("inventory lock");
        if let Some(mig) = inv
            .gpus
            .iter_mut()
            .find(|g| g.minor == parent_minor)
            .and_then(|g| g.mig.as_mut())
        {
            mig.devices.retain(|d| {
                !(d.placement_start == placement_start && d.gi_profile_id == gi_profile_id)
            });
            // Like Hopper+ under dynamic MIG: MIG mode goes off again with the last instance.
            if mig.devices.is_empty() {
                mig.enabled = false;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_create_is_idempotent_refuses_overlaps_and_destroy_frees() {
        let b =
            SimulatedBackend::new("n", &[GpuGroup::parse("h100-80gb:1").unwrap()], None).unwrap();
        let a = b.create_mig(0, 9, 4).unwrap();
        assert_eq!(b.create_mig(0, 9, 4).unwrap(), a);
        let e = b.create_mig(0, 19, 5).unwrap_err().to_string();
        assert!(e.contains("overlaps"), "{e}");
        assert!(b.create_mig(0, 9, 3).is_err(), "not a valid placement");
        assert!(b.create_mig(3, 9, 0).is_err());
        b.destroy_mig(0, 19, 4).unwrap();
        assert_eq!(
            b.discover().unwrap().gpus[0]
                .mig
                .as_ref()
                .unwrap()
                .devices
                .len(),
            1,
            "another profile at that start stays"
        );
        b.destroy_mig(0, 9, 4).unwrap();
        b.destroy_mig(0, 9, 4).unwrap();
        b.create_mig(0, 19, 5).unwrap();
        assert_eq!(
            b.discover().unwrap().gpus[0]
                .mig
                .as_ref()
                .unwrap()
                .devices
                .len(),
            1
        );
    }

    #[test]
    fn mig_create_enforces_instance_and_compute_limits_like_the_hardware() {
        let b =
            SimulatedBackend::new("n", &[GpuGroup::parse("h100-80gb:1").unwrap()], None).unwrap();
        // 1g.10gb+me (GI profile 20) allows one instance per GPU.
        b.create_mig(0, 20, 0).unwrap();
        let e = b.create_mig(0, 20, 1).unwrap_err().to_string();
        assert!(e.contains("allows 1 instances"), "{e}");
        b.create_mig(0, 14, 2).unwrap(); // 2g.20gb: 3 of 7 compute slices used
        b.create_mig(0, 9, 4).unwrap(); // 3g.40gb: 6 of 7
        // 1g.10gb at 1 fits the memory slices but needs a 7th compute slice: fine; a second does not.
        b.create_mig(0, 19, 1).unwrap();
        b.destroy_mig(0, 19, 1).unwrap();
        let inv = b.discover().unwrap();
        assert!(inv.gpus[0].mig_enabled());
        for d in inv.gpus[0].mig.as_ref().unwrap().devices.clone() {
            b.destroy_mig(0, d.gi_profile_id, d.placement_start)
                .unwrap();
        }
        assert!(
            !b.discover().unwrap().gpus[0].mig_enabled(),
            "MIG mode goes off with the last instance"
        );
    }
}
