//! The crash-safe record of prepared claims.
//!
//! File layout: `{"version": 1, "checksum": "<sha256 of data>", "data": {...}}`, then blanks. The
//! checksum covers the bytes of `data` exactly as written, so fields added by a newer version never
//! make the file look corrupt to an older one (the failure NVIDIA's driver hit on upgrades). Writes
//! are group-committed: concurrent updates share one fsync'd write, and files that belong with an
//! update (a claim's CDI spec, written or removed, not fsynced) ride along in the same blocking
//! call, just before it.
//!
//! Two files take the writes in turn, each overwritten in place and fdatasync'd: `checkpoint.json`
//! and `checkpoint.json.alt`. A write torn by a crash spoils only the file it went to; the other
//! still holds the write before it, and loading takes the newest file that checks out (`data.seq`).
//! Against temp file + fsync + rename this saves the inode churn and the journal commit of every
//! write (about 2.4× less time per write on ext4), which is the group-commit period every prepare
//! waits for. The size of a file only changes when the records outgrow it (or, above
//! [`KEEP_SIZE_UP_TO`], shrink to a quarter), so most writes need no metadata at all; blanks after
//! the JSON pad it to its size.
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::fsutil::{remove_if_exists, replace_unsynced};
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
    /// Counts writes, so that loading can tell the newer of the two files.
    #[serde(default)]
    pub seq: u64,
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

/// A file written (or, without bytes, removed) with the next group commit, before the
/// checkpoint itself.
struct SideFile {
    generation: u64,
    path: PathBuf,
    bytes: Option<Vec<u8>>,
}

struct Pending {
    data: CheckpointData,
    generation: u64,
    files: Vec<SideFile>,
    /// Side files that could not be written or removed, by the generation that queued them.
    failed: HashMap<u64, (PathBuf, std::io::Error)>,
}

impl Pending {
    /// Applies `f` to the records and queues `file`, under a new generation.
    fn stage<R>(
        &mut self,
        f: impl FnOnce(&mut BTreeMap<String, ClaimRecord>) -> R,
        file: Option<(PathBuf, Option<Vec<u8>>)>,
    ) -> (R, u64) {
        let r = f(&mut self.data.claims);
        self.generation += 1;
        let generation = self.generation;
        if let Some((path, bytes)) = file {
            self.files.push(SideFile {
                generation,
                path,
                bytes,
            });
        }
        (r, generation)
    }
}

pub struct Checkpoint {
    path: PathBuf,
    shared: Arc<Shared>,
}

/// The two files written in turn.
struct Slots {
    paths: [PathBuf; 2],
    files: [Option<File>; 2],
    /// The file's length, and how much of it the last write filled before the blanks.
    len: [u64; 2],
    filled: [u64; 2],
    /// The file holding the newest write on disk, if any; the next write goes to the other one.
    newest: Option<usize>,
}

#[cfg(test)]
type PassHook = Box<dyn FnMut(&Mutex<Pending>) + Send>;

/// What a flush, which runs to its end on the blocking pool even when its caller goes away,
/// needs to reach.
struct Shared {
    state: Mutex<Pending>,
    /// The newest generation on disk; every finished flush notifies, failed ones too.
    flushed: watch::Sender<u64>,
    /// One flush at a time; the others wait for it and go again only if it did not carry them.
    flushing: AtomicBool,
    slots: Mutex<Slots>,
    /// The lock shared with a second plugin process, when there may be one (`shared`).
    writer: OnceLock<tokio::sync::Mutex<shared::Writer>>,
    /// Leases of this process on `writer` now.
    leases: AtomicUsize,
    /// Runs after each pass over side files but the last (tests queue files mid-flush with it).
    #[cfg(test)]
    after_pass: Mutex<Option<PassHook>>,
}

