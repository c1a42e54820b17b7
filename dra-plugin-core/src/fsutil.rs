//! Crash-safe file replacement: a reader sees the old file or the new one, never a torn one.
use std::fs::{self, File};
use std::io::Write;
use std::path::Path;
use std::sync::OnceLock;

/// Writes `data` to `path` via a temp file in the same directory, fsyncs it and renames it over
/// the target: readers see the old file or the new one, never a torn one. A missing directory
/// is created (someone may have wiped `/var/run/cdi`).
///
/// The directory is not fsynced: losing the rename itself takes a power loss or kernel crash, that
/// is a reboot, after which the plugin discards prepared state anyway (boot ID), while a journal
/// commit per directory fsync would double the cost of every prepare.
pub fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    replace_via_temp(path, data, true)
}

/// Like [`write_atomic`] without the fsync, for files the plugin derives from its checkpoint
/// (CDI specs): a process crash keeps the write in the page cache, and only a reboot can lose it,
/// after which the plugin drops that boot's claims and their files. The CDI library NVIDIA's and
/// the example driver write their specs with does the same.
pub fn replace_unsynced(path: &Path, data: &[u8]) -> std::io::Result<()> {
    replace_via_temp(path, data, false)
}

fn replace_via_temp(path: &Path, data: &[u8], sync: bool) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", pid()));
    {
        let mut f = match File::create(&tmp) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::create_dir_all(dir)?;
                File::create(&tmp)?
            }
            other => other?,
        };
        f.write_all(data)?;
        if sync {
            f.sync_all()?;
        }
    }
    fs::rename(&tmp, path).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// This process's ID, asked of the kernel once: glibc does not cache getpid, and a busy node's
/// prepares name a temp file each.
fn pid() -> u32 {
    static PID: OnceLock<u32> = OnceLock::new();
    *PID.get_or_init(std::process::id)
}

/// Removes a file; a missing file is not an error (idempotent cleanup).
pub fn remove_if_exists(path: &Path) -> std::io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
