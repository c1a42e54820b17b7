//! Prepare and unprepare: the two-phase, idempotent, crash-safe heart of the plugin.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

use gpu_dra_api::config::{DeviceConfig, DeviceKind, SharingStrategy, TimeSliceInterval};
use gpu_dra_api::gates::FeatureGates;
use gpu_dra_api::inventory::{DeviceRef, Gpu, Inventory, MigDevice, parse_device_name};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::cdi::{CdiStore, DeviceEdits, cdi_device_id, mig_cap_nodes};
use super::checkpoint::{Checkpoint, ClaimRecord, ClaimState};
use super::configs;
use super::types::{AllocatedDevice, ClaimAllocation, ClaimRef, PreparedDevice};
use crate::Error;
use crate::backend::{ComputeMode, DeviceBackend};

use super::sharing;

use sharing::mps::{MpsDaemon, multi_user_capable, pinned_limits};
use sharing::runner::{DaemonHandle, MpsControlRunner, ProcessRunner, StandInRunner};
use sharing::{GpuSharingState, SharingStateFile, time_slice_conflict};

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
}

impl HardwareChange {
    fn is_sharing(&self) -> bool {
        !matches!(self, HardwareChange::DynamicMig { .. })
    }
}

/// The recorded changes of a record this version understands (unknown ones are skipped).
fn known_changes(record: &ClaimRecord) -> impl Iterator<Item = HardwareChange> + '_ {
    record
        .hardware
        .iter()
        .filter_map(|h| serde_json::from_value(h.clone()).ok())
}

/// What an allocated device is on this node. GPUs are shared with the inventory (a prepare
/// copies no hardware description).
enum Target {
    Gpu(Arc<Gpu>),
    /// an existing MIG device: its index in the GPU's MIG devices
    StaticMig(Arc<Gpu>, usize),
    /// a MIG device to create: GI profile ID and placement start
    DynamicMig(Arc<Gpu>, u32, u32),
}

fn static_mig(gpu: &Gpu, index: usize) -> &MigDevice {
    &gpu.mig
        .as_ref()
        .expect("a static MIG target's GPU has MIG state")
        .devices[index]
}

struct Planned {
    alloc: AllocatedDevice,
    target: Target,
    /// The resolved, normalized and validated config.
    config: DeviceConfig,
    /// Where it came from (for errors).
    config_at: String,
}

impl Planned {
    fn strategy(&self) -> Option<SharingStrategy> {
        self.config.sharing().map(|s| s.strategy)
    }

