//! Command-line flags (each with an environment fallback, for DaemonSet manifests).
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use gpu_dra_api::slices::ConsumableShares;

#[derive(Parser, Debug)]
#[command(
    name = "dra-plugin",
    version,
    about = "Kubelet DRA plugin for NVIDIA GPUs (driver gpu.nvidia.com)"
)]
pub struct Cli {
    #[command(flatten)]
    pub log: gpu_dra_log::LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
// Parsed once at start and moved out right away: boxing the big variant would save nothing.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Serve the kubelet (registration + DRA sockets) and publish this node's ResourceSlices.
    Run(RunArgs),
    /// Print the ResourceSlices this node would publish, without a cluster.
    Slices(SlicesArgs),
    /// In a ComputeDomain's daemon pod: run NVIDIA's IMEX daemon (`run`) or probe it (`check`).
    ImexDaemon(crate::computedomain::imexd::ImexDaemonArgs),
    /// Write a mock NVIDIA driver root (mock libnvidia-ml from hardware profiles) for
    /// `--backend nvml` without a GPU; for tests (see backend/nvml_mock_root.rs).
    #[command(hide = true)]
    MockNvmlRoot(MockRootArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// Real GPUs through libnvidia-ml.
    Nvml,
    /// GPUs built from hardware profiles (--profile / --hardware-file).
    Simulated,
}

/// The GPUs of a simulated node, or of the NVML mock built to match one.
#[derive(Args, Debug, Clone, Default)]
pub struct HardwareArgs {
    /// Simulated GPUs as `<profile>[:count]`, e.g. `h100-80gb:8`; repeat for mixed nodes.
    #[arg(long = "profile", env = "SIMULATED_PROFILES", value_delimiter = ',')]
    pub profiles: Vec<String>,
    /// Simulated hardware from a YAML file (`gpus: [{profile, count, migLayout}]`).
    #[arg(long, env = "SIMULATED_HARDWARE_FILE", conflicts_with = "profiles")]
    pub hardware_file: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Name of this node: the pool name and spec.nodeName of the published slices.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// DRA driver name.
    #[arg(long, env = "DRIVER_NAME", default_value = gpu_dra_api::names::GPU_DRIVER)]
    pub driver_name: String,
    /// Feature gates, NVIDIA's names: `DynamicMIG=true,MPSSupport=false`.
    #[arg(long, env = "FEATURE_GATES", default_value = "")]
    pub feature_gates: String,
    /// Where GPUs come from.
    #[arg(long, env = "DEVICE_BACKEND", value_enum, default_value = "nvml")]
    pub backend: Backend,
    #[command(flatten)]
    pub hardware: HardwareArgs,
    /// Static MIG layout of simulated GPUs: `disabled`, `all-<profile>` (e.g. `all-1g.10gb`),
    /// `all-balanced`, or an explicit list such as `3g.40gb,2g.20gb,1g.10gb`. Ignored with DynamicMIG;
    /// with --on-demand-mig the layout before the first change.
    #[arg(long, env = "SIMULATED_MIG_LAYOUT")]
    pub mig_layout: Option<String>,
    /// Root of the NVIDIA driver installation (e.g. `/run/nvidia/driver` for operator-managed drivers).
    #[arg(long, env = "NVIDIA_DRIVER_ROOT")]
    pub driver_root: Option<PathBuf>,
    #[command(flatten)]
    pub host: HostRoots,
    /// Consumable shares, with the ConsumableShares gate: `disabled`, `memory`, `unlimited`, or a
    /// positive number of shares per device (NVIDIA's flag, variable and values).
    #[arg(long, env = "CONSUMABLE_SHARES", default_value = "disabled")]
    pub consumable_shares: ConsumableShares,
    /// On-demand MIG: publish the GPUs and MIG devices that exist (as static MIG does) and create
    /// or destroy MIG devices as this node's MigLayout object asks. Not with DynamicMIG.
    #[arg(long, env = "ON_DEMAND_MIG")]
    pub on_demand_mig: bool,
}

impl DeviceArgs {
    /// Refuses modes that cannot be combined: both decide where MIG devices come from.
    pub fn check_mig_mode(&self, gates: &gpu_dra_api::gates::FeatureGates) -> Result<(), String> {
        if self.on_demand_mig && gates.dynamic_mig() {
            return Err(
                "--on-demand-mig (ON_DEMAND_MIG) and the DynamicMIG feature gate cannot \
                 both be on: pick one way of making MIG devices"
                    .into(),
            );
        }
        Ok(())
    }
}

/// The host's sysfs and device nodes, for a container that mounts them elsewhere.
#[derive(Args, Debug, Clone)]
pub struct HostRoots {
    /// The host's sysfs: each GPU's PCIe root and NUMA node (NVML backend), and with
    /// PassthroughSupport the PCI bus where GPUs are bound to vfio-pci.
    #[arg(
        long = "host-sysfs-root",
        env = "HOST_SYSFS_ROOT",
        value_name = "DIR",
        default_value = "/sys"
    )]
    pub sysfs: PathBuf,
    /// The host's /dev: with PassthroughSupport, whether `/dev/iommu` (iommufd) exists.
    #[arg(
        long = "host-dev-root",
        env = "HOST_DEV_ROOT",
        value_name = "DIR",
        default_value = "/dev"
    )]
    pub dev: PathBuf,
}

