//! Prepare and unprepare: the two-phase, idempotent, crash-safe heart of the plugin.
//!
//! This file is the prepared-claim state machine (record, create, complete; roll back, undo);
//! `plan` resolves what an allocation means on this node, `sharing` applies time slices and
//! MPS daemons, `recovery` repairs state at startup.
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock, Weak};

use gpu_dra_api::config::TimeSliceInterval;
use gpu_dra_api::gates::FeatureGates;
use gpu_dra_api::inventory::{Gpu, Inventory};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::Error;
use crate::backend::DeviceBackend;
use crate::cdi::{CdiStore, DeviceEdits, cdi_device_id, gpu_edits, mig_edits};
use crate::checkpoint::{Checkpoint, ClaimRecord, ClaimState};
use crate::sharing::mps::MpsDaemon;
use crate::sharing::runner::{DaemonHandle, MpsControlRunner, ProcessRunner, StandInRunner};
use crate::types::{ClaimAllocation, ClaimRef, PreparedDevice};

mod plan;
mod recovery;
mod sharing;
mod vfio;

use plan::{Planned, Target, static_mig};
use sharing::time_slices;

/// MIG creates and destroys on the blocking pool at once: enough to keep the (serialized) hardware
/// busy, few enough that a burst of claims does not grow a thread each.
const MIG_OPS_IN_FLIGHT: usize = 2;

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
    /// The time slice of a whole GPU, set for this claim; reset to `Default` when no claim
    /// records one for the GPU any more.
    #[serde(rename_all = "camelCase")]
    TimeSlice {
        gpu_minor: u32,
        interval: TimeSliceInterval,
    },
    /// This claim's MPS control daemon, its directories and the compute mode of its whole GPUs.
    /// `handle` is unset in a record written before the daemon started.
    #[serde(rename_all = "camelCase")]
    Mps {
        daemon: MpsDaemon,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        handle: Option<DaemonHandle>,
    },
    /// A device this claim holds as one of several (consumable shares), with its normalized
    /// config, which every other claim of the device must equal. Nothing to undo.
    #[serde(rename_all = "camelCase")]
    SharedDevice {
        device: String,
        config: serde_json::Value,
    },
    /// A GPU bound to vfio-pci for passthrough device `device`; undone by binding it to nvidia.
    #[serde(rename_all = "camelCase")]
    Vfio { device: String, pci_bus_id: String },
}

impl HardwareChange {
    fn is_sharing(&self) -> bool {
        !matches!(
            self,
            HardwareChange::DynamicMig { .. } | HardwareChange::Vfio { .. }
        )
    }
}

/// The recorded changes of a record this version understands (unknown ones are skipped).
fn known_changes(record: &ClaimRecord) -> impl Iterator<Item = HardwareChange> + '_ {
    record
        .hardware
        .iter()
        .filter_map(|h| serde_json::from_value(h.clone()).ok())
}

