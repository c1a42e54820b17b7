//! Starting, finding and stopping per-claim MPS control daemons.
//!
//! Both real runners start a daemon that detaches (`-d`), so the daemon is never the plugin's
//! child: it is found by its pipe directory in its environment (`/proc/<pid>/environ`) and
//! identified by pid plus start time (so a reused pid is never mistaken for it). That same lookup
//! lets a restarted plugin re-adopt the daemons of its prepared claims.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::mps::MpsDaemon;
use crate::Error;

/// A running daemon: its pid and the kernel's start time of that pid (clock ticks since boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonHandle {
    pub pid: u32,
    pub start_time: u64,
}

/// Runs MPS control daemons. Blocking; async callers use the blocking pool.
pub trait ProcessRunner: Send + Sync + 'static {
    /// For logs.
    fn name(&self) -> &'static str;

    /// Starts the daemon for `daemon` (its directories exist) and returns once it accepts clients.
    fn start(&self, daemon: &MpsDaemon) -> Result<DaemonHandle, Error>;

    /// The running daemon serving `daemon`'s pipe directory, if any.
    fn find(&self, daemon: &MpsDaemon) -> Option<DaemonHandle>;

    /// Whether the process `handle` names still runs.
    fn is_running(&self, handle: &DaemonHandle) -> bool {
        proc_start_time(handle.pid) == Some(handle.start_time)
    }

    /// Stops the daemon (absent is fine) and returns once it is gone.
    fn stop(&self, daemon: &MpsDaemon, handle: Option<&DaemonHandle>) -> Result<(), Error>;
}

/// How long a daemon may take to come up or to go.
const STARTUP: Duration = Duration::from_secs(10);
const SHUTDOWN: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);

