//! Prepare and unprepare: the two-phase, idempotent, crash-safe heart of the plugin.
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock, Weak};

use gpu_dra_api::config::DeviceKind;
use gpu_dra_api::gates::FeatureGates;
use gpu_dra_api::inventory::{DeviceRef, Gpu, Inventory, MigDevice, parse_device_name};
use gpu_dra_api::profiles::MigProfile;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::cdi::{CdiStore, DeviceEdits, cdi_device_id, mig_cap_nodes};
use super::checkpoint::{Checkpoint, ClaimRecord, ClaimState};
use super::configs;
use super::types::{AllocatedDevice, ClaimAllocation, ClaimRef, PreparedDevice};
use crate::Error;
use crate::backend::DeviceBackend;

/// Hardware changes a claim made, recorded before they are made so a crash can undo them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum HardwareChange {
    #[serde(rename_all = "camelCase")]
    DynamicMig {
        parent_minor: u32,
        gi_profile_id: u32,
        placement_start: u32,
    },
}

enum Target {
    Gpu(Gpu),
    StaticMig(Gpu, MigDevice),
    DynamicMig(Gpu, MigProfile, u32),
}

struct Planned {
    alloc: AllocatedDevice,
    target: Target,
}

pub struct DeviceState {
    pool: String,
    backend: Arc<dyn DeviceBackend>,
    inventory: RwLock<Inventory>,
    checkpoint: Checkpoint,
    cdi: CdiStore,
    gates: FeatureGates,
    claim_locks: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl DeviceState {
    pub fn new(
        pool: &str,
        backend: Arc<dyn DeviceBackend>,
        inventory: Inventory,
        checkpoint: Checkpoint,
        cdi: CdiStore,
        gates: FeatureGates,
    ) -> Self {
        DeviceState {
            pool: pool.to_string(),
            backend,
            inventory: RwLock::new(inventory),
            checkpoint,
            cdi,
            gates,
            claim_locks: Mutex::new(HashMap::new()),
        }
    }

    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    pub fn cdi(&self) -> &CdiStore {
        &self.cdi
    }

    pub fn inventory(&self) -> Inventory {
        self.inventory.read().expect("inventory lock").clone()
    }

    /// Devices of completed claims, for the `prepared devices` gauge.
    pub fn prepared_device_count(&self) -> usize {
        self.checkpoint
            .claims()
            .values()
            .filter(|r| r.state == ClaimState::PrepareCompleted)
            .map(|r| r.devices.len())
            .sum()
    }

    /// Serializes work on one claim; different claims proceed in parallel.
    async fn lock_claim(&self, uid: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.claim_locks.lock().expect("claim locks");
            locks.retain(|_, w| w.strong_count() > 0);
            match locks.get(uid).and_then(Weak::upgrade) {
                Some(l) => l,
                None => {
                    let l = Arc::new(tokio::sync::Mutex::new(()));
                    locks.insert(uid.to_string(), Arc::downgrade(&l));
                    l
                }
            }
        };
        lock.lock_owned().await
    }

    /// Prepares one claim. Preparing a prepared claim returns the same devices.
    pub async fn prepare(&self, alloc: &ClaimAllocation) -> Result<Vec<PreparedDevice>, Error> {
        let claim = &alloc.claim;
        let _guard = self.lock_claim(&claim.uid).await;
        match self.checkpoint.get(&claim.uid) {
            Some(r) if r.state == ClaimState::PrepareCompleted => return Ok(r.devices),
            Some(r) => {
                info!(claim = %claim.key(), "rolling back an earlier, unfinished prepare");
                self.rollback(&claim.uid, &r).await?;
            }
            None => {}
        }
        let planned = self.plan(alloc)?;
        self.check_not_in_use(claim, &planned)?;
        let prepared: Vec<PreparedDevice> = planned
            .iter()
            .map(|p| PreparedDevice {
                request_names: vec![p.alloc.base_request().to_string()],
                pool_name: p.alloc.pool.clone(),
                device_name: p.alloc.device.clone(),
                cdi_device_ids: vec![cdi_device_id(&claim.uid, &p.alloc.device)],
                share_id: p.alloc.share_id.clone(),
            })
            .collect();
        let hardware: Vec<HardwareChange> = planned
            .iter()
            .filter_map(|p| match &p.target {
                Target::DynamicMig(gpu, profile, start) => Some(HardwareChange::DynamicMig {
                    parent_minor: gpu.minor,
                    gi_profile_id: profile.gi_profile_id,
                    placement_start: *start,
                }),
                _ => None,
            })
            .collect();
        let mut record = ClaimRecord {
            state: ClaimState::PrepareStarted,
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            devices: prepared.clone(),
            hardware: hardware
                .iter()
                .map(|h| serde_json::to_value(h).expect("serializes"))
                .collect(),
            unknown: Default::default(),
        };
        // Only claims that change hardware need the first phase: anything else leaves at most a
        // CDI spec behind, which startup sweeps away.
        if !record.hardware.is_empty() {
            let started = record.clone();
            self.checkpoint
                .update(|c| c.insert(claim.uid.clone(), started))
                .await?;
        }
        let mut created = Vec::new();
        let result = async {
            let edits = self.create(claim, &planned, &mut created).await?;
            let spec = CdiStore::build_spec(&claim.uid, &claim.key(), &edits, &prepared);
            record.state = ClaimState::PrepareCompleted;
            let cdi = self.cdi.clone();
            let uid = claim.uid.clone();
            // The spec and the completed record go to disk together; a crash between the two
            // is repaired at startup (`repair_cdi`).
            let (written, recorded) = tokio::join!(
                tokio::task::spawn_blocking(move || cdi.write(&uid, &spec)),
                self.checkpoint
                    .update(|c| c.insert(claim.uid.clone(), record)),
            );
            written.map_err(|e| Error::Device(format!("CDI write task: {e}")))??;
            recorded
        }
        .await;
        match result {
            Ok(_) => Ok(prepared),
            Err(e) => {
                warn!(claim = %claim.key(), error = %e, "prepare failed; rolling back");
                // Only what this attempt created: a placement that failed may belong to someone else.
                let undone = async {
                    self.undo(&created).await?;
                    self.cdi.remove(&claim.uid)?;
                    self.checkpoint.update(|c| c.remove(&claim.uid)).await
                };
                if let Err(rb) = undone.await {
                    warn!(claim = %claim.key(), error = %rb, "rollback failed; the next prepare or cleanup retries it");
                }
                Err(e)
            }
        }
    }