impl Default for HostRoots {
    fn default() -> Self {
        HostRoots {
            sysfs: PathBuf::from("/sys"),
            dev: PathBuf::from("/dev"),
        }
    }
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Kubeconfig; in-cluster configuration when unset.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Directory the kubelet watches for plugin registration sockets.
    #[arg(
        long,
        env = "REGISTRAR_DIR",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    pub registrar_dir: PathBuf,
    /// The plugin's own directory: DRA socket and checkpoint.
    #[arg(
        long,
        env = "PLUGIN_DIR",
        default_value = "/var/lib/kubelet/plugins/gpu.nvidia.com"
    )]
    pub plugin_dir: PathBuf,
    /// Where per-claim CDI specs are written.
    #[arg(long, env = "CDI_ROOT", default_value = "/var/run/cdi")]
    pub cdi_root: PathBuf,
    /// Prometheus metrics and `/healthz` port on all interfaces; 0 disables. Unset with no
    /// `--http-endpoint`: 8080. See [`RunArgs::metrics_endpoint`].
    #[arg(long, env = "METRICS_PORT")]
    pub metrics_port: Option<u16>,
    /// NVIDIA's flag: the metrics server's `host:port` (`:8080` for all interfaces); empty
    /// turns it off.
    #[arg(long, env = "HTTP_ENDPOINT")]
    pub http_endpoint: Option<String>,
    /// NVIDIA's flag: where the metrics are served; empty turns the server off.
    #[arg(long, env = "METRICS_PATH", default_value = "/metrics")]
    pub metrics_path: String,
    /// gRPC health (service `liveness`) port; 0 disables.
    #[arg(long, env = "HEALTHCHECK_PORT", default_value_t = 51516)]
    pub healthcheck_port: u16,
    /// Offline mode: read ResourceClaims from `<dir>/<namespace>_<name>.json|yaml` instead of
    /// the API server, and publish nothing. For trying the plugin by hand and for benchmarks.
    #[arg(long, env = "OFFLINE_CLAIMS_DIR")]
    pub offline_claims_dir: Option<PathBuf>,
    /// File holding the kernel boot ID (tests point this elsewhere).
    #[arg(long, default_value = "/proc/sys/kernel/random/boot_id")]
    pub boot_id_file: PathBuf,
    /// With NVMLDeviceHealthCheck: how long a GPU must stay fault-free, after reporting healthy
    /// again, before its taints are lifted.
    #[arg(long, env = "HEALTH_HOLD_DOWN_SECONDS", default_value_t = 300)]
    pub health_hold_down_seconds: u64,
    /// Async worker threads. Checkpoint and CDI writes, NVML and MIG calls run on a separate
    /// blocking pool, so the workers only decode, plan and hand off; two let a burst of calls
    /// use two cores.
    #[arg(long, env = "WORKER_THREADS", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub worker_threads: u16,
    /// Write each prepared claim's `status.devices` (KEP-4817) and clear it at unprepare: two
    /// server-side applies per claim. `false` writes nothing, as NVIDIA's plugin.
    #[arg(long, env = "CLAIM_DEVICE_STATUS", default_value_t = true, action = clap::ArgAction::Set)]
    pub claim_device_status: bool,
    /// Rolling upgrades (kubelet 1.33+): this pod's UID, from the downward API. Names the
    /// sockets per pod so that the old and the new pod serve side by side, and shares the
    /// checkpoint between them through a lock. Empty: the fixed socket names.
    #[arg(long, env = "POD_UID")]
    pub rolling_update_uid: Option<String>,
    /// NVIDIA's flag: DNS names in an IMEX daemon's nodes config (compute-domain driver with
    /// IMEXDaemonsWithDNSNames), i.e. the most nodes one clique of a ComputeDomain can have.
    #[arg(long, env = "MAX_NODES_PER_IMEX_DOMAIN", default_value_t = gpu_dra_api::cdclique::DEFAULT_MAX_NODES_PER_IMEX_DOMAIN)]
    pub max_nodes_per_imex_domain: u32,
}

