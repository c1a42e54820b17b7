//! `dra-plugin imex-daemon`: what runs in a ComputeDomain's daemon pod, in the place of NVIDIA's
//! `compute-domain-daemon`. `run` keeps `nvidia-imex` running in the foreground on the config the
//! plugin wrote, restarts it when it dies, and sends it SIGUSR1 when the mounted hosts file changes
//! (NVIDIA's daemon re-resolves its peers' DNS names on that signal). With
//! `IMEXDaemonsWithDNSNames` off, the nodes config lists peer IPs instead: `run` starts the daemon
//! once the plugin has written that list and restarts it on a new one, as NVIDIA's daemon does.
//! `check` is the pod's probe:
//! `nvidia-imex-ctl -q` must answer `READY`. On a node without an NVLink clique (`CLIQUE_ID` set
//! empty by the plugin) there is no IMEX domain to join: both do nothing, as NVIDIA's.
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing::{info, warn};

/// The settings NVIDIA's daemon config template sets: foreground, log to stdout, command service
/// on port 50005 (which `nvidia-imex-ctl -q` asks), wait for quorum only in recovery.
const SETTINGS: &str = "LOG_LEVEL=4\nLOG_FILE_NAME=\n\
    STATS_FILE_NAME=/var/log/nvidia-imex-stats.log\nLOG_APPEND_TO_LOG=0\nLOG_FILE_MAX_SIZE=1024\n\
    LOG_MAX_ROTATE_COUNT=10\nLOG_USE_SYSLOG=0\nDAEMONIZE=0\nBIND_INTERFACE_IP=\nSERVER_PORT=50000\n\
    NETWORK_INTERFACE=\nIMEX_WAIT_FOR_QUORUM=RECOVERY\nIMEX_ENABLE_AUTH_ENCRYPTION=0\n\
    IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS\nIMEX_AUTH_SOURCE=\nIMEX_SERVER_KEY=\nIMEX_SERVER_CERT=\n\
    IMEX_SERVER_CERT_AUTH=\nIMEX_CLIENT_KEY=\nIMEX_CLIENT_CERT=\nIMEX_CLIENT_CERT_AUTH=\n\
    IMEX_SECURITY_TARGET_OVERRIDE=\nIMEX_GSS_SERVICE_NAME=host\nIMEX_GSS_TIMEOUT_SEC=30\n\
    IMEX_GSS_RETRY_INTERVAL_SEC=5\nIMEX_GSS_SEC_CONTEXT_LIFETIME_SEC=-1\n\
    IMEX_GSS_SHUTDOWN_ON_FAILURE=0\nIMEX_CMD_ENABLED=1\nIMEX_CMD_PORT=50005\n\
    IMEX_CMD_UNIX_DOMAIN_PATH=\nIMEX_NODE_DISCONNECTED_GRACE_TIME=-1\n";

const BIND_KEY: &str = "IMEX_CMD_BIND_INTERFACE_IP=";

/// Where the daemon container finds its nodes config (the plugin's domain directory is mounted at
/// `/imexd`).
pub const NODES_CONFIG: &str = "/imexd/nodes.cfg";

/// The daemon's `imexd.cfg` as the plugin writes it: the command service's address is left empty
/// for `run` to fill with the pod IP, which only the pod knows.
pub fn daemon_config() -> String {
    let mut cfg = String::from(SETTINGS);
    cfg.push_str(&format!("IMEX_NODE_CONFIG_FILE={NODES_CONFIG}\n"));
    cfg.push_str(BIND_KEY);
    cfg.push('\n');
    cfg
}