    /// Unprepares one claim; an unknown claim is already unprepared.
    pub async fn unprepare(&self, claim_uid: &str) -> Result<(), Error> {
        let _guard = self.lock_claim(claim_uid).await;
        match self.checkpoint.get(claim_uid) {
            None => self.cdi.remove(claim_uid),
            Some(record) => self.rollback(claim_uid, &record).await,
        }
    }

    /// Undoes whatever a recorded claim may have done, then forgets it. Instances another claim
    /// records as its own are left alone.
    async fn rollback(&self, uid: &str, record: &ClaimRecord) -> Result<(), Error> {
        let owned_elsewhere: Vec<HardwareChange> = self
            .checkpoint
            .claims()
            .iter()
            .filter(|(other, _)| other.as_str() != uid)
            .flat_map(|(_, r)| {
                r.hardware
                    .iter()
                    .filter_map(|h| serde_json::from_value(h.clone()).ok())
            })
            .collect();
        let mut changes = Vec::new();
        for change in &record.hardware {
            match serde_json::from_value::<HardwareChange>(change.clone()) {
                Ok(c) if !owned_elsewhere.contains(&c) => changes.push(c),
                Ok(_) => {}
                Err(_) => {
                    warn!(claim_uid = uid, change = %change, "ignoring a hardware change this version does not know")
                }
            }
        }
        self.undo(&changes).await?;
        self.cdi.remove(uid)?;
        self.checkpoint
            .update(|c| {
                c.remove(uid);
            })
            .await
    }

    async fn undo(&self, changes: &[HardwareChange]) -> Result<(), Error> {
        for change in changes {
            let HardwareChange::DynamicMig {
                parent_minor,
                gi_profile_id,
                placement_start,
            } = *change;
            let backend = self.backend.clone();
            tokio::task::spawn_blocking(move || {
                backend.destroy_mig(parent_minor, gi_profile_id, placement_start)
            })
            .await
            .map_err(|e| Error::Device(format!("MIG destroy task: {e}")))??;
        }
        Ok(())
    }

    fn plan(&self, alloc: &ClaimAllocation) -> Result<Vec<Planned>, Error> {
        if alloc.devices.is_empty() {
            return Err(Error::InvalidAllocation(format!(
                "ResourceClaim {} has no devices of this driver in pool {}",
                alloc.claim.key(),
                self.pool
            )));
        }
        let inv = self.inventory.read().expect("inventory lock");
        alloc
            .devices
            .iter()
            .map(|d| {
                let target = self.target(&inv, d)?;
                let kind = match target {
                    Target::Gpu(_) => DeviceKind::Gpu,
                    _ => DeviceKind::Mig,
                };
                let config = configs::resolve(d, kind, &alloc.configs, &self.gates)?;
                if let Some(s) = config.sharing() {
                    return Err(Error::Unsupported(format!(
                        "{}: sharing strategy {:?} is not supported by this plugin version yet",
                        d.device, s.strategy
                    )));
                }
                Ok(Planned {
                    alloc: d.clone(),
                    target,
                })
            })
            .collect()
    }

