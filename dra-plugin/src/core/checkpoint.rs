//! The crash-safe record of prepared claims.
//!
//! File layout: `{"version": 1, "checksum": "<sha256 of data>", "data": {...}}`. The checksum
//! covers the bytes of `data` exactly as written, so fields added by a newer version never make
//! the file look corrupt to an older one (the failure NVIDIA's driver hit on upgrades). Writes are
//! group-committed: concurrent updates share one fsync'd write, and files that belong with an
//! update (a claim's CDI spec) ride along in the same blocking call, written just before it.
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::fsutil::write_atomic;
use super::types::PreparedDevice;
use crate::Error;

pub const CHECKPOINT_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimState {
    /// Recorded before any device was touched; a crash leaves this for cleanup to roll back.
    PrepareStarted,
    PrepareCompleted,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRecord {
    pub state: ClaimState,
    pub namespace: String,
    pub name: String,
    /// What the kubelet was (or will be) told.
    #[serde(default)]
    pub devices: Vec<PreparedDevice>,
    /// Devices whose hardware state we changed and must undo (e.g. dynamic MIG instances).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hardware: Vec<serde_json::Value>,
    /// Fields written by newer versions, kept as they were.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointData {
    #[serde(rename = "nodeBootID", default)]
    pub node_boot_id: String,
    #[serde(default)]
    pub claims: BTreeMap<String, ClaimRecord>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

#[derive(Serialize, Deserialize)]
struct Envelope<'a> {
    version: u32,
    checksum: String,
    #[serde(borrow)]
    data: &'a RawValue,
}

/// How loading went; anything but `Loaded`/`Fresh` deserves a log line and an event.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadOutcome {
    Loaded,
    Fresh,
    /// The node rebooted: prepared state is gone with it; these claims were dropped.
    Rebooted {
        dropped: Vec<String>,
    },
    /// Unreadable; the file was moved aside and the checkpoint starts empty.
    Corrupt {
        reason: String,
        moved_to: PathBuf,
    },
}