    /// The interval a TimeSlicing config sets on a whole GPU (MIG devices: none, a no-op).
    fn time_slice(&self) -> Option<(u32, TimeSliceInterval)> {
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

    fn involves_sharing(&self) -> bool {
        self.config.sharing().is_some() || self.alloc.share_id.is_some()
    }
}

pub struct DeviceState {
    pool: String,
    backend: Arc<dyn DeviceBackend>,
    /// The node's GPUs as discovered at start, fixed for the life of the state; shared with
    /// each prepare's plan rather than copied.
    gpus: Vec<Arc<Gpu>>,
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
        // Real GPUs get the real daemon from the driver root (the same env the CLI reads);
        // simulated ones a stand-in process. `with_mps_runner` overrides.
        let runner: Arc<dyn ProcessRunner> = if backend.kind() == "nvml" {
            Arc::new(MpsControlRunner::new(
                std::env::var_os("NVIDIA_DRIVER_ROOT")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from("/")),
            ))
        } else {
            Arc::new(StandInRunner)
        };
        DeviceState {
            pool: pool.to_string(),
            backend,
            gpus: inventory.gpus.into_iter().map(Arc::new).collect(),
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
            gpus: self.gpus.iter().map(|g| Gpu::clone(g)).collect(),
        }
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
        let sharing = planned.iter().any(Planned::involves_sharing);
        let _sharing_guard = match sharing {
            true => Some(self.sharing_lock.lock().await),
            false => None,
        };
        self.check_time_slices(claim, &planned)?;
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
            let spec = CdiStore::build_spec(&claim.uid, &claim.key(), &edits, &prepared);
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
            }
        }
        Ok(())
    }

    /// Stops a claim's MPS daemon, removes its directories and resets its GPUs' compute mode.
    async fn stop_mps(
        &self,
        daemon: &MpsDaemon,
        handle: Option<DaemonHandle>,
    ) -> Result<(), Error> {
        let runner = self.runner.clone();
        let d = daemon.clone();
        tokio::task::spawn_blocking(move || {
            runner.stop(&d, handle.as_ref())?;
            d.remove_dirs()
        })
        .await
        .map_err(|e| Error::Device(format!("MPS stop task: {e}")))??;
        for &minor in &daemon.gpu_minors {
            let backend = self.backend.clone();
            tokio::task::spawn_blocking(move || {
                backend.set_compute_mode(minor, ComputeMode::Default)
            })
            .await
            .map_err(|e| Error::Device(format!("compute mode task: {e}")))??;
        }
        info!(claimUID = %daemon.claim_uid, "MPS control daemon stopped");
        Ok(())
    }

    fn may_have_unrecorded_mps(&self, uid: &str) -> bool {
        match self.unrecorded_mps.lock().expect("mps sweep").as_ref() {
            None => true,
            Some(set) => set.contains(uid),
        }
    }

    /// Stops a daemon found in `mps/<uid>` that no record describes, and removes the directory.
    async fn remove_stray_mps(&self, uid: &str) -> Result<(), Error> {
        let root = MpsDaemon::root_for(&self.mps_root, uid);
        if !root.exists() {
            return Ok(());
        }
        let daemon = MpsDaemon {
            claim_uid: uid.to_string(),
            root,
            gpu_minors: Vec::new(),
            device_uuids: Vec::new(),
            active_thread_percentage: None,
            pinned_limits_mib: Vec::new(),
            multi_user: false,
        };
        warn!(
            claimUID = uid,
            "removing MPS directories (and daemon) no record describes"
        );
        self.stop_mps(&daemon, None).await
    }

    fn plan(&self, alloc: &ClaimAllocation) -> Result<Vec<Planned>, Error> {
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
        let gpu_of = |minor: u32| {
            self.gpus
                .iter()
                .find(|g| g.minor == minor)
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
    fn check_not_in_use(&self, claim: &ClaimRef, planned: &[Planned]) -> Result<(), Error> {
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

    /// One GPU has one time slice: refuses intervals that differ from what another claim (or
    /// another device of this claim) set on the same GPU.
    fn check_time_slices(&self, claim: &ClaimRef, planned: &[Planned]) -> Result<(), Error> {
        let mut wanted: BTreeMap<u32, (TimeSliceInterval, &str)> = BTreeMap::new();
        for p in planned {
            let Some((minor, interval)) = p.time_slice() else {
                continue;
            };
            match wanted.get(&minor) {
                Some((other, _)) if *other != interval => {
                    return Err(time_slice_conflict(
                        &p.alloc.device,
                        interval,
                        *other,
                        &format!("{} (another request of this claim)", claim.key()),
                    ));
                }
                _ => {
                    wanted.insert(minor, (interval, &p.alloc.device));
                }
            }
        }
        if wanted.is_empty() {
            return Ok(());
        }
        for (uid, r) in self.checkpoint.claims() {
            if uid == claim.uid {
                continue;
            }
            for c in known_changes(&r) {
                if let HardwareChange::TimeSlice {
                    gpu_minor,
                    interval: held,
                } = c
                    && let Some((want, device)) = wanted.get(&gpu_minor)
                    && *want != held
                {
                    return Err(time_slice_conflict(
                        device,
                        *want,
                        held,
                        &format!("{}/{} ({uid})", r.namespace, r.name),
                    ));
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
            };
            edits.push(e);
        }
        Ok(edits)
    }

    /// The claim's MPS daemon, if any of its devices asks for MPS. All of them must ask for the
    /// same MPS settings (one daemon serves the claim). `edits` gives the UUIDs of devices
    /// created by now; without them (before creation) the UUIDs are left out.
    fn mps_daemon(
        &self,
        claim: &ClaimRef,
        planned: &[Planned],
        edits: &[DeviceEdits],
    ) -> Result<Option<MpsDaemon>, Error> {
        let mps: Vec<&Planned> = planned
            .iter()
            .filter(|p| p.strategy() == Some(SharingStrategy::Mps))
            .collect();
        let Some(first) = mps.first() else {
            return Ok(None);
        };
        let config = first
            .config
            .sharing()
            .and_then(|s| s.mps_config.clone())
            .unwrap_or_default();
        if let Some(other) = mps
            .iter()
            .find(|p| p.config.sharing().and_then(|s| s.mps_config.as_ref()) != Some(&config))
        {
            return Err(Error::InvalidAllocation(format!(
                "{} and {}: the MPS devices of one claim share one MPS control daemon and need the \
                 same mpsConfig ({} and {} differ)",
                first.alloc.device, other.alloc.device, first.config_at, other.config_at
            )));
        }
        let mut uuids = Vec::new();
        let mut minors = Vec::new();
        for p in &mps {
            let uuid = match &p.target {
                Target::Gpu(g) => Some(g.uuid.clone()),
                Target::StaticMig(g, i) => Some(static_mig(g, *i).uuid.clone()),
                Target::DynamicMig(..) => edits
                    .iter()
                    .find(|e| e.device_name == p.alloc.device)
                    .map(|e| e.uuid.clone()),
            };
            if let Some(u) = uuid
                && !uuids.contains(&u)
            {
                uuids.push(u);
            }
            if let Target::Gpu(g) = &p.target
                && !minors.contains(&g.minor)
            {
                minors.push(g.minor);
            }
        }
        let multi_user = config.multi_user.unwrap_or(false);
        if multi_user {
            for p in &mps {
                if let Target::Gpu(g) = &p.target
                    && !multi_user_capable(&g.cuda_compute_capability)
                {
                    return Err(Error::Unsupported(format!(
                        "{}.sharing.mpsConfig.multiUser: multi-user MPS needs CUDA compute \
                         capability 7.0 or newer; {} ({}) has {:?}",
                        first.config_at, p.alloc.device, g.uuid, g.cuda_compute_capability
                    )));
                }
            }
        }
        let complete = uuids.len() == mps.len();
        Ok(Some(MpsDaemon {
            claim_uid: claim.uid.clone(),
            root: MpsDaemon::root_for(&self.mps_root, &claim.uid),
            gpu_minors: minors,
            pinned_limits_mib: if complete {
                pinned_limits(&config, &uuids, &first.config_at)?
            } else {
                Vec::new()
            },
            device_uuids: uuids,
            active_thread_percentage: config.default_active_thread_percentage,
            multi_user,
        }))
    }

    /// Applies time slices and starts the MPS daemon; adds the containers' MPS edits.
    async fn apply_sharing(
        &self,
        claim: &ClaimRef,
        planned: &[Planned],
        edits: &mut [DeviceEdits],
        created: &mut Vec<HardwareChange>,
    ) -> Result<(), Error> {
        for (minor, interval) in time_slices(planned) {
            let backend = self.backend.clone();
            tokio::task::spawn_blocking(move || backend.set_time_slice(minor, interval))
                .await
                .map_err(|e| Error::Device(format!("time slice task: {e}")))??;
            created.push(HardwareChange::TimeSlice {
                gpu_minor: minor,
                interval,
            });
            info!(claim = %claim.key(), gpu_minor = minor, ?interval, "time slice set");
        }
        let Some(daemon) = self.mps_daemon(claim, planned, edits)? else {
            return Ok(());
        };
        // Recorded before anything is done, so a failure below undoes whatever part happened.
        created.push(HardwareChange::Mps {
            daemon: daemon.clone(),
            handle: None,
        });
        for &minor in &daemon.gpu_minors {
            let backend = self.backend.clone();
            tokio::task::spawn_blocking(move || {
                backend.set_compute_mode(minor, ComputeMode::ExclusiveProcess)
            })
            .await
            .map_err(|e| Error::Device(format!("compute mode task: {e}")))??;
        }
        let runner = self.runner.clone();
        let d = daemon.clone();
        let handle = tokio::task::spawn_blocking(move || {
            d.create_dirs()?;
            runner.start(&d)
        })
        .await
        .map_err(|e| Error::Device(format!("MPS start task: {e}")))??;
        info!(claim = %claim.key(), pid = handle.pid, runner = self.runner.name(), "MPS control daemon started");
        if let Some(HardwareChange::Mps { handle: h, .. }) = created.last_mut() {
            *h = Some(handle);
        }
        add_mps_edits(edits, planned, &daemon);
        Ok(())
    }

    /// Writes `sharing.json`: what the recorded claims have applied to each GPU.
    fn write_sharing_state(&self) {
        let mut state = SharingStateFile::default();
        for (uid, r) in self.checkpoint.claims() {
            for c in known_changes(&r) {
                let (minors, slice) = match c {
                    HardwareChange::TimeSlice {
                        gpu_minor,
                        interval,
                    } => (vec![gpu_minor], Some(interval)),
                    HardwareChange::Mps { daemon, .. } => (daemon.gpu_minors, None),
                    _ => continue,
                };
                for minor in minors {
                    let g: &mut GpuSharingState = state
                        .gpus
                        .entry(gpu_dra_api::inventory::gpu_device_name(minor))
                        .or_default();
                    if !g.claims.contains(&uid) {
                        g.claims.push(uid.clone());
                    }
                    match slice {
                        Some(i) => g.time_slice = i,
                        None => g.compute_mode = "ExclusiveProcess".into(),
                    }
                }
            }
        }
        if let Err(e) = state.write(&self.plugin_dir) {
            warn!(error = %e, "could not write the sharing state file");
        }
    }

    /// Startup: prepared claims get their sharing back. Time slices are applied again (a driver
    /// reload forgets them); each MPS claim's daemon is re-adopted when it still runs (found by
    /// its pipe directory) and started again when it does not, with its compute mode; MPS
    /// directories no record owns are removed with their daemon. Returns (adopted, restarted).
    pub async fn recover_sharing(&self) -> Result<(usize, usize), Error> {
        let _sharing_guard = self.sharing_lock.lock().await;
        let (mut adopted, mut restarted) = (0, 0);
        for (uid, r) in self
            .checkpoint
            .claims()
            .into_iter()
            .filter(|(_, r)| r.state == ClaimState::PrepareCompleted)
        {
            let mut hardware = r.hardware.clone();
            let mut changed = false;
            for h in hardware.iter_mut() {
                match serde_json::from_value::<HardwareChange>(h.clone()) {
                    Ok(HardwareChange::TimeSlice {
                        gpu_minor,
                        interval,
                    }) => {
                        let backend = self.backend.clone();
                        let res = tokio::task::spawn_blocking(move || {
                            backend.set_time_slice(gpu_minor, interval)
                        })
                        .await
                        .map_err(|e| Error::Device(format!("time slice task: {e}")))?;
                        if let Err(e) = res {
                            warn!(claimUID = %uid, gpu_minor, error = %e, "could not restore the time slice");
                        }
                    }
                    Ok(HardwareChange::Mps { daemon, handle }) => {
                        let runner = self.runner.clone();
                        let d = daemon.clone();
                        let live = tokio::task::spawn_blocking(move || {
                            handle
                                .filter(|h| runner.is_running(h))
                                .or_else(|| runner.find(&d))
                        })
                        .await
                        .map_err(|e| Error::Device(format!("MPS lookup task: {e}")))?;
                        let new_handle = match live {
                            Some(h) => {
                                info!(claimUID = %uid, pid = h.pid, "re-adopted a running MPS control daemon");
                                adopted += 1;
                                h
                            }
                            None => {
                                warn!(claimUID = %uid, "the MPS control daemon of a prepared claim is gone; starting it again");
                                for &minor in &daemon.gpu_minors {
                                    let backend = self.backend.clone();
                                    tokio::task::spawn_blocking(move || {
                                        backend
                                            .set_compute_mode(minor, ComputeMode::ExclusiveProcess)
                                    })
                                    .await
                                    .map_err(|e| {
                                        Error::Device(format!("compute mode task: {e}"))
                                    })??;
                                }
                                let runner = self.runner.clone();
                                let d = daemon.clone();
                                let h = tokio::task::spawn_blocking(move || {
                                    d.create_dirs()?;
                                    runner.start(&d)
                                })
                                .await
                                .map_err(|e| Error::Device(format!("MPS start task: {e}")))??;
                                restarted += 1;
                                h
                            }
                        };
                        if handle != Some(new_handle) {
                            *h = serde_json::to_value(HardwareChange::Mps {
                                daemon,
                                handle: Some(new_handle),
                            })
                            .expect("serializes");
                            changed = true;
                        }
                    }
                    _ => {}
                }
            }
            if changed {
                self.checkpoint
                    .update(|c| {
                        if let Some(rec) = c.get_mut(&uid) {
                            rec.hardware = hardware;
                        }
                    })
                    .await?;
            }
        }
        let claims = self.checkpoint.claims();
        let (stray, unrecorded): (Vec<String>, Vec<String>) = std::fs::read_dir(&self.mps_root)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|uid| {
                        claims.get(uid).is_none_or(|r| {
                            !known_changes(r).any(|c| matches!(c, HardwareChange::Mps { .. }))
                        })
                    })
                    .partition(|uid| !claims.contains_key(uid))
            })
            .unwrap_or_default();
        for uid in stray {
            self.remove_stray_mps(&uid).await?;
        }
        // Claims prepared from now on record their daemon before they start it; so only these
        // can own a directory no record describes.
        *self.unrecorded_mps.lock().expect("mps sweep") = Some(unrecorded.into_iter().collect());
        self.write_sharing_state();
        Ok((adopted, restarted))
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
        self.undo("", &stray).await?;
        Ok(stray.len())
    }

    /// Startup consistency between checkpoint and CDI specs: completed claims get their spec back
    /// if a crash came between the two writes; specs no record owns are removed. Returns the
    /// number of specs rewritten and removed.
    ///
    /// Sharing is restored first (`recover_sharing`), so a rebuilt spec points at live daemons.
    pub async fn repair_cdi(&self) -> Result<(usize, usize), Error> {
        let (adopted, restarted) = self.recover_sharing().await?;
        if adopted + restarted > 0 {
            info!(
                adopted,
                restarted, "MPS control daemons of prepared claims recovered"
            );
        }
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
            let mut list: Vec<DeviceEdits> = Vec::new();
            let mut complete = true;
            for d in &r.devices {
                if list.iter().any(|e| e.device_name == d.device_name) {
                    continue;
                }
                match existing_edits(&live, &d.device_name) {
                    Some(e) => list.push(e),
                    None => complete = false,
                }
            }
            let mut edits = complete.then_some(list);
            if let Some(list) = edits.as_mut() {
                for c in known_changes(r) {
                    if let HardwareChange::Mps { daemon, .. } = c {
                        for e in list
                            .iter_mut()
                            .filter(|e| daemon.device_uuids.contains(&e.uuid))
                        {
                            e.env.extend(daemon.container_env());
                            e.mounts.extend(daemon.container_mounts());
                        }
                    }
                }
            }
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
                warn!(claimUID = %uid, "unreadable CDI spec; removing it");
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
                warn!(claimUID = %uid, "CDI spec lacks claim annotations; removing it");
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

/// The whole GPUs a claim time-slices, one interval per GPU (conflicts are checked before).
fn time_slices(planned: &[Planned]) -> Vec<(u32, TimeSliceInterval)> {
    let mut out: Vec<(u32, TimeSliceInterval)> = Vec::new();
    for (minor, interval) in planned.iter().filter_map(Planned::time_slice) {
        if !out.iter().any(|(m, _)| *m == minor) {
            out.push((minor, interval));
        }
    }
    out
}

/// MPS devices get the daemon's directories and settings.
fn add_mps_edits(edits: &mut [DeviceEdits], planned: &[Planned], daemon: &MpsDaemon) {
    for e in edits.iter_mut() {
        let mps = planned
            .iter()
            .any(|p| p.alloc.device == e.device_name && p.strategy() == Some(SharingStrategy::Mps));
        if mps {
            e.env.extend(daemon.container_env());
            e.mounts.extend(daemon.container_mounts());
        }
    }
}

fn gpu_edits(device: &str, gpu: &Gpu) -> DeviceEdits {
    DeviceEdits {
        device_name: device.to_string(),
        uuid: gpu.uuid.clone(),
        device_nodes: vec![format!("/dev/nvidia{}", gpu.minor)],
        ..Default::default()
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
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