    fn target(&self, inv: &Inventory, d: &AllocatedDevice) -> Result<Target, Error> {
        let invalid = |why: String| {
            Error::InvalidAllocation(format!("device {}/{}: {why}", d.pool, d.device))
        };
        if d.pool != self.pool {
            return Err(invalid(format!("this node serves pool {}", self.pool)));
        }
        let gpu_of = |minor: u32| {
            inv.gpu_by_minor(minor)
                .cloned()
                .ok_or_else(|| invalid("no such GPU on this node".into()))
        };
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
                    let profile = gpu
                        .mig_profile(gi_profile_id)
                        .filter(|p| p.placements.iter().any(|[s, _]| *s == start))
                        .cloned()
                        .ok_or_else(|| invalid("no such MIG placement on this GPU".into()))?;
                    return Ok(Target::DynamicMig(gpu, profile, start));
                }
                let mig = gpu
                    .mig
                    .as_ref()
                    .and_then(|m| {
                        m.devices.iter().find(|m| {
                            m.gi_profile_id == gi_profile_id && m.placement_start == start
                        })
                    })
                    .cloned()
                    .ok_or_else(|| invalid("no such MIG device exists on this GPU".into()))?;
                Ok(Target::StaticMig(gpu, mig))
            }
        }
    }

    /// A device belongs to one claim at a time, except for admin access and consumable shares.
    fn check_not_in_use(&self, claim: &ClaimRef, planned: &[Planned]) -> Result<(), Error> {
        let others = self.checkpoint.claims();
        for p in planned
            .iter()
            .filter(|p| !p.alloc.admin_access && p.alloc.share_id.is_none())
        {
            for (uid, r) in others.iter().filter(|(uid, _)| **uid != claim.uid) {
                if r.devices
                    .iter()
                    .any(|d| d.device_name == p.alloc.device && d.share_id.is_none())
                {
                    return Err(Error::Busy(format!(
                        "device {} is already prepared for ResourceClaim {}/{} ({uid})",
                        p.alloc.device, r.namespace, r.name
                    )));
                }
            }
        }
        Ok(())
    }

    /// Creates dynamic MIG devices; returns what each device's container needs.
    async fn create(
        &self,
        claim: &ClaimRef,
        planned: &[Planned],
        created: &mut Vec<HardwareChange>,
    ) -> Result<Vec<DeviceEdits>, Error> {
        let mut edits = Vec::with_capacity(planned.len());
        for p in planned {
            let e = match &p.target {
                Target::Gpu(gpu) => gpu_edits(&p.alloc.device, gpu),
                Target::StaticMig(gpu, mig) => mig_edits(&p.alloc.device, gpu, mig),
                Target::DynamicMig(gpu, profile, start) => {
                    let backend = self.backend.clone();
                    let (minor, gi, start) = (gpu.minor, profile.gi_profile_id, *start);
                    let mig =
                        tokio::task::spawn_blocking(move || backend.create_mig(minor, gi, start))
                            .await
                            .map_err(|e| Error::Device(format!("MIG create task: {e}")))??;
                    created.push(HardwareChange::DynamicMig {
                        parent_minor: minor,
                        gi_profile_id: gi,
                        placement_start: start,
                    });
                    info!(claim = %claim.key(), device = %p.alloc.device, mig_uuid = %mig.uuid, "created MIG device");
                    mig_edits(&p.alloc.device, gpu, &mig)
                }
            };
            edits.push(e);
        }
        Ok(edits)
    }

    /// Startup under dynamic MIG: destroys MIG instances that no completed claim owns (leftovers
    /// of a crash, or made out of band, which dynamic MIG does not allow). Returns how many.
    pub async fn destroy_unowned_mig(&self) -> Result<usize, Error> {
        if !self.gates.dynamic_mig() {
            return Ok(0);
        }
        let owned: Vec<HardwareChange> = self
            .checkpoint
            .claims()
            .values()
            .filter(|r| r.state == ClaimState::PrepareCompleted)
            .flat_map(|r| {
                r.hardware
                    .iter()
                    .filter_map(|h| serde_json::from_value(h.clone()).ok())
            })
            .collect();
        let backend = self.backend.clone();
        let live = tokio::task::spawn_blocking(move || backend.discover())
            .await
            .map_err(|e| Error::Device(format!("discovery task: {e}")))??;
        let stray: Vec<HardwareChange> = live
            .gpus
            .iter()
            .flat_map(|g| {
                g.mig
                    .iter()
                    .flat_map(move |m| m.devices.iter().map(move |d| (g.minor, d)))
            })
            .map(|(minor, d)| HardwareChange::DynamicMig {
                parent_minor: minor,
                gi_profile_id: d.gi_profile_id,
                placement_start: d.placement_start,
            })
            .filter(|c| !owned.contains(c))
            .collect();
        for c in &stray {
            warn!(change = ?c, "destroying a MIG device no prepared claim owns");
        }
        self.undo(&stray).await?;
        Ok(stray.len())
    }

    /// Startup consistency between checkpoint and CDI specs: completed claims get their spec back
    /// if a crash came between the two writes; specs no record owns are removed. Returns the
    /// number of specs rewritten and removed.
    pub async fn repair_cdi(&self) -> Result<(usize, usize), Error> {
        let claims = self.checkpoint.claims();
        let backend = self.backend.clone();
        let live = tokio::task::spawn_blocking(move || backend.discover())
            .await
            .map_err(|e| Error::Device(format!("discovery task: {e}")))??;
        let mut rewritten = 0;
        for (uid, r) in claims
            .iter()
            .filter(|(_, r)| r.state == ClaimState::PrepareCompleted)
        {
            if self.cdi.read(uid)?.is_some() {
                continue;
            }
            let edits: Option<Vec<DeviceEdits>> = r
                .devices
                .iter()
                .map(|d| existing_edits(&live, &d.device_name))
                .collect();
            let key = format!("{}/{}", r.namespace, r.name);
            match edits {
                Some(edits) => {
                    self.cdi
                        .write(uid, &CdiStore::build_spec(uid, &key, &edits, &r.devices))?;
                    rewritten += 1;
                }
                None => {
                    warn!(claim = %key, "a prepared claim's devices are gone; its CDI spec cannot be rebuilt")
                }
            }
        }
        let mut removed = 0;
        for uid in self.cdi.claim_uids() {
            if !claims.contains_key(&uid) {
                self.cdi.remove(&uid)?;
                removed += 1;
            }
        }
        Ok((rewritten, removed))
    }

    /// After the checkpoint was lost: adopt claims whose CDI spec survived, so they stay prepared.
    pub async fn adopt_from_cdi(&self) -> Result<Vec<ClaimRef>, Error> {
        let mut adopted = Vec::new();
        for uid in self.cdi.claim_uids() {
            let Some(spec) = self.cdi.read(&uid).ok().flatten() else {
                warn!(claim_uid = %uid, "unreadable CDI spec; removing it");
                self.cdi.remove(&uid)?;
                continue;
            };
            let key = spec
                .annotations
                .get(super::cdi::ANNOTATION_CLAIM)
                .cloned()
                .unwrap_or_default();
            let devices: Option<Vec<PreparedDevice>> = spec
                .annotations
                .get(super::cdi::ANNOTATION_DEVICES)
                .and_then(|d| serde_json::from_str(d).ok());
            let (Some((namespace, name)), Some(devices)) = (key.split_once('/'), devices) else {
                warn!(claim_uid = %uid, "CDI spec lacks claim annotations; removing it");
                self.cdi.remove(&uid)?;
                continue;
            };
            let claim = ClaimRef {
                uid: uid.clone(),
                namespace: namespace.into(),
                name: name.into(),
            };
            let record = ClaimRecord {
                state: ClaimState::PrepareCompleted,
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                devices,
                hardware: Vec::new(),
                unknown: Default::default(),
            };
            self.checkpoint.update(|c| c.insert(uid, record)).await?;
            adopted.push(claim);
        }
        Ok(adopted)
    }
}