pub fn checksum(data: &[u8]) -> String {
    let digest = Sha256::digest(data);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses a checkpoint file's bytes.
pub fn decode(bytes: &[u8]) -> Result<CheckpointData, String> {
    let env: Envelope =
        serde_json::from_slice(bytes).map_err(|e| format!("not a checkpoint: {e}"))?;
    if env.version > CHECKPOINT_VERSION {
        return Err(format!(
            "checkpoint version {} is newer than this plugin understands ({CHECKPOINT_VERSION})",
            env.version
        ));
    }
    let raw = env.data.get();
    if checksum(raw.as_bytes()) != env.checksum {
        return Err("checksum mismatch".into());
    }
    serde_json::from_str(raw).map_err(|e| format!("bad data: {e}"))
}

pub fn encode(data: &CheckpointData) -> Vec<u8> {
    let raw = serde_json::to_string(data).expect("checkpoint data serializes");
    // Written by hand so `data` lands byte for byte as checksummed.
    format!(
        r#"{{"version":{CHECKPOINT_VERSION},"checksum":"{}","data":{raw}}}"#,
        checksum(raw.as_bytes())
    )
    .into_bytes()
}

/// A file written with the next group commit, before the checkpoint itself.
struct SideFile {
    generation: u64,
    path: PathBuf,
    bytes: Vec<u8>,
}

struct Pending {
    data: CheckpointData,
    generation: u64,
    files: Vec<SideFile>,
    /// Side files that could not be written, by the generation that queued them.
    failed: HashMap<u64, (PathBuf, std::io::Error)>,
}

pub struct Checkpoint {
    path: PathBuf,
    shared: Arc<Shared>,
}

/// What a flush, which runs to its end on the blocking pool even when its caller goes away,
/// needs to reach.
struct Shared {
    state: Mutex<Pending>,
    /// The newest generation on disk; every finished flush notifies, failed ones too.
    flushed: watch::Sender<u64>,
    /// One flush at a time; the others wait for it and go again only if it did not carry them.
    flushing: AtomicBool,
}

impl Checkpoint {
    /// Loads (or starts) the checkpoint at `path` for the running boot.
    pub fn load(path: &Path, boot_id: &str) -> Result<(Self, LoadOutcome), Error> {
        let (mut data, outcome) = match std::fs::read(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                (CheckpointData::default(), LoadOutcome::Fresh)
            }
            Err(e) => return Err(Error::io("reading the checkpoint", path, e)),
            Ok(bytes) => match decode(&bytes) {
                Ok(data) if data.node_boot_id.is_empty() || data.node_boot_id == boot_id => {
                    (data, LoadOutcome::Loaded)
                }
                Ok(data) => {
                    let dropped = data.claims.keys().cloned().collect();
                    (CheckpointData::default(), LoadOutcome::Rebooted { dropped })
                }
                Err(reason) => {
                    let secs = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0);
                    let moved_to = path.with_extension(format!("json.corrupt-{secs}"));
                    std::fs::rename(path, &moved_to)
                        .map_err(|e| Error::io("moving the corrupt checkpoint aside", path, e))?;
                    (
                        CheckpointData::default(),
                        LoadOutcome::Corrupt { reason, moved_to },
                    )
                }
            },
        };
        data.node_boot_id = boot_id.to_string();
        let (flushed, _) = watch::channel(0);
        let cp = Checkpoint {
            path: path.to_path_buf(),
            shared: Arc::new(Shared {
                state: Mutex::new(Pending {
                    data,
                    generation: 0,
                    files: Vec::new(),
                    failed: HashMap::new(),
                }),
                flushed,
                flushing: AtomicBool::new(false),
            }),
        };
        Ok((cp, outcome))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, uid: &str) -> Option<ClaimRecord> {
        self.shared
            .state
            .lock()
            .expect("checkpoint lock")
            .data
            .claims
            .get(uid)
            .cloned()
    }

    /// Reads the records in place, without the copy [`Checkpoint::claims`] makes (hot paths).
    pub fn with_claims<R>(&self, f: impl FnOnce(&BTreeMap<String, ClaimRecord>) -> R) -> R {
        f(&self
            .shared
            .state
            .lock()
            .expect("checkpoint lock")
            .data
            .claims)
    }

    pub fn claims(&self) -> BTreeMap<String, ClaimRecord> {
        self.shared
            .state
            .lock()
            .expect("checkpoint lock")
            .data
            .claims
            .clone()
    }

    /// Applies `f` in memory, then returns once a write containing the change is on disk.
    pub async fn update<R>(
        &self,
        f: impl FnOnce(&mut BTreeMap<String, ClaimRecord>) -> R,
    ) -> Result<R, Error> {
        let (result, generation) = self.stage(f, None);
        self.flush_until(generation).await?;
        Ok(result)
    }

    /// Applies `f` in memory and queues `file` for the next flush; returns `f`'s result and the
    /// generation a flush must reach to carry both.
    fn stage<R>(
        &self,
        f: impl FnOnce(&mut BTreeMap<String, ClaimRecord>) -> R,
        file: Option<(PathBuf, Vec<u8>)>,
    ) -> (R, u64) {
        let mut s = self.shared.state.lock().expect("checkpoint lock");
        let r = f(&mut s.data.claims);
        s.generation += 1;
        let generation = s.generation;
        if let Some((path, bytes)) = file {
            s.files.push(SideFile {
                generation,
                path,
                bytes,
            });
        }
        (r, generation)
    }

    /// Like [`Checkpoint::update`], and writes `bytes` atomically to `path` (creating its
    /// directory) in the same group commit, before the checkpoint. Saves the blocking-pool
    /// handoff per file that dominates a busy node's prepare calls. An error names the file that
    /// failed; the change to the records is applied either way, as with a failed checkpoint write.
    pub async fn update_with_file<R>(
        &self,
        f: impl FnOnce(&mut BTreeMap<String, ClaimRecord>) -> R,
        what: &'static str,
        path: PathBuf,
        bytes: Vec<u8>,
    ) -> Result<R, Error> {
        let (result, generation) = self.stage(f, Some((path, bytes)));
        let flushed = self.flush_until(generation).await;
        let failed = self
            .shared
            .state
            .lock()
            .expect("checkpoint lock")
            .failed
            .remove(&generation);
        if let Some((path, e)) = failed {
            return Err(Error::io(what, &path, e));
        }
        flushed.map(|()| result)
    }

    async fn flush_until(&self, generation: u64) -> Result<(), Error> {
        let mut flushes = self.shared.flushed.subscribe();
        loop {
            if *flushes.borrow_and_update() >= generation {
                return Ok(());
            }
            if self
                .shared
                .flushing
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                // The running flush may carry this change; if not, go again after it.
                let _ = flushes.changed().await;
                continue;
            }
            let (shared, path) = (self.shared.clone(), self.path.clone());
            tokio::task::spawn_blocking(move || shared.flush(&path))
                .await
                .map_err(std::io::Error::other)
                .and_then(|written| written)
                .map_err(|e| Error::io("writing the checkpoint", &self.path, e))?;
        }
    }
}

impl Shared {
    /// Writes the queued side files, then the checkpoint as it is now. Blocking.
    fn flush(&self, path: &Path) -> std::io::Result<()> {
        let (bytes, snapshot, files) = {
            let mut s = self.state.lock().expect("checkpoint lock");
            let files = std::mem::take(&mut s.files);
            (encode(&s.data), s.generation, files)
        };
        let failed: Vec<_> = files
            .into_iter()
            .filter_map(|f| {
                write_atomic(&f.path, &f.bytes)
                    .err()
                    .map(|e| (f.generation, (f.path, e)))
            })
            .collect();
        if !failed.is_empty() {
            let mut s = self.state.lock().expect("checkpoint lock");
            s.failed.extend(failed);
        }
        let written = write_atomic(path, &bytes);
        if written.is_ok() {
            self.flushed.send_if_modified(|v| {
                *v = snapshot;
                false
            });
        }
        // Release before waking the waiters, so whichever of them still needs a flush can start it.
        self.flushing.store(false, Ordering::Release);
        self.flushed.send_modify(|_| {});
        written
    }
}

/// The kernel's boot ID, which changes on every reboot.
pub fn read_boot_id(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| Error::io("reading the boot ID", path, e))
}

#[cfg(test)]
mod tests;