pub struct DeviceState {
    pool: String,
    backend: Arc<dyn DeviceBackend>,
    /// The node's GPUs as last discovered; shared with each prepare's plan rather than copied.
    /// On-demand MIG replaces them after changing the MIG devices ([`Self::refresh_mig`]).
    gpus: RwLock<Arc<Vec<Arc<Gpu>>>>,
    checkpoint: Checkpoint,
    cdi: CdiStore,
    gates: FeatureGates,
    claim_locks: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
    /// Serializes claims that share GPUs (time slices, MPS, consumable shares) from their checks
    /// to their records, so two claims cannot both pass a check the other would fail.
    sharing_lock: tokio::sync::Mutex<()>,
    /// Bounds the MIG creates and destroys in flight on the blocking pool: the hardware does them
    /// one at a time anyway, and a burst would otherwise park a thread per claim (memory).
    mig_ops: tokio::sync::Semaphore,
    runner: Arc<dyn ProcessRunner>,
    /// `<plugin dir>/mps`: per-claim MPS directories.
    mps_root: PathBuf,
    /// Claims with a record but no MPS change, whose MPS directory the startup sweep found (one
    /// adopted from its CDI spec). `None` until the sweep has run: then every unprepare without
    /// an MPS record looks for one, a file lookup per call the sweep saves a busy node.
    unrecorded_mps: Mutex<Option<HashSet<String>>>,
    /// The plugin directory, where `sharing.json` goes.
    plugin_dir: PathBuf,
    /// The PCI bus passthrough devices are bound on; `None` without `PassthroughSupport`.
    pci_bus: Option<crate::vfio::PciBus>,
    held_changed: tokio::sync::watch::Sender<u64>,
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
        let plugin_dir = checkpoint
            .path()
            .parent()
            .map(|p| p.to_path_buf())
            .unwrap_or_else(|| PathBuf::from("."));
        // Real GPUs get the real daemon from the backend's driver root; simulated ones a
        // stand-in process. `with_mps_runner` overrides.
        let runner: Arc<dyn ProcessRunner> = match backend.driver_root() {
            Some(root) => Arc::new(MpsControlRunner::new(root)),
            None => Arc::new(StandInRunner),
        };
        DeviceState {
            pool: pool.to_string(),
            backend,
            gpus: RwLock::new(Arc::new(inventory.gpus.into_iter().map(Arc::new).collect())),
            checkpoint,
            cdi,
            gates,
            claim_locks: Mutex::new(HashMap::new()),
            sharing_lock: tokio::sync::Mutex::new(()),
            mig_ops: tokio::sync::Semaphore::new(MIG_OPS_IN_FLIGHT),
            runner,
            mps_root: plugin_dir.join("mps"),
            unrecorded_mps: Mutex::new(None),
            plugin_dir,
            pci_bus: None,
            held_changed: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Uses `runner` for MPS control daemons (tests use a fake; `run` may pick by backend).
    pub fn with_mps_runner(mut self, runner: Arc<dyn ProcessRunner>) -> Self {
        self.runner = runner;
        self
    }

    /// Where per-claim MPS directories live (`<plugin dir>/mps`).
    pub fn mps_root(&self) -> &std::path::Path {
        &self.mps_root
    }

    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    pub fn cdi(&self) -> &CdiStore {
        &self.cdi
    }

    pub fn inventory(&self) -> Inventory {
        Inventory {
            gpus: self.gpus().iter().map(|g| Gpu::clone(g)).collect(),
        }
    }

    /// The GPUs as last discovered (a snapshot: a refresh does not change it).
    pub(crate) fn gpus(&self) -> Arc<Vec<Arc<Gpu>>> {
        self.gpus.read().expect("gpus lock").clone()
    }

    /// Takes the MIG devices of each GPU from `live` (a fresh discovery), keeping everything else
    /// found at start (PCI facts): what on-demand MIG does after changing the hardware. Returns
    /// whether any GPU's MIG state differed.
    pub fn refresh_mig(&self, live: &Inventory) -> bool {
        let mut gpus = self.gpus.write().expect("gpus lock");
        let mut changed = false;
        let refreshed: Vec<Arc<Gpu>> = gpus
            .iter()
            .map(|g| match live.gpus.iter().find(|l| l.uuid == g.uuid) {
                Some(l) if l.mig != g.mig => {
                    changed = true;
                    Arc::new(Gpu {
                        mig: l.mig.clone(),
                        ..Gpu::clone(g)
                    })
                }
                _ => g.clone(),
            })
            .collect();
        *gpus = Arc::new(refreshed);
        changed
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
        // Shared with a second plugin process (rolling upgrade): its records first.
        let _lease = self.checkpoint.lease().await?;
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
        let sharing = planned.iter().any(Planned::involves_sharing);
        let _sharing_guard = match sharing {
            true => Some(self.sharing_lock.lock().await),
            false => None,
        };
        self.check_time_slices(claim, &planned)?;
        self.check_not_in_use(claim, &planned)?;
        self.check_vfio(claim, &planned)?;
        let mut prepared: Vec<PreparedDevice> = planned
            .iter()
            .map(|p| PreparedDevice {
                request_names: vec![p.alloc.base_request().to_string()],
                pool_name: p.alloc.pool.clone(),
                device_name: p.alloc.device.clone(),
                cdi_device_ids: vec![cdi_device_id(&claim.uid, &p.alloc.device)],
                share_id: p.alloc.share_id.clone(),
                uuid: None,
            })
            .collect();
        let mut hardware: Vec<HardwareChange> = planned
            .iter()
            .filter_map(|p| match &p.target {
                Target::DynamicMig(gpu, gi_profile_id, start) => Some(HardwareChange::DynamicMig {
                    parent_minor: gpu.minor,
                    gi_profile_id: *gi_profile_id,
                    placement_start: *start,
                }),
                _ => None,
            })
            .collect();
        hardware.extend(Self::vfio_changes(&planned));
        for (minor, interval) in time_slices(&planned) {
            hardware.push(HardwareChange::TimeSlice {
                gpu_minor: minor,
                interval,
            });
        }
        if let Some(daemon) = self.mps_daemon(claim, &planned, &[])? {
            hardware.push(HardwareChange::Mps {
                daemon,
                handle: None,
            });
        }
        let shared: Vec<HardwareChange> = planned
            .iter()
            .filter(|p| p.alloc.share_id.is_some())
            .map(|p| HardwareChange::SharedDevice {
                device: p.alloc.device.clone(),
                config: serde_json::to_value(&p.config).expect("config serializes"),
            })
            .collect();
        let to_json = |changes: &[HardwareChange]| -> Vec<serde_json::Value> {
            changes
                .iter()
                .map(|h| serde_json::to_value(h).expect("serializes"))
                .collect()
        };
        let mut record = ClaimRecord {
            state: ClaimState::PrepareStarted,
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            devices: prepared.clone(),
            hardware: to_json(&hardware),
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
            let mut edits = self.create(claim, &planned, &mut created).await?;
            self.apply_sharing(claim, &planned, &mut edits, &mut created)
                .await?;
            // Dynamic MIG UUIDs exist only now; the record keeps them for the claim's status.
            for p in prepared.iter_mut() {
                p.uuid = edits
                    .iter()
                    .find(|e| e.device_name == p.device_name)
                    .map(|e| e.uuid.clone());
            }
            record.devices = prepared.clone();
            let mut spec = CdiStore::build_spec(&claim.uid, &claim.key(), &edits, &prepared);
            self.vfio_spec(&mut spec, claim, &planned, &edits);
            record.state = ClaimState::PrepareCompleted;
            // What was really done (daemon handles, MIG UUIDs), plus the shared devices' configs.
            record.hardware = to_json(&created);
            record.hardware.extend(to_json(&shared));
            // The spec and the completed record go to disk in one group commit, the spec
            // first; a crash between the two is repaired at startup (`repair_cdi`).
            self.checkpoint
                .update_with_file(
                    |c| c.insert(claim.uid.clone(), record),
                    "writing the CDI spec",
                    self.cdi.spec_path(&claim.uid),
                    CdiStore::encode(&spec),
                )
                .await
        }
        .await;
        match result {
            Ok(_) => {
                if created.iter().any(HardwareChange::is_sharing) {
                    self.write_sharing_state();
                }
                self.notify_held();
                Ok(prepared)
            }
            Err(e) => {
                warn!(claim = %claim.key(), error = %e, "prepare failed; rolling back");
                // Only what this attempt created: a placement that failed may belong to someone else.
                let undone = async {
                    self.undo(&claim.uid, &created).await?;
                    self.cdi.remove(&claim.uid)?;
                    self.checkpoint.update(|c| c.remove(&claim.uid)).await
                };
                if let Err(rb) = undone.await {
                    warn!(claim = %claim.key(), error = %rb, "rollback failed; the next prepare or cleanup retries it");
                }
                if created.iter().any(HardwareChange::is_sharing) {
                    self.write_sharing_state();
                }
                Err(e)
            }
        }
    }

    /// Unprepares one claim; an unknown claim is already unprepared.
    pub async fn unprepare(&self, claim_uid: &str) -> Result<(), Error> {
        let _lease = self.checkpoint.lease().await?;
        let _guard = self.lock_claim(claim_uid).await;
        match self.checkpoint.get(claim_uid) {
            None => self.cdi.remove(claim_uid),
            Some(record) => self.rollback(claim_uid, &record).await,
        }
    }

    /// Undoes whatever a recorded claim may have done, then forgets it. Instances another claim
    /// records as its own are left alone.
    async fn rollback(&self, uid: &str, record: &ClaimRecord) -> Result<(), Error> {
        let mut changes = Vec::new();
        for change in &record.hardware {
            match serde_json::from_value::<HardwareChange>(change.clone()) {
                Ok(c) => changes.push(c),
                Err(_) => {
                    warn!(claimUID = uid, change = %change, "ignoring a hardware change this version does not know")
                }
            }
        }
        let sharing = changes.iter().any(HardwareChange::is_sharing);
        let _sharing_guard = match sharing {
            true => Some(self.sharing_lock.lock().await),
            false => None,
        };
        if changes
            .iter()
            .any(|c| matches!(c, HardwareChange::DynamicMig { .. }))
        {
            let owned_elsewhere: Vec<HardwareChange> = self.checkpoint.with_claims(|claims| {
                claims
                    .iter()
                    .filter(|(other, _)| other.as_str() != uid)
                    .flat_map(|(_, r)| known_changes(r))
                    .filter(|c| matches!(c, HardwareChange::DynamicMig { .. }))
                    .collect()
            });
            changes.retain(|c| !owned_elsewhere.contains(c));
        }
        self.undo(uid, &changes).await?;
        // A claim adopted from its CDI spec after a lost checkpoint has no MPS record, but may
        // still have a daemon and directories.
        if !changes
            .iter()
            .any(|c| matches!(c, HardwareChange::Mps { .. }))
            && self.may_have_unrecorded_mps(uid)
        {
            self.remove_stray_mps(uid).await?;
            if let Some(set) = self.unrecorded_mps.lock().expect("mps sweep").as_mut() {
                set.remove(uid);
            }
        }
        // The spec goes in the same group commit, just before the record: a failed removal
        // still forgets the record, and the kubelet's retry, finding no record, removes the spec.
        self.checkpoint
            .update_removing_file(
                |c| {
                    c.remove(uid);
                },
                "removing the CDI spec",
                self.cdi.spec_path(uid),
            )
            .await?;
        if sharing {
            self.write_sharing_state();
        }
        self.notify_held();
        Ok(())
    }

    /// Undoes `changes` of claim `uid`, last first.
    async fn undo(&self, uid: &str, changes: &[HardwareChange]) -> Result<(), Error> {
        for change in changes.iter().rev() {
            match change {
                HardwareChange::DynamicMig {
                    parent_minor,
                    gi_profile_id,
                    placement_start,
                } => {
                    let (parent_minor, gi_profile_id, placement_start) =
                        (*parent_minor, *gi_profile_id, *placement_start);
                    let backend = self.backend.clone();
                    let _slot = self.mig_ops.acquire().await.expect("never closed");
                    tokio::task::spawn_blocking(move || {
                        backend.destroy_mig(parent_minor, gi_profile_id, placement_start)
                    })
                    .await
                    .map_err(|e| Error::Device(format!("MIG destroy task: {e}")))??;
                }
                HardwareChange::TimeSlice { gpu_minor, .. } => {
                    let minor = *gpu_minor;
                    let still_used = self.checkpoint.with_claims(|claims| {
                        claims
                            .iter()
                            .filter(|(other, _)| other.as_str() != uid)
                            .any(|(_, r)| {
                                known_changes(r).any(|c| {
                                    matches!(c, HardwareChange::TimeSlice { gpu_minor, .. } if gpu_minor == minor)
                                })
                            })
                    });
                    if still_used {
                        continue;
                    }
                    let backend = self.backend.clone();
                    tokio::task::spawn_blocking(move || {
                        backend.set_time_slice(minor, TimeSliceInterval::Default)
                    })
                    .await
                    .map_err(|e| Error::Device(format!("time slice task: {e}")))??;
                    info!(
                        claimUID = uid,
                        gpu_minor = minor,
                        "time slice reset to Default"
                    );
                }
                HardwareChange::Mps { daemon, handle } => {
                    self.stop_mps(daemon, *handle).await?;
                }
                HardwareChange::SharedDevice { .. } => {}
                HardwareChange::Vfio { pci_bus_id, .. } => {
                    self.unbind_vfio(uid, pci_bus_id).await?;
                }
            }
        }
        Ok(())
    }

    /// Creates dynamic MIG devices; returns what each device's container needs (one entry per
    /// device, even when a claim holds several shares of it).
    async fn create(
        &self,
        claim: &ClaimRef,
        planned: &[Planned],
        created: &mut Vec<HardwareChange>,
    ) -> Result<Vec<DeviceEdits>, Error> {
        let mut edits: Vec<DeviceEdits> = Vec::with_capacity(planned.len());
        for p in planned {
            if edits.iter().any(|e| e.device_name == p.alloc.device) {
                continue;
            }
            let e = match &p.target {
                Target::Gpu(gpu) => gpu_edits(&p.alloc.device, gpu),
                Target::StaticMig(gpu, i) => mig_edits(&p.alloc.device, gpu, static_mig(gpu, *i)),
                Target::DynamicMig(gpu, gi, start) => {
                    let backend = self.backend.clone();
                    let (minor, gi, start) = (gpu.minor, *gi, *start);
                    let mig = {
                        let _slot = self.mig_ops.acquire().await.expect("never closed");
                        tokio::task::spawn_blocking(move || backend.create_mig(minor, gi, start))
                            .await
                            .map_err(|e| Error::Device(format!("MIG create task: {e}")))??
                    };
                    created.push(HardwareChange::DynamicMig {
                        parent_minor: minor,
                        gi_profile_id: gi,
                        placement_start: start,
                    });
                    info!(claim = %claim.key(), device = %p.alloc.device, mig_uuid = %mig.uuid, "created MIG device");
                    mig_edits(&p.alloc.device, gpu, &mig)
                }
                Target::Vfio(gpu) => self.bind_vfio(claim, p, gpu, created).await?,
            };
            edits.push(e);
        }
        Ok(edits)
    }
}

#[cfg(test)]
mod tests;