impl Checkpoint {
    /// Loads (or starts) the checkpoint at `path` (and its alternate file) for the running boot.
    pub fn load(path: &Path, boot_id: &str) -> Result<(Self, LoadOutcome), Error> {
        let paths = [path.to_path_buf(), alternate(path)];
        let mut read =
            read_files(&paths).map_err(|(p, e)| Error::io("reading the checkpoint", p, e))?;
        let newest = take_newest(&mut read);
        let newest_file = newest.as_ref().map(|(i, _)| *i);
        let (mut data, outcome) = match newest {
            Some((_, data)) => {
                if data.node_boot_id.is_empty() || data.node_boot_id == boot_id {
                    (data, LoadOutcome::Loaded)
                } else {
                    let dropped = data.claims.keys().cloned().collect();
                    let fresh = CheckpointData {
                        seq: data.seq,
                        ..Default::default()
                    };
                    (fresh, LoadOutcome::Rebooted { dropped })
                }
            }
            None if read.iter().all(Option::is_none) => {
                (CheckpointData::default(), LoadOutcome::Fresh)
            }
            None => {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let mut outcome = None;
                for (p, r) in paths.iter().zip(&read) {
                    let Some(Err(reason)) = r else { continue };
                    let moved_to = p.with_extension(format!(
                        "{}.corrupt-{secs}",
                        p.extension().unwrap_or_default().to_string_lossy()
                    ));
                    std::fs::rename(p, &moved_to)
                        .map_err(|e| Error::io("moving the corrupt checkpoint aside", p, e))?;
                    outcome.get_or_insert(LoadOutcome::Corrupt {
                        reason: reason.clone(),
                        moved_to,
                    });
                }
                let outcome = outcome.expect("at least one file was unreadable");
                (CheckpointData::default(), outcome)
            }
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
                slots: Mutex::new(Slots {
                    paths,
                    files: [None, None],
                    len: [0; 2],
                    filled: [0; 2],
                    newest: newest_file,
                }),
                writer: OnceLock::new(),
                leases: AtomicUsize::new(0),
                #[cfg(test)]
                after_pass: Mutex::new(None),
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

    /// Devices of completed claims, for the `prepared devices` gauge.
    pub fn prepared_device_count(&self) -> usize {
        self.with_claims(|claims| {
            claims
                .values()
                .filter(|r| r.state == ClaimState::PrepareCompleted)
                .map(|r| r.devices.len())
                .sum()
        })
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
        file: Option<(PathBuf, Option<Vec<u8>>)>,
    ) -> (R, u64) {
        self.shared
            .state
            .lock()
            .expect("checkpoint lock")
            .stage(f, file)
    }

    /// Like [`Checkpoint::update`], and writes `bytes` atomically to `path` (creating its
    /// directory) in the same group commit, before the checkpoint. The file is not fsynced: it
    /// must be one the plugin can rebuild from the records (a CDI spec, see `replace_unsynced`). Saves the blocking-pool
    /// handoff per file that dominates a busy node's prepare calls. An error names the file that
    /// failed; the change to the records is applied either way, as with a failed checkpoint write.
    pub async fn update_with_file<R>(
        &self,
        f: impl FnOnce(&mut BTreeMap<String, ClaimRecord>) -> R,
        what: &'static str,
        path: PathBuf,
        bytes: Vec<u8>,
    ) -> Result<R, Error> {
        self.update_with(f, what, path, Some(bytes)).await
    }

    /// Like [`Checkpoint::update_with_file`], removing `path` (a missing file is no error)
    /// instead: the unlink leaves the async worker, which a burst of unprepares would otherwise
    /// spend a tenth of its time on.
    pub async fn update_removing_file<R>(
        &self,
        f: impl FnOnce(&mut BTreeMap<String, ClaimRecord>) -> R,
        what: &'static str,
        path: PathBuf,
    ) -> Result<R, Error> {
        self.update_with(f, what, path, None).await
    }

    async fn update_with<R>(
        &self,
        f: impl FnOnce(&mut BTreeMap<String, ClaimRecord>) -> R,
        what: &'static str,
        path: PathBuf,
        bytes: Option<Vec<u8>>,
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

    /// Leaves the newest state in the first file (one more write when it is in the alternate),
    /// so that a version from before the second file, started after this one stops, reads it.
    /// For shutdown, after the last update.
    pub async fn settle(&self) -> Result<(), Error> {
        let _lease = self.lease().await?;
        let in_alternate = self.shared.slots.lock().expect("checkpoint slots").newest == Some(1);
        if in_alternate {
            self.update(|_| ()).await?;
        }
        Ok(())
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
            let shared = self.shared.clone();
            tokio::task::spawn_blocking(move || shared.flush())
                .await
                .map_err(std::io::Error::other)
                .and_then(|written| written)
                .map_err(|e| Error::io("writing the checkpoint", &self.path, e))?;
        }
    }
}

/// How many times one flush takes the side files queued so far before it writes the checkpoint.
/// Side files queued while the flush writes earlier ones join it instead of waiting for it to end
/// and for a flush of their own: under a burst, the prepares that arrive during the first batch of
/// CDI specs skip one fdatasync'd write. The bound keeps a steady stream from holding back the
/// checkpoint write that the first batch waits for.
const FILE_PASSES: usize = 3;

impl Shared {
    /// Writes the queued side files, then the checkpoint as it is now. Blocking.
    fn flush(&self) -> std::io::Result<()> {
        let mut failed = Vec::new();
        let mut write_files = |files: Vec<SideFile>| {
            failed.extend(files.into_iter().filter_map(|f| {
                match &f.bytes {
                    Some(bytes) => replace_unsynced(&f.path, bytes),
                    None => remove_if_exists(&f.path),
                }
                .err()
                .map(|e| (f.generation, (f.path, e)))
            }))
        };
        let mut pass = 1;
        let (bytes, snapshot) = loop {
            let mut s = self.state.lock().expect("checkpoint lock");
            let files = std::mem::take(&mut s.files);
            // The last pass takes the snapshot with its files: it carries exactly the records
            // whose files are written by now or in this pass, all before the checkpoint.
            let snapshot = (files.is_empty() || pass == FILE_PASSES).then(|| {
                s.data.seq += 1;
                (encode(&s.data), s.generation)
            });
            drop(s);
            write_files(files);
            if let Some(snapshot) = snapshot {
                break snapshot;
            }
            #[cfg(test)]
            if let Some(hook) = self.after_pass.lock().expect("test hook").as_mut() {
                hook(&self.state);
            }
            pass += 1;
        };
        if !failed.is_empty() {
            let mut s = self.state.lock().expect("checkpoint lock");
            s.failed.extend(failed);
        }
        let written = self.slots.lock().expect("checkpoint slots").write(bytes);
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

impl Slots {
    /// Overwrites the file not holding the newest write in place with `bytes`, blanks over what is
    /// left of the last write, and fdatasyncs it. A failed write leaves the newest file as it was,
    /// so the next try goes to the same file, and forgets what it knew of this one (reopened and
    /// fully blanked next).
    fn write(&mut self, bytes: Vec<u8>) -> std::io::Result<()> {
        let i = self.newest.map_or(0, |n| 1 - n);
        let written = self.write_to(i, bytes);
        match written {
            Ok(()) => self.newest = Some(i),
            Err(_) => self.files[i] = None,
        }
        written
    }

    fn write_to(&mut self, i: usize, mut bytes: Vec<u8>) -> std::io::Result<()> {
        let file = match &mut self.files[i] {
            Some(f) => f,
            slot => {
                let f = File::options()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&self.paths[i])?;
                self.len[i] = f.metadata()?.len();
                self.filled[i] = self.len[i];
                slot.insert(f)
            }
        };
        let used = bytes.len() as u64;
        let len = match self.len[i] {
            cur if used > cur => used.next_power_of_two().max(4096),
            cur if cur > KEEP_SIZE_UP_TO && used < cur / 4 => {
                used.next_power_of_two().max(KEEP_SIZE_UP_TO)
            }
            cur => cur,
        };
        // Blank out the rest of the last write, or everything when the file changes length.
        let blank_to = match len == self.len[i] {
            true => self.filled[i].max(used),
            false => len,
        };
        let blank_to = usize::try_from(blank_to)
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::FileTooLarge))?;
        bytes.resize(blank_to, b' ');
        file.write_all_at(&bytes, 0)?;
        if len != self.len[i] {
            file.set_len(len)?;
        }
        file.sync_data()?;
        self.len[i] = len;
        self.filled[i] = used;
        Ok(())
    }
}

/// Files up to this size keep their size when the records shrink. A node whose pods come and go
/// together (64 claims prepared, then unprepared) otherwise shrank its files at every wave and grew
/// them at the next: on the 64-claim bench, 61-92 ftruncates per run of 21 bursts, 0.17 ms each on
/// average on ext4, on the flush thread every prepare waits for.
const KEEP_SIZE_UP_TO: u64 = 256 * 1024;

/// The second file of the checkpoint at `path`.
pub fn alternate(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".alt");
    path.with_file_name(name)
}

