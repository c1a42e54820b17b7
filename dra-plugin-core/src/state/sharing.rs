//! The sharing half of a prepare: time slices and the claim's MPS control daemon, applied,
//! stopped, recorded in `sharing.json`, and recovered at startup.
use std::collections::BTreeMap;

use gpu_dra_api::config::{SharingStrategy, TimeSliceInterval};
use tracing::{info, warn};

use super::plan::{Planned, Target, static_mig};
use super::{DeviceState, HardwareChange, known_changes};
use crate::Error;
use crate::backend::ComputeMode;
use crate::cdi::DeviceEdits;
use crate::checkpoint::ClaimState;
use crate::sharing::mps::{MpsDaemon, multi_user_capable, pinned_limits};
use crate::sharing::runner::DaemonHandle;
use crate::sharing::{GpuSharingState, SharingStateFile, time_slice_conflict};
use crate::types::ClaimRef;

impl DeviceState {
    /// Stops a claim's MPS daemon, removes its directories and resets its GPUs' compute mode.
    pub(super) async fn stop_mps(
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

    pub(super) fn may_have_unrecorded_mps(&self, uid: &str) -> bool {
        match self.unrecorded_mps.lock().expect("mps sweep").as_ref() {
            None => true,
            Some(set) => set.contains(uid),
        }
    }

    /// Stops a daemon found in `mps/<uid>` that no record describes, and removes the directory.
    pub(super) async fn remove_stray_mps(&self, uid: &str) -> Result<(), Error> {
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

    /// One GPU has one time slice: refuses intervals that differ from what another claim (or
    /// another device of this claim) set on the same GPU.
    pub(super) fn check_time_slices(
        &self,
        claim: &ClaimRef,
        planned: &[Planned],
    ) -> Result<(), Error> {
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

    /// The claim's MPS daemon, if any of its devices asks for MPS. All of them must ask for the
    /// same MPS settings (one daemon serves the claim). `edits` gives the UUIDs of devices
    /// created by now; without them (before creation) the UUIDs are left out.
    pub(super) fn mps_daemon(
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
                Target::DynamicMig(..) | Target::Vfio(_) => edits
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
    pub(super) async fn apply_sharing(
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
    pub(super) fn write_sharing_state(&self) {
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
}

/// The whole GPUs a claim time-slices, one interval per GPU (conflicts are checked before).
pub(super) fn time_slices(planned: &[Planned]) -> Vec<(u32, TimeSliceInterval)> {
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
