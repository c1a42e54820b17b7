//! Two plugin processes on one checkpoint, as during a rolling upgrade (old and new pod of the
//! DaemonSet side by side, the kubelet calling either).
//!
//! Design: an exclusive `flock` on `<plugin dir>/checkpoint.lock`, held by a process while any
//! of its prepares or unprepares runs ([`Checkpoint::lease`]), and from before it loads the
//! checkpoint until its startup recovery ends. Whoever takes the lock writes its writer ID into
//! the lock file; a process that finds another ID there reloads the records from the checkpoint
//! files before it reads them. So every change is made on the newest records by exactly one
//! process at a time: no claim is lost (a write never starts from stale records) or prepared
//! twice (the second caller sees the first one's `PrepareCompleted` record). Startup takes the
//! lock too because its recovery rolls back `PrepareStarted` records, which would otherwise
//! include the other process's prepares in flight.
//!
//! Simpler than a hand-over (the new process waiting for the old one to exit): the kubelet may
//! route calls to either process while both are registered, and a process without the lock could
//! not answer them. The lock is taken once per burst, not per claim: concurrent calls of one
//! process share it and the lock is given back when the last of them ends and no write is in
//! flight, so a process under a stream of overlapping calls keeps it and the other waits for a
//! gap (the kubelet sends its calls to one of the two anyway). Without a rolling-update UID nothing
//! of this runs (one process, no lock, no reload).
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Checkpoint, Shared, read_files, take_newest};
use crate::Error;

/// The lock file next to the checkpoint at `checkpoint`.
pub fn lock_path(checkpoint: &Path) -> PathBuf {
    checkpoint.with_file_name("checkpoint.lock")
}

/// The `flock` of one process, shared by its calls.
pub(super) struct Writer {
    file: File,
    path: PathBuf,
    /// Written into the lock file on taking it; unique per process.
    id: String,
    held: bool,
}

/// The exclusive lock taken before loading the checkpoint; [`Checkpoint::share`] turns it into
/// the checkpoint's writer lock.
pub struct StartupLock {
    writer: Writer,
}

impl StartupLock {
    /// Blocks until the lock next to `checkpoint` is ours. `id` names this process (pod UID and
    /// PID): the other process reloads when it sees a different one.
    pub fn acquire(checkpoint: &Path, id: &str) -> Result<Self, Error> {
        let path = lock_path(checkpoint);
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Error::io("opening the checkpoint lock", &path, e))?;
        file.lock()
            .map_err(|e| Error::io("locking the checkpoint", &path, e))?;
        let writer = Writer {
            file,
            path,
            id: id.to_string(),
            held: true,
        };
        writer.mark()?;
        Ok(StartupLock { writer })
    }
}

impl Writer {
    /// Leaves our ID in the lock file (page cache only: the other process reads the same cache,
    /// and after a node crash both start by loading the files anyway).
    fn mark(&self) -> Result<(), Error> {
        std::fs::write(&self.path, &self.id)
            .map_err(|e| Error::io("marking the checkpoint lock", &self.path, e))
    }

    /// Whether someone else took the lock since we last held it.
    fn foreign(&self) -> Result<bool, Error> {
        let last = std::fs::read_to_string(&self.path)
            .map_err(|e| Error::io("reading the checkpoint lock", &self.path, e))?;
        Ok(last != self.id)
    }
}

/// Holds the writer lock for one call; the lock is released after the last lease of the process
/// is dropped (and its writes are on disk). A no-op without a rolling-update UID.
#[must_use = "the lock is held only while the lease lives"]
pub struct Lease(Option<Arc<Shared>>);

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(shared) = self.0.take() else { return };
        if shared.leases.fetch_sub(1, Ordering::AcqRel) == 1 {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn(release(shared))),
                // Outside a runtime no flush can be in flight: give the lock back here.
                Err(_) => {
                    if let Some(w) = shared.writer.get() {
                        let mut w = w.blocking_lock();
                        if w.held && shared.leases.load(Ordering::Acquire) == 0 {
                            let _ = w.file.unlock();
                            w.held = false;
                        }
                    }
                }
            }
        }
    }
}

/// Gives the lock back once no lease is left and no write is in flight.
async fn release(shared: Arc<Shared>) {
    let Some(writer) = shared.writer.get() else {
        return;
    };
    let mut w = writer.lock().await;
    if !w.held || shared.leases.load(Ordering::Acquire) > 0 {
        return;
    }
    // A call dropped mid-write leaves its flush running on the blocking pool; wait for it.
    let mut flushes = shared.flushed.subscribe();
    while shared.flushing.load(Ordering::Acquire) {
        if flushes.changed().await.is_err() {
            break;
        }
    }
    if w.file.unlock().is_ok() {
        w.held = false;
    }
}

impl Checkpoint {
    /// Makes this checkpoint shared with another process through `lock` (taken before loading);
    /// returns the lease that keeps it held through startup recovery.
    pub fn share(&self, lock: StartupLock) -> Lease {
        self.shared.leases.fetch_add(1, Ordering::AcqRel);
        if self
            .shared
            .writer
            .set(tokio::sync::Mutex::new(lock.writer))
            .is_err()
        {
            panic!("checkpoint shared twice");
        }
        Lease(Some(self.shared.clone()))
    }

    /// Takes the writer lock for one call (waiting for the other process's call to end) and
    /// reloads the records when the other process wrote since. Free when not shared.
    pub async fn lease(&self) -> Result<Lease, Error> {
        let Some(writer) = self.shared.writer.get() else {
            return Ok(Lease(None));
        };
        let mut w = writer.lock().await;
        if !w.held {
            let file = w
                .file
                .try_clone()
                .map_err(|e| Error::io("opening the checkpoint lock", &w.path, e))?;
            tokio::task::spawn_blocking(move || file.lock())
                .await
                .map_err(std::io::Error::other)
                .and_then(|r| r)
                .map_err(|e| Error::io("locking the checkpoint", &w.path, e))?;
            w.held = true;
            if let Err(e) = self.catch_up(&w) {
                let _ = w.file.unlock();
                w.held = false;
                return Err(e);
            }
        }
        self.shared.leases.fetch_add(1, Ordering::AcqRel);
        Ok(Lease(Some(self.shared.clone())))
    }

    /// With the lock just taken: reloads if another process held it last, and marks it ours.
    fn catch_up(&self, w: &Writer) -> Result<(), Error> {
        if w.foreign()? {
            self.reload()?;
            w.mark()?;
        }
        Ok(())
    }

    /// Replaces the records with the newest ones on disk and forgets what was known of the files
    /// (the other process changed their sizes and which one is newest).
    fn reload(&self) -> Result<(), Error> {
        let mut slots = self.shared.slots.lock().expect("checkpoint slots");
        let mut read = read_files(&slots.paths)
            .map_err(|(p, e)| Error::io("reloading the checkpoint", p, e))?;
        let Some((i, data)) = take_newest(&mut read) else {
            return Ok(());
        };
        let mut s = self.shared.state.lock().expect("checkpoint lock");
        s.data.claims = data.claims;
        s.data.seq = data.seq;
        s.data.unknown = data.unknown;
        s.files.clear();
        slots.newest = Some(i);
        slots.files = [None, None];
        Ok(())
    }
}

#[cfg(test)]
mod tests;
