//! `dra-plugin imex-daemon` as the daemon pod runs it, with shell stand-ins for NVIDIA's
//! `nvidia-imex` (records its starts and the signals it gets) and `nvidia-imex-ctl`.
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const PLUGIN: &str = env!("CARGO_BIN_EXE_dra-plugin");

/// Logs `start <pid> <config>`, `usr1` and `term` to `$IMEX_LOG`.
const FAKE_IMEX: &str = r#"#!/bin/sh
echo "start $$ $2" >> "$IMEX_LOG"
trap 'echo usr1 >> "$IMEX_LOG"' USR1
trap 'echo term >> "$IMEX_LOG"; exit 0' TERM
while :; do sleep 0.05 & wait $!; done
"#;

/// Answers what `$CTL_ANSWER` says, as `nvidia-imex-ctl -c <cfg> -q` does.
const FAKE_CTL: &str = "#!/bin/sh\n[ \"$3\" = -q ] || exit 3\nprintf '%s\\n' \"$CTL_ANSWER\"\n";

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let cfg = dra_plugin::computedomain::imexd::daemon_config();
        std::fs::write(root.join("imexd.cfg"), cfg).unwrap();
        std::fs::write(root.join("nodes.cfg"), "compute-domain-daemon-0000\n").unwrap();
        std::fs::write(root.join("hosts"), "127.0.0.1\tlocalhost\n").unwrap();
        for (name, text) in [("nvidia-imex", FAKE_IMEX), ("nvidia-imex-ctl", FAKE_CTL)] {
            let path = root.join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Fixture { _dir: dir, root }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn command(&self, sub: &str) -> Command {
        let mut cmd = Command::new(PLUGIN);
        cmd.arg("imex-daemon")
            .arg("--config")
            .arg(self.path("imexd.cfg"))
            .arg("--hosts-file")
            .arg(self.path("hosts"))
            .arg("--nodes-config")
            .arg(self.path("nodes.cfg"))
            .arg("--imex-binary")
            .arg(self.path("nvidia-imex"))
            .arg("--imex-ctl-binary")
            .arg(self.path("nvidia-imex-ctl"))
            .args(["--poll-ms", "50", "--stop-timeout-secs", "5", sub])
            .env("IMEX_LOG", self.path("log"))
            .env_remove("POD_IP")
            .env_remove("CLIQUE_ID")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    fn log(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn wait_log(&self, what: &str, want: impl Fn(&[String]) -> bool) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log();
            if want(&log) {
                return log;
            }
            assert!(Instant::now() < deadline, "{what}: log {log:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn count(log: &[String], prefix: &str) -> usize {
    log.iter().filter(|l| l.starts_with(prefix)).count()
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on a pid of a process this test started.
    let pid = libc::pid_t::try_from(pid).unwrap();
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

fn wait_exit(mut child: Child) -> Output {
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "imex-daemon run did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn write_in_place(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[test]
fn run_signals_hosts_changes_restarts_the_daemon_and_stops_it() {
    let f = Fixture::new();
    let sup = f.command("run").env("POD_IP", "10.1.2.3").spawn().unwrap();
    let log = f.wait_log("first start", |l| count(l, "start") == 1);
    let cfg = std::fs::read_to_string(f.path("imexd.cfg")).unwrap();
    assert!(
        cfg.contains("IMEX_CMD_BIND_INTERFACE_IP=10.1.2.3\n"),
        "{cfg}"
    );
    assert!(
        log[0].ends_with("imexd.cfg"),
        "started on the config: {log:?}"
    );

    // A new mapping from the plugin: one SIGUSR1, none while the file stays the same.
    write_in_place(
        &f.path("hosts"),
        "127.0.0.1\tlocalhost\n10.0.0.9\tcompute-domain-daemon-0001\n",
    );
    f.wait_log("SIGUSR1 after the hosts change", |l| count(l, "usr1") == 1);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(count(&f.log(), "usr1"), 1, "{:?}", f.log());

    // The daemon dies: started again, on the config with the pod IP again.
    let pid: u32 = log[0].split(' ').nth(1).unwrap().parse().unwrap();
    signal(pid, libc::SIGKILL);
    f.wait_log("restart", |l| count(l, "start") == 2);

    // A hosts change reaches the new daemon too.
    write_in_place(&f.path("hosts"), "127.0.0.1\tlocalhost\n");
    f.wait_log("SIGUSR1 to the restarted daemon", |l| count(l, "usr1") == 2);

    // SIGTERM to the pod's process: the daemon is stopped, then the supervisor exits cleanly.
    signal(sup.id(), libc::SIGTERM);
    let out = wait_exit(sup);
    assert!(
        out.status.success(),
        "{out:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(f.log().last().map(String::as_str), Some("term"));
}

/// `IMEXDaemonsWithDNSNames` off: no daemon until the plugin has written the peer IPs, a restart
/// on each new list (NVIDIA's daemon does the same), none for a rewrite with the same list.
#[test]
fn run_waits_for_the_ip_list_and_restarts_the_daemon_on_a_new_one() {
    let f = Fixture::new();
    write_in_place(&f.path("nodes.cfg"), "");
    let sup = f.command("run").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(400));
    assert!(f.log().is_empty(), "started without peers: {:?}", f.log());

    write_in_place(&f.path("nodes.cfg"), "10.0.0.1\n10.0.0.2\n");
    f.wait_log("start on the first list", |l| count(l, "start") == 1);
    write_in_place(&f.path("nodes.cfg"), "10.0.0.1\n10.0.0.2\n");
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(count(&f.log(), "start"), 1, "{:?}", f.log());

    write_in_place(&f.path("nodes.cfg"), "10.0.0.1\n10.0.0.3\n");
    let log = f.wait_log("restart on a new list", |l| count(l, "start") == 2);
    assert_eq!(
        log.iter()
            .map(|l| l.split(' ').next().unwrap())
            .collect::<Vec<_>>(),
        ["start", "term", "start"],
        "the old daemon stops before the new one starts"
    );
    assert_eq!(count(&log, "usr1"), 0, "{log:?}");

    signal(sup.id(), libc::SIGTERM);
    let out = wait_exit(sup);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(f.log().last().map(String::as_str), Some("term"));
}

#[test]
fn run_without_the_daemon_binary_says_what_is_missing() {
    let f = Fixture::new();
    std::fs::remove_file(f.path("nvidia-imex")).unwrap();
    let out = f.command("run").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("nvidia-imex") && err.contains("IMEX_BINARY"),
        "{err}"
    );
}

#[test]
fn check_passes_only_on_ready() {
    let f = Fixture::new();
    let ok = f
        .command("check")
        .env("CTL_ANSWER", "READY")
        .output()
        .unwrap();
    assert!(ok.status.success(), "{ok:?}");

    let starting = f
        .command("check")
        .env("CTL_ANSWER", "NOT READY")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&starting.stderr);
    assert!(!starting.status.success());
    assert!(
        err.contains("not ready") && err.contains("NOT READY"),
        "{err}"
    );

    std::fs::remove_file(f.path("imexd.cfg")).unwrap();
    let no_cfg = f
        .command("check")
        .env("CTL_ANSWER", "READY")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&no_cfg.stderr);
    assert!(!no_cfg.status.success());
    assert!(err.contains("imexd.cfg"), "{err}");
}

#[test]
fn without_a_clique_nothing_starts_and_the_check_passes() {
    let f = Fixture::new();
    let sup = f.command("run").env("CLIQUE_ID", "").spawn().unwrap();
    let check = f
        .command("check")
        .env("CLIQUE_ID", "")
        .env("CTL_ANSWER", "NOT READY")
        .output()
        .unwrap();
    assert!(check.status.success(), "{check:?}");
    std::thread::sleep(Duration::from_millis(500));
    assert!(f.log().is_empty(), "IMEX started: {:?}", f.log());
    signal(sup.id(), libc::SIGTERM);
    let out = wait_exit(sup);
    assert!(out.status.success(), "{out:?}");
    assert!(f.log().is_empty(), "IMEX started: {:?}", f.log());
}