/// `cfg` with the command service bound to `ip` (the line added when missing).
pub fn with_bind_ip(cfg: &str, ip: &str) -> String {
    let mut out = String::with_capacity(cfg.len() + ip.len());
    let mut found = false;
    for line in cfg.lines() {
        if line.starts_with(BIND_KEY) {
            found = true;
            out.push_str(&format!("{BIND_KEY}{ip}\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !found {
        out.push_str(&format!("{BIND_KEY}{ip}\n"));
    }
    out
}

#[derive(clap::Args, Debug, Clone)]
pub struct ImexDaemonArgs {
    /// The IMEX daemon config the compute-domain plugin writes.
    #[arg(long, default_value = "/imexd/imexd.cfg")]
    pub config: PathBuf,
    /// The hosts file the plugin keeps (DNS-name mode); a change is signalled to the daemon.
    #[arg(long, default_value = "/etc/hosts")]
    pub hosts_file: PathBuf,
    /// The nodes config the plugin writes; the daemon starts once it lists a node and restarts
    /// when it changes (an IP list, with `IMEXDaemonsWithDNSNames` off).
    #[arg(long, default_value = NODES_CONFIG)]
    pub nodes_config: PathBuf,
    /// The IMEX daemon binary, looked up in PATH.
    #[arg(long, env = "IMEX_BINARY", default_value = "nvidia-imex")]
    pub imex_binary: String,
    /// The IMEX control binary the check runs.
    #[arg(long, env = "IMEX_CTL_BINARY", default_value = "nvidia-imex-ctl")]
    pub imex_ctl_binary: String,
    /// This pod's IP: the command service binds to it.
    #[arg(long, env = "POD_IP")]
    pub pod_ip: Option<String>,
    /// The node's NVLink clique, from the plugin's CDI spec; empty: no IMEX daemon on this node.
    #[arg(long, env = "CLIQUE_ID")]
    pub clique_id: Option<String>,
    /// How often `run` reads the hosts file and the nodes config.
    #[arg(long, default_value_t = 1000, hide = true)]
    pub poll_ms: u64,
    /// How long `run` waits for the daemon after SIGTERM before killing it.
    #[arg(long, default_value_t = 10)]
    pub stop_timeout_secs: u64,
    #[command(subcommand)]
    pub command: ImexDaemonCommand,
}

#[derive(clap::Subcommand, Debug, Clone, Copy)]
pub enum ImexDaemonCommand {
    /// Run the IMEX daemon in the foreground; restart it when it dies, signal it on hosts changes.
    Run,
    /// Probe: succeed when `nvidia-imex-ctl -q` answers READY.
    Check,
}

pub async fn main(args: ImexDaemonArgs) -> Result<()> {
    let no_clique = args.clique_id.as_deref() == Some("");
    match args.command {
        ImexDaemonCommand::Run if no_clique => idle().await,
        ImexDaemonCommand::Check if no_clique => {
            println!("no NVLink clique on this node: no IMEX daemon to check");
            Ok(())
        }
        ImexDaemonCommand::Run => run(&args).await,
        ImexDaemonCommand::Check => check(&args).await,
    }
}

/// SIGTERM (the kubelet stopping the pod) or SIGINT.
struct StopSignals {
    term: Signal,
    int: Signal,
}

impl StopSignals {
    fn install() -> Result<StopSignals> {
        Ok(StopSignals {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    /// Cancel-safe, as each `recv` is.
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// Without a clique the pod stays up (its claim keeps the domain's node count) until stopped.
async fn idle() -> Result<()> {
    info!("no NVLink clique on this node (CLIQUE_ID is empty): not starting the IMEX daemon");
    StopSignals::install()?.recv().await;
    Ok(())
}

async fn check(args: &ImexDaemonArgs) -> Result<()> {
    ensure_config(&args.config)?;
    let query = Command::new(&args.imex_ctl_binary)
        .arg("-c")
        .arg(&args.config)
        .arg("-q")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(10), query)
        .await
        .with_context(|| format!("{} -q did not answer within 10 s", args.imex_ctl_binary))?
        .with_context(|| format!("running {}", args.imex_ctl_binary))?;
    let mut answer = String::from_utf8_lossy(&out.stdout).into_owned();
    answer.push_str(&String::from_utf8_lossy(&out.stderr));
    if !out.status.success() || answer != "READY\n" {
        bail!(
            "IMEX daemon not ready ({}): {}",
            out.status,
            answer.trim_end()
        );
    }
    println!("IMEX daemon ready");
    Ok(())
}

fn ensure_config(path: &Path) -> Result<()> {
    if !path.is_file() {
        bail!(
            "{}: no IMEX daemon config; it is written when the compute-domain plugin prepares \
             this pod's daemon claim",
            path.display()
        );
    }
    Ok(())
}

/// Fills in the pod IP (when known) before each start, as a restarted plugin rewrites the file.
fn render_config(args: &ImexDaemonArgs) -> Result<()> {
    ensure_config(&args.config)?;
    let Some(ip) = args.pod_ip.as_deref().filter(|ip| !ip.is_empty()) else {
        return Ok(());
    };
    let cfg = std::fs::read_to_string(&args.config)
        .with_context(|| format!("reading {}", args.config.display()))?;
    let rendered = with_bind_ip(&cfg, ip);
    if rendered != cfg {
        dra_plugin_core::fsutil::write_atomic(&args.config, rendered.as_bytes())
            .with_context(|| format!("writing {}", args.config.display()))?;
    }
    Ok(())
}

fn spawn(args: &ImexDaemonArgs) -> Result<Child> {
    render_config(args)?;
    let child = Command::new(&args.imex_binary)
        .arg("-c")
        .arg(&args.config)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| {
            format!(
                "starting {} (is NVIDIA's IMEX daemon in the image or injected from the driver \
                 root? IMEX_BINARY names another path)",
                args.imex_binary
            )
        })?;
    info!(pid = child.id(), binary = %args.imex_binary, "started the IMEX daemon");
    Ok(child)
}

fn read_file(path: &Path) -> Option<Vec<u8>> {
    std::fs::read(path).ok()
}

/// A file once two reads 100 ms apart agree: the plugin rewrites the hosts file in place, so a
/// read can see it half written.
async fn settled(path: &Path) -> Option<Vec<u8>> {
    let mut last = read_file(path);
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = read_file(path);
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

fn send(child: &Child, signal: libc::c_int) {
    if let Some(pid) = child.id().and_then(|id| libc::pid_t::try_from(id).ok()) {
        // SAFETY: kill(2) on our own child's pid, which stays reserved until we reap it.
        if unsafe { libc::kill(pid, signal) } != 0 {
            warn!(pid, signal, error = %std::io::Error::last_os_error(), "signalling the IMEX daemon");
        }
    }
}

/// Restart delay after the daemon died: doubling from 1 s to 30 s, from 1 s again after a run
/// of a minute or more.
fn next_delay(previous: Duration, ran_for: Duration) -> Duration {
    if ran_for >= Duration::from_secs(60) {
        Duration::from_secs(1)
    } else {
        (previous * 2).clamp(Duration::from_secs(1), Duration::from_secs(30))
    }
}

/// Whether a nodes config lists a node: until the plugin has written the IP list, there is no
/// domain to join yet.
fn lists_nodes(nodes: Option<&[u8]>) -> bool {
    nodes.is_some_and(|n| n.iter().any(|b| !b.is_ascii_whitespace()))
}

/// The daemon once the nodes config lists a node, else none.
fn start_if_listed(args: &ImexDaemonArgs, nodes: Option<&[u8]>) -> Result<Option<Child>> {
    if lists_nodes(nodes) {
        return spawn(args).map(Some);
    }
    info!(nodes_config = %args.nodes_config.display(), "waiting for the nodes config: written once the domain lists all its nodes");
    Ok(None)
}

/// Resolves when the daemon exits; never without one.
async fn exited(child: &mut Option<Child>) -> std::io::Result<std::process::ExitStatus> {
    match child {
        Some(c) => c.wait().await,
        None => std::future::pending().await,
    }
}

async fn run(args: &ImexDaemonArgs) -> Result<()> {
    let mut stop_signal = StopSignals::install()?;
    let mut poll = tokio::time::interval(Duration::from_millis(args.poll_ms.max(10)));
    let mut nodes = read_file(&args.nodes_config);
    let mut child = start_if_listed(args, nodes.as_deref())?;
    let mut started = Instant::now();
    let mut hosts = read_file(&args.hosts_file);
    let mut delay = Duration::ZERO;
    loop {
        tokio::select! {
            status = exited(&mut child) => {
                let status = status.context("waiting for the IMEX daemon")?;
                delay = next_delay(delay, started.elapsed());
                warn!(%status, restart_in = ?delay, "the IMEX daemon exited");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stop_signal.recv() => return Ok(()),
                }
                child = start_if_listed(args, nodes.as_deref())?;
                started = Instant::now();
                hosts = read_file(&args.hosts_file);
            }
            _ = poll.tick() => {
                if read_file(&args.nodes_config) != nodes {
                    // A new peer list (IP mode): NVIDIA's daemon restarts IMEX on it.
                    nodes = settled(&args.nodes_config).await;
                    info!(nodes_config = %args.nodes_config.display(), "nodes config changed: restarting the IMEX daemon");
                    if let Some(c) = child.take() {
                        stop(c, args).await?;
                    }
                    child = start_if_listed(args, nodes.as_deref())?;
                    started = Instant::now();
                    hosts = read_file(&args.hosts_file);
                    continue;
                }
                if read_file(&args.hosts_file) == hosts {
                    continue;
                }
                hosts = settled(&args.hosts_file).await;
                if let Some(c) = &child {
                    info!(file = %args.hosts_file.display(), "hosts changed: SIGUSR1 to the IMEX daemon");
                    send(c, libc::SIGUSR1);
                }
            }
            _ = stop_signal.recv() => {
                return match child {
                    Some(c) => stop(c, args).await,
                    None => Ok(()),
                };
            }
        }
    }
}

async fn stop(mut child: Child, args: &ImexDaemonArgs) -> Result<()> {
    info!("stopping the IMEX daemon");
    send(&child, libc::SIGTERM);
    let grace = Duration::from_secs(args.stop_timeout_secs);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => info!(status = %status.context("waiting for the IMEX daemon")?, "stopped"),
        Err(_) => {
            warn!(?grace, "the IMEX daemon ignored SIGTERM: killing it");
            child.kill().await.context("killing the IMEX daemon")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bind_address_is_filled_in_once() {
        let cfg = daemon_config();
        assert!(cfg.contains("DAEMONIZE=0\n") && cfg.contains("IMEX_CMD_PORT=50005\n"));
        assert!(cfg.contains("IMEX_NODE_CONFIG_FILE=/imexd/nodes.cfg\n"));
        let bound = with_bind_ip(&cfg, "10.0.0.7");
        assert_eq!(bound.matches(BIND_KEY).count(), 1);
        assert!(bound.contains("IMEX_CMD_BIND_INTERFACE_IP=10.0.0.7\n"));
        assert_eq!(with_bind_ip(&bound, "10.0.0.7"), bound);
        let added = with_bind_ip("SERVER_PORT=50000\n", "10.0.0.8");
        assert_eq!(
            added,
            "SERVER_PORT=50000\nIMEX_CMD_BIND_INTERFACE_IP=10.0.0.8\n"
        );
    }

    #[test]
    fn restarts_back_off_and_recover() {
        let s = Duration::from_secs;
        assert_eq!(next_delay(Duration::ZERO, s(0)), s(1));
        assert_eq!(next_delay(s(1), s(0)), s(2));
        assert_eq!(next_delay(s(16), s(5)), s(30));
        assert_eq!(next_delay(s(30), s(5)), s(30));
        assert_eq!(next_delay(s(30), s(61)), s(1));
    }
}