/// Each file as read: missing, unreadable (why), or its data.
type FileReads = Vec<Option<Result<CheckpointData, String>>>;

fn read_files(paths: &[PathBuf]) -> Result<FileReads, (&Path, std::io::Error)> {
    paths
        .iter()
        .map(|p| match std::fs::read(p) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err((p.as_path(), e)),
            Ok(bytes) => Ok(Some(decode(&bytes))),
        })
        .collect()
}

/// Takes out the data of the file with the highest `seq` of those that check out (the first on a
/// tie), with the file's index; the other is older or was torn by a crash mid-write.
fn take_newest(read: &mut FileReads) -> Option<(usize, CheckpointData)> {
    let i = (0..read.len())
        .filter_map(|i| match &read[i] {
            Some(Ok(data)) => Some((i, data.seq)),
            _ => None,
        })
        .max_by_key(|&(i, seq)| (seq, std::cmp::Reverse(i)))?
        .0;
    match read[i].take() {
        Some(Ok(data)) => Some((i, data)),
        _ => unreachable!("chosen among the readable files"),
    }
}

/// The newest readable state of the checkpoint at `path`, as [`Checkpoint::load`] would take it
/// (without the boot check); for tools and tests.
pub fn read_newest(path: &Path) -> Result<CheckpointData, String> {
    let paths = [path.to_path_buf(), alternate(path)];
    let mut read = read_files(&paths).map_err(|(p, e)| format!("{}: {e}", p.display()))?;
    if let Some((_, data)) = take_newest(&mut read) {
        return Ok(data);
    }
    let unreadable = paths.iter().zip(&read).find_map(|(p, r)| match r {
        Some(Err(e)) => Some(format!("{}: {e}", p.display())),
        _ => None,
    });
    Err(unreadable.unwrap_or_else(|| format!("{}: no checkpoint", path.display())))
}

/// The kernel's boot ID, which changes on every reboot.
pub fn read_boot_id(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| Error::io("reading the boot ID", path, e))
}

mod shared;
pub use shared::{Lease, StartupLock, lock_path};

#[cfg(test)]
mod tests;