/// Start time of a live (not zombie) process, from `/proc/<pid>/stat`.
pub fn proc_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ...`: comm may hold spaces and parentheses; fields follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state); start time is field 22.
    if matches!(fields.first(), Some(&"Z") | Some(&"X") | None) {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Processes whose environment sets `CUDA_MPS_PIPE_DIRECTORY` to `pipe_dir` and whose command
/// line `is_daemon` accepts.
fn find_by_pipe_dir(
    pipe_dir: &Path,
    is_daemon: impl Fn(&[String]) -> bool,
) -> Option<DaemonHandle> {
    let wanted = format!("CUDA_MPS_PIPE_DIRECTORY={}", pipe_dir.display());
    let entries = std::fs::read_dir("/proc").ok()?;
    let mut found: Vec<DaemonHandle> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|b| *b == 0).any(|kv| kv == wanted.as_bytes()))
                .unwrap_or(false)
        })
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            is_daemon(&args)
        })
        .filter_map(|pid| {
            Some(DaemonHandle {
                pid,
                start_time: proc_start_time(pid)?,
            })
        })
        .collect();
    // The oldest one is the daemon (a server it started inherits its environment).
    found.sort_by_key(|h| (h.start_time, h.pid));
    found.into_iter().next()
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) -> Result<(), Error> {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() >= deadline {
            return Err(Error::Device(format!(
                "timed out after {timeout:?} waiting for {what}"
            )));
        }
        std::thread::sleep(POLL);
    }
    Ok(())
}

/// Runs a launcher that detaches the daemon, waits for the control pipe and finds the daemon.
fn launch(
    mut cmd: Command,
    daemon: &MpsDaemon,
    find: impl Fn() -> Option<DaemonHandle>,
) -> Result<DaemonHandle, Error> {
    let out = cmd
        .envs(daemon.daemon_env())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| Error::Device(format!("starting the MPS control daemon: {e}")))?;
    if !out.status.success() {
        return Err(Error::Device(format!(
            "the MPS control daemon for claim {} did not start ({}): {}",
            daemon.claim_uid,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let mut handle = None;
    wait_for(
        &format!("the MPS control pipe {}", daemon.control_path().display()),
        STARTUP,
        || {
            handle = daemon.control_path().exists().then(&find).flatten();
            handle.is_some()
        },
    )?;
    Ok(handle.expect("set when the wait succeeds"))
}

/// Waits for `handle` to go after it was asked to quit; kills it if it does not.
fn wait_gone(runner: &dyn ProcessRunner, handle: &DaemonHandle) -> Result<(), Error> {
    if wait_for("the MPS control daemon to exit", SHUTDOWN, || {
        !runner.is_running(handle)
    })
    .is_ok()
    {
        return Ok(());
    }
    let _ = Command::new("kill")
        .args(["-KILL", &handle.pid.to_string()])
        .status();
    wait_for("the MPS control daemon to die", SHUTDOWN, || {
        !runner.is_running(handle)
    })
}

/// The real daemon: `<driver root>/usr/bin/nvidia-cuda-mps-control -d` (NVML nodes).
pub struct MpsControlRunner {
    driver_root: PathBuf,
}

impl MpsControlRunner {
    pub fn new(driver_root: impl Into<PathBuf>) -> Self {
        MpsControlRunner {
            driver_root: driver_root.into(),
        }
    }

    fn binary(&self) -> PathBuf {
        self.driver_root.join("usr/bin/nvidia-cuda-mps-control")
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(self.binary());
        if self.driver_root != Path::new("/") {
            // The daemon loads libcuda from the driver installation, not from the plugin image.
            let libs = [
                "usr/lib64",
                "usr/lib/x86_64-linux-gnu",
                "usr/lib/aarch64-linux-gnu",
            ]
            .map(|l| self.driver_root.join(l).display().to_string())
            .join(":");
            cmd.env("LD_LIBRARY_PATH", libs);
        }
        cmd
    }

    fn is_daemon(args: &[String]) -> bool {
        args.first()
            .is_some_and(|a| a.ends_with("nvidia-cuda-mps-control"))
    }
}

impl ProcessRunner for MpsControlRunner {
    fn name(&self) -> &'static str {
        "nvidia-cuda-mps-control"
    }

    fn start(&self, daemon: &MpsDaemon) -> Result<DaemonHandle, Error> {
        let mut cmd = self.command();
        cmd.arg("-d");
        if daemon.multi_user {
            cmd.arg("-M");
        }
        launch(cmd, daemon, || self.find(daemon))
    }

    fn find(&self, daemon: &MpsDaemon) -> Option<DaemonHandle> {
        find_by_pipe_dir(&daemon.pipe_dir(), Self::is_daemon)
    }

    fn stop(&self, daemon: &MpsDaemon, handle: Option<&DaemonHandle>) -> Result<(), Error> {
        let Some(handle) = handle.copied().or_else(|| self.find(daemon)) else {
            return Ok(());
        };
        if !self.is_running(&handle) {
            return Ok(());
        }
        // `quit` through the control pipe: the daemon stops its servers and exits.
        let child = self
            .command()
            .env(
                "CUDA_MPS_PIPE_DIRECTORY",
                daemon.pipe_dir().display().to_string(),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        if let Ok(mut child) = child {
            if let Some(mut stdin) = child.stdin.take() {
                use std::io::Write;
                let _ = stdin.write_all(b"quit\n");
            }
            let _ = child.wait();
        }
        wait_gone(self, &handle)
    }
}

/// A stand-in for simulated GPUs: a shell loop that creates the control "pipe" (a plain file),
/// logs a line, and runs until the file goes. `quit` is removing the file. It detaches like
/// `nvidia-cuda-mps-control -d`, so the supervision path is the one real nodes use.
pub struct StandInRunner;

/// The stand-in's `$0`, which tells it apart from other shells with the same environment.
pub const STAND_IN_NAME: &str = "dra-plugin-mps-stand-in";

const STAND_IN_SCRIPT: &str = r#"
pipe="$CUDA_MPS_PIPE_DIRECTORY"
echo "stand-in MPS control daemon $$ for $CUDA_VISIBLE_DEVICES" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
: > "$pipe/control"
while [ -e "$pipe/control" ]; do sleep 0.2; done
echo "stand-in MPS control daemon $$ quit" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
"#;

impl ProcessRunner for StandInRunner {
    fn name(&self) -> &'static str {
        STAND_IN_NAME
    }

    fn start(&self, daemon: &MpsDaemon) -> Result<DaemonHandle, Error> {
        let mut cmd = Command::new("/bin/sh");
        // The outer shell detaches the inner one and exits, like `-d`.
        cmd.args([
            "-c",
            r#""$0" -c "$1" "$2" </dev/null >/dev/null 2>&1 &"#,
            "/bin/sh",
            STAND_IN_SCRIPT,
            STAND_IN_NAME,
        ]);
        launch(cmd, daemon, || self.find(daemon))
    }

    fn find(&self, daemon: &MpsDaemon) -> Option<DaemonHandle> {
        find_by_pipe_dir(&daemon.pipe_dir(), |args| {
            args.len() == 4 && args[1] == "-c" && args[3] == STAND_IN_NAME
        })
    }

    fn stop(&self, daemon: &MpsDaemon, handle: Option<&DaemonHandle>) -> Result<(), Error> {
        let handle = handle.copied().or_else(|| self.find(daemon));
        let control = daemon.control_path();
        crate::fsutil::remove_if_exists(&control)
            .map_err(|e| Error::io("removing the MPS control pipe", &control, e))?;
        match handle {
            Some(h) => wait_gone(self, &h),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
pub mod fake {
    //! A runner that starts nothing: daemons are entries in a table the test can inspect,
    //! fail or "kill".
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use super::*;

    #[derive(Default)]
    pub struct FakeRunner {
        next_pid: AtomicU32,
        /// Running daemons by pipe directory.
        pub running: Mutex<BTreeMap<PathBuf, DaemonHandle>>,
        /// Every daemon ever started, in order.
        pub started: Mutex<Vec<MpsDaemon>>,
        pub fail_start: AtomicBool,
    }

    impl FakeRunner {
        pub fn running_claims(&self) -> Vec<PathBuf> {
            self.running.lock().unwrap().keys().cloned().collect()
        }

        /// The daemon died behind the plugin's back.
        pub fn kill_all(&self) {
            self.running.lock().unwrap().clear();
        }
    }

    impl ProcessRunner for FakeRunner {
        fn name(&self) -> &'static str {
            "fake"
        }

        fn start(&self, daemon: &MpsDaemon) -> Result<DaemonHandle, Error> {
            if self.fail_start.load(Ordering::SeqCst) {
                return Err(Error::Device("the fake MPS daemon refuses to start".into()));
            }
            assert!(daemon.pipe_dir().is_dir(), "directories exist before start");
            let pid = 1000 + self.next_pid.fetch_add(1, Ordering::SeqCst);
            let h = DaemonHandle {
                pid,
                start_time: u64::from(pid) * 7,
            };
            self.running.lock().unwrap().insert(daemon.pipe_dir(), h);
            self.started.lock().unwrap().push(daemon.clone());
            Ok(h)
        }

        fn find(&self, daemon: &MpsDaemon) -> Option<DaemonHandle> {
            self.running
                .lock()
                .unwrap()
                .get(&daemon.pipe_dir())
                .copied()
        }

        fn is_running(&self, handle: &DaemonHandle) -> bool {
            self.running.lock().unwrap().values().any(|h| h == handle)
        }

        fn stop(&self, daemon: &MpsDaemon, _handle: Option<&DaemonHandle>) -> Result<(), Error> {
            self.running.lock().unwrap().remove(&daemon.pipe_dir());
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_of_this_process_is_stable_and_dead_pids_have_none() {
        let me = std::process::id();
        let t = proc_start_time(me).unwrap();
        assert_eq!(proc_start_time(me), Some(t));
        assert_eq!(proc_start_time(u32::MAX), None);
    }

    #[test]
    fn the_stand_in_comes_up_is_found_and_goes_on_quit() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = MpsDaemon {
            claim_uid: "u1".into(),
            root: MpsDaemon::root_for(&dir.path().join("mps"), "u1"),
            gpu_minors: vec![0],
            device_uuids: vec!["GPU-a".into()],
            active_thread_percentage: None,
            pinned_limits_mib: vec![],
            multi_user: false,
        };
        daemon.create_dirs().unwrap();
        let runner = StandInRunner;
        let h = runner.start(&daemon).unwrap();
        assert!(runner.is_running(&h));
        assert!(daemon.control_path().exists());
        assert_eq!(runner.find(&daemon), Some(h), "found again by its pipe dir");
        assert_ne!(h.pid, std::process::id());
        runner.stop(&daemon, None).unwrap();
        assert!(!runner.is_running(&h));
        assert_eq!(runner.find(&daemon), None);
        let log = std::fs::read_to_string(daemon.log_dir().join("control.log")).unwrap();
        assert!(log.contains("for GPU-a") && log.contains("quit"), "{log}");
        runner.stop(&daemon, Some(&h)).unwrap();
    }
}