/// Our port when neither `METRICS_PORT` nor `HTTP_ENDPOINT` is set.
pub const DEFAULT_METRICS_PORT: u16 = 8080;

impl RunArgs {
    /// Where to serve metrics, if anywhere: the address and the path. `HTTP_ENDPOINT` (NVIDIA's)
    /// and `METRICS_PORT` (ours) may both be set only if they name the same port; an empty
    /// endpoint, port 0 or an empty `METRICS_PATH` turns the server off.
    pub fn metrics_endpoint(&self) -> Result<Option<(SocketAddr, String)>, String> {
        let addr = match (self.http_endpoint.as_deref(), self.metrics_port) {
            (Some(e), port) => {
                let addr = parse_endpoint(e)?;
                let same = addr.map(|a| a.port()) == port.filter(|p| *p != 0);
                if port.is_some() && !same {
                    return Err(format!(
                        "HTTP_ENDPOINT {e:?} and METRICS_PORT {} disagree; set one",
                        port.unwrap_or_default()
                    ));
                }
                addr
            }
            (None, Some(0)) => None,
            (None, port) => Some(SocketAddr::from((
                [0, 0, 0, 0],
                port.unwrap_or(DEFAULT_METRICS_PORT),
            ))),
        };
        let path = metrics_path(&self.metrics_path)?;
        Ok(addr.zip(path))
    }
}

/// Go's listen address forms: `host:port`, `:port` (all interfaces), `[v6]:port`; empty: off.
fn parse_endpoint(e: &str) -> Result<Option<SocketAddr>, String> {
    let e = e.trim();
    if e.is_empty() {
        return Ok(None);
    }
    let full = match e.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => e.to_string(),
    };
    full.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(Some)
        .ok_or_else(|| format!("HTTP_ENDPOINT {e:?} is not a host:port address"))
}

/// NVIDIA joins the path onto `/` (so `metrics` and `/metrics/` are `/metrics`); empty: off.
fn metrics_path(p: &str) -> Result<Option<String>, String> {
    if p.is_empty() {
        return Ok(None);
    }
    let parts: Vec<&str> = p
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    let path = format!("/{}", parts.join("/"));
    if path == "/healthz" || parts.contains(&"..") {
        return Err(format!("METRICS_PATH {p:?} cannot be used"));
    }
    Ok(Some(path))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Yaml,
    Json,
}

#[derive(Args, Debug)]
pub struct SlicesArgs {
    #[command(flatten)]
    pub device: DeviceArgs,
    #[arg(short = 'o', long, value_enum, default_value = "yaml")]
    pub output: Output,
    /// Kubernetes minor version of the target cluster (1.34 keeps counters with devices).
    #[arg(long, default_value = "1.37")]
    pub kubernetes_version: String,
}