fn gpu_edits(device: &str, gpu: &Gpu) -> DeviceEdits {
    DeviceEdits {
        device_name: device.to_string(),
        uuid: gpu.uuid.clone(),
        device_nodes: vec![format!("/dev/nvidia{}", gpu.minor)],
    }
}

/// Edits for a device that exists right now (a whole GPU or a live MIG device).
fn existing_edits(inv: &Inventory, device: &str) -> Option<DeviceEdits> {
    match parse_device_name(device)? {
        DeviceRef::Gpu { minor } => Some(gpu_edits(device, inv.gpu_by_minor(minor)?)),
        DeviceRef::Mig {
            parent_minor,
            gi_profile_id,
            start,
        } => {
            let gpu = inv.gpu_by_minor(parent_minor)?;
            let mig = gpu
                .mig
                .as_ref()?
                .devices
                .iter()
                .find(|m| m.gi_profile_id == gi_profile_id && m.placement_start == start)?;
            Some(mig_edits(device, gpu, mig))
        }
    }
}

fn mig_edits(device: &str, gpu: &Gpu, mig: &MigDevice) -> DeviceEdits {
    let mut nodes = vec![format!("/dev/nvidia{}", gpu.minor)];
    nodes.extend(mig_cap_nodes(gpu.minor, mig.gi_id, mig.ci_id));
    DeviceEdits {
        device_name: device.to_string(),
        uuid: mig.uuid.clone(),
        device_nodes: nodes,
    }
}

#[cfg(test)]
mod tests;
