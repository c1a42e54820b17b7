//! Startup repair: MIG devices no claim owns, CDI specs out of step with the checkpoint, and
//! claims adopted from their CDI specs after the checkpoint was lost.
use gpu_dra_api::names::{CDI_CLAIM_ANNOTATION, CDI_DEVICES_ANNOTATION};
use tracing::{info, warn};

use super::{DeviceState, HardwareChange, known_changes};
use crate::Error;
use crate::cdi::{CdiStore, DeviceEdits, existing_edits};
use crate::checkpoint::{ClaimRecord, ClaimState};
use crate::types::{ClaimRef, PreparedDevice};

impl DeviceState {
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
                .get(CDI_CLAIM_ANNOTATION)
                .cloned()
                .unwrap_or_default();
            let devices: Option<Vec<PreparedDevice>> = spec
                .annotations
                .get(CDI_DEVICES_ANNOTATION)
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