/// `dra-plugin mock-nvml-root`: the hardware flags of the simulated backend, and where to write.
#[derive(Args, Debug)]
pub struct MockRootArgs {
    /// Name of the node the GPUs' identities derive from (same UUIDs as the simulated backend's).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    #[command(flatten)]
    pub hardware: HardwareArgs,
    /// Static MIG layout the mock starts with (`all-1g.10gb`, `3g.40gb,2g.20gb`, ...); none: MIG
    /// mode off, as for DynamicMIG.
    #[arg(long, env = "SIMULATED_MIG_LAYOUT")]
    pub mig_layout: Option<String>,
    /// Directory to write (created; an existing mock root there is replaced).
    #[arg(long)]
    pub out: PathBuf,
    /// A built mock libnvidia-ml.so.1 to copy instead of building one.
    #[arg(long, env = "MOCK_NVML_LIBRARY", conflicts_with = "mock_source")]
    pub library: Option<PathBuf>,
    /// The mock's sources (`make -C <dir> OUT=...`); default: the repository's `mock-nvml/`.
    #[arg(long, env = "MOCK_NVML_SOURCE")]
    pub mock_source: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(extra: &[&str]) -> Result<RunArgs, clap::Error> {
        let base = ["dra-plugin", "run", "--node-name", "n1"];
        let cli = Cli::try_parse_from(base.iter().chain(extra))?;
        match cli.command {
            Command::Run(a) => Ok(a),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn claim_device_status_defaults_to_on_and_turns_off() {
        assert!(run(&[]).unwrap().claim_device_status);
        assert!(
            !run(&["--claim-device-status", "false"])
                .unwrap()
                .claim_device_status
        );
    }

    #[test]
    fn worker_threads_default_to_two_and_reject_zero() {
        assert_eq!(run(&[]).unwrap().worker_threads, 2);
        assert_eq!(run(&["--worker-threads", "4"]).unwrap().worker_threads, 4);
        let err = run(&["--worker-threads", "0"]).unwrap_err().to_string();
        assert!(err.contains("--worker-threads"), "{err}");
    }

    #[test]
    fn host_roots_come_from_flags() {
        let a = run(&[
            "--host-sysfs-root",
            "/host/sys",
            "--host-dev-root",
            "/host/dev",
        ])
        .unwrap();
        assert_eq!(a.device.host.sysfs, PathBuf::from("/host/sys"));
        assert_eq!(a.device.host.dev, PathBuf::from("/host/dev"));
    }

    #[test]
    fn consumable_shares_take_nvidias_values_and_default_to_disabled() {
        let mode = |extra: &[&str]| run(extra).map(|a| a.device.consumable_shares);
        assert_eq!(mode(&[]).unwrap(), ConsumableShares::Disabled);
        assert_eq!(
            mode(&["--consumable-shares", "memory"]).unwrap(),
            ConsumableShares::Memory
        );
        assert_eq!(
            mode(&["--consumable-shares", "8"]).unwrap(),
            ConsumableShares::Shares(8)
        );
        let err = mode(&["--consumable-shares", "half"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("must be 'disabled', 'memory', 'unlimited', or a positive integer"),
            "{err}"
        );
    }

    #[test]
    fn on_demand_mig_defaults_off_and_refuses_dynamic_mig() {
        use gpu_dra_api::gates::FeatureGates;
        assert!(!run(&[]).unwrap().device.on_demand_mig);
        let a = run(&["--on-demand-mig"]).unwrap().device;
        assert!(a.on_demand_mig);
        a.check_mig_mode(&FeatureGates::parse("").unwrap()).unwrap();
        let e = a
            .check_mig_mode(&FeatureGates::parse("DynamicMIG=true").unwrap())
            .unwrap_err();
        assert!(
            e.contains("--on-demand-mig") && e.contains("DynamicMIG"),
            "{e}"
        );
    }

    fn endpoint(extra: &[&str]) -> Result<Option<(SocketAddr, String)>, String> {
        run(extra).unwrap().metrics_endpoint()
    }

    #[test]
    fn metrics_endpoint_takes_nvidias_flags_beside_our_port() {
        let at = |a: &str, p: &str| Ok(Some((a.parse().unwrap(), p.to_string())));
        assert_eq!(endpoint(&[]), at("0.0.0.0:8080", "/metrics"));
        assert_eq!(
            endpoint(&["--metrics-port", "9000"]),
            at("0.0.0.0:9000", "/metrics")
        );
        assert_eq!(endpoint(&["--metrics-port", "0"]), Ok(None));
        let nvidia = ["--http-endpoint", ":8081", "--metrics-path", "prom/"];
        assert_eq!(endpoint(&nvidia), at("0.0.0.0:8081", "/prom"));
        let local = ["--http-endpoint", "127.0.0.1:7000"];
        assert_eq!(endpoint(&local), at("127.0.0.1:7000", "/metrics"));
        // NVIDIA's "off" spellings.
        assert_eq!(endpoint(&["--http-endpoint", ""]), Ok(None));
        assert_eq!(endpoint(&["--metrics-path", ""]), Ok(None));
        // Both given: they must agree.
        let same = ["--http-endpoint", ":8081", "--metrics-port", "8081"];
        assert_eq!(endpoint(&same), at("0.0.0.0:8081", "/metrics"));
        for bad in [
            &["--http-endpoint", ":8081", "--metrics-port", "8080"][..],
            &["--http-endpoint", "", "--metrics-port", "8080"],
            &["--http-endpoint", ":8081", "--metrics-port", "0"],
            &["--http-endpoint", "nonsense"],
            &["--metrics-path", "/healthz"],
        ] {
            assert!(endpoint(bad).is_err(), "{bad:?} accepted");
        }
    }
}
