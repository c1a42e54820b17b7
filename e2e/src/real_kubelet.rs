//! The stock kubelet (built from `k8s.io/kubernetes` with the control plane) and a fake container
//! runtime (`e2e/kubelet-tools`, `fake-cri`) for one node. The kubelet registers its Node, runs
//! the DRA manager against our plugin and creates containers in the fake runtime, which checks
//! every CDI device against the spec files on disk as containerd does and records each
//! CreateContainer call.
use std::collections::{BTreeMap, HashMap};
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use serde::Deserialize;
use tokio::process::{Child, Command};

use crate::env::wait_until;
use crate::kubelet::{ClaimRef, PreparedDevice};

/// Where the binaries are and how to reach the cluster (from `e2e/run.sh`'s environment).
#[derive(Debug, Clone)]
pub struct KubeletSetup {
    pub kubelet_bin: PathBuf,
    pub fake_cri_bin: PathBuf,
    pub ns_script: PathBuf,
    pub kubeconfig: PathBuf,
    pub node_ip: String,
}

impl KubeletSetup {
    /// `None` when `e2e/run.sh` did not provide a kubelet (E2E_KUBELET_BIN).
    pub fn from_env(repo: &Path, kubeconfig: &Path) -> Option<KubeletSetup> {
        let kubelet_bin = PathBuf::from(std::env::var_os("E2E_KUBELET_BIN")?);
        let tools = PathBuf::from(std::env::var_os("E2E_KUBELET_TOOLS")?);
        Some(KubeletSetup {
            kubelet_bin,
            fake_cri_bin: tools.join("fake-cri"),
            ns_script: repo.join("e2e/controlplane/kubelet-ns.sh"),
            kubeconfig: kubeconfig.to_path_buf(),
            node_ip: std::env::var("E2E_NODE_IP").unwrap_or_else(|_| "192.0.2.2".into()),
        })
    }
}

/// One CreateContainer call as the fake runtime recorded it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecord {
    /// When the runtime answered (RFC 3339).
    #[serde(default)]
    pub time: String,
    #[serde(default, rename = "podUID")]
    pub pod_uid: String,
    #[serde(default)]
    pub pod_name: String,
    #[serde(default)]
    pub container: String,
    #[serde(default)]
    pub cdi_devices: Vec<String>,
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    #[serde(default)]
    pub error: String,
}

/// A node's stock kubelet and fake runtime. Both are killed when dropped.
pub struct RealKubelet {
    pub node: String,
    /// The kubelet's --root-dir: plugins_registry/, plugins/, dra_manager_state.
    pub root: PathBuf,
    node_dir: PathBuf,
    cri_socket: PathBuf,
    record: PathBuf,
    cdi_dir: PathBuf,
    args: Vec<String>,
    setup: KubeletSetup,
    cri: Option<Child>,
    kubelet: Option<Child>,
    starts: u32,
}

impl RealKubelet {
    /// Starts the runtime and the kubelet for `node` (label `e2e-test=<test>`) and waits until the
    /// kubelet's Node is Ready.
    pub async fn start(
        client: &Client,
        setup: &KubeletSetup,
        node: &str,
        test: &str,
        node_dir: &Path,
        cdi_dir: &Path,
    ) -> Result<RealKubelet> {
        let root = node_dir.join("kubelet");
        std::fs::create_dir_all(&root)?;
        let cri_socket = node_dir.join("cri.sock");
        let config = node_dir.join("kubelet-config.yaml");
        std::fs::write(&config, kubelet_config(node_dir, &cri_socket)?)?;
        let args = vec![
            format!("--config={}", config.display()),
            format!("--kubeconfig={}", setup.kubeconfig.display()),
            format!("--root-dir={}", root.display()),
            format!("--hostname-override={node}"),
            format!("--node-ip={}", setup.node_ip),
            format!("--node-labels=e2e-test={test}"),
            "--v=2".into(),
        ];
        let mut k = RealKubelet {
            node: node.into(),
            root,
            node_dir: node_dir.into(),
            record: node_dir.join("containers.jsonl"),
            cri_socket,
            cdi_dir: cdi_dir.into(),
            args,
            setup: setup.clone(),
            cri: None,
            kubelet: None,
            starts: 0,
        };
        k.start_runtime().await?;
        k.start_kubelet()?;
        k.wait_ready(client).await?;
        Ok(k)
    }

    /// The directory the plugin registers in, and the one for its DRA socket.
    pub fn registrar_dir(&self) -> PathBuf {
        self.root.join("plugins_registry")
    }

    /// Where the kubelet's device manager listens for classic device plugins
    /// (`/var/lib/kubelet/device-plugins` in its mount namespace).
    pub fn device_plugin_dir(&self) -> PathBuf {
        self.node_dir.join("host/var-lib/kubelet/device-plugins")
    }

    pub fn plugin_dir(&self, driver: &str) -> PathBuf {
        self.root.join("plugins").join(driver)
    }

    async fn start_runtime(&mut self) -> Result<()> {
        let state = self.node_dir.join("cri-state");
        std::fs::create_dir_all(&state)?;
        let log = self.log_file("fake-cri.log")?;
        let child = Command::new(&self.setup.fake_cri_bin)
            .arg("--listen")
            .arg(&self.cri_socket)
            .arg("--state-dir")
            .arg(&state)
            .arg("--cdi-dir")
            .arg(&self.cdi_dir)
            .arg("--record")
            .arg(&self.record)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.setup.fake_cri_bin.display()))?;
        self.cri = Some(child);
        let socket = self.cri_socket.clone();
        wait_until("the fake runtime's socket", Duration::from_secs(30), || {
            let socket = socket.clone();
            async move { Ok(socket.exists().then_some(())) }
        })
        .await
    }

    fn start_kubelet(&mut self) -> Result<()> {
        self.starts += 1;
        let log = self.log_file("kubelet.log")?;
        use std::io::Write;
        writeln!(&log, "=== kubelet start #{}", self.starts)?;
        // Its cwd is the node dir: the kubelet's container log cleanup works relative to it when a
        // runtime reports an empty log path.
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "bash"])
            .arg(&self.setup.ns_script)
            .arg(&self.node_dir)
            .arg(&self.setup.kubelet_bin)
            .args(&self.args)
            .current_dir(&self.node_dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("starting the kubelet (unshare, kubelet-ns.sh)")?;
        if let Some(pid) = child.id() {
            std::fs::write(self.node_dir.join("kubelet.pid"), pid.to_string())?;
        }
        self.kubelet = Some(child);
        Ok(())
    }

    fn log_file(&self, name: &str) -> Result<std::fs::File> {
        Ok(OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.node_dir.join(name))?)
    }

    async fn wait_ready(&mut self, client: &Client) -> Result<()> {
        let nodes: Api<Node> = Api::all(client.clone());
        let deadline = std::time::Instant::now() + crate::env::WAIT;
        loop {
            self.check_alive()?;
            let ready = nodes.get_opt(&self.node).await?.is_some_and(|n| {
                n.status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            });
            if ready {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "node {} not Ready after {:?}; see {}",
                    self.node,
                    crate::env::WAIT,
                    self.node_dir.join("kubelet.log").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// Fails if the kubelet or the runtime has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        for (what, child) in [("kubelet", &mut self.kubelet), ("fake-cri", &mut self.cri)] {
            if let Some(c) = child.as_mut()
                && let Some(status) = c.try_wait()?
            {
                bail!(
                    "{what} of {} exited ({status}); see {}",
                    self.node,
                    self.node_dir.join(format!("{what}.log")).display()
                );
            }
        }
        Ok(())
    }

    /// Stops the kubelet (SIGKILL, as a crash or `systemctl restart` would leave things) and
    /// starts it again; waits for Ready.
    pub async fn restart(&mut self, client: &Client) -> Result<()> {
        if let Some(mut c) = self.kubelet.take() {
            c.kill().await?;
        }
        self.start_kubelet()?;
        self.wait_ready(client).await
    }

    /// Stops kubelet and runtime.
    pub async fn stop(&mut self) -> Result<()> {
        for child in [self.kubelet.take(), self.cri.take()].into_iter().flatten() {
            let mut c = child;
            c.kill().await?;
        }
        Ok(())
    }

    /// Every CreateContainer call so far.
    pub fn containers(&self) -> Result<Vec<ContainerRecord>> {
        let Ok(text) = std::fs::read_to_string(&self.record) else {
            return Ok(Vec::new());
        };
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).with_context(|| format!("record line {l}")))
            .collect()
    }

    /// CreateContainer calls the runtime refused (a CDI device it could not resolve).
    pub fn violations(&self) -> Result<Vec<String>> {
        Ok(self
            .containers()?
            .into_iter()
            .filter(|c| !c.error.is_empty())
            .map(|c| {
                format!(
                    "CreateContainer {}/{}: {}",
                    c.pod_name, c.container, c.error
                )
            })
            .collect())
    }

    /// The claims the kubelet's DRA manager holds as prepared (its checkpoint), by UID, with the
    /// devices our plugin's prepare returned for them.
    pub fn prepared(&self) -> Result<BTreeMap<String, (ClaimRef, Vec<PreparedDevice>)>> {
        let path = self.root.join("dra_manager_state");
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(BTreeMap::new());
        };
        let outer: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        // The checkpoint's data is itself JSON, kept as a string beside its checksum.
        let data = outer["Data"].as_str().unwrap_or_default();
        let state: Checkpoint = serde_json::from_str(data)
            .with_context(|| format!("parsing the data of {}", path.display()))?;
        Ok(state
            .claim_info_state_list
            .unwrap_or_default()
            .into_iter()
            .map(|c| {
                let devices = c
                    .driver_state
                    .get(crate::DRIVER)
                    .map(|d| {
                        d.devices
                            .iter()
                            .map(|d| PreparedDevice {
                                request_names: d.request_names.clone(),
                                pool: d.pool_name.clone(),
                                device: d.device_name.clone(),
                                cdi_ids: d.cdi_device_ids.clone(),
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let claim = ClaimRef {
                    namespace: c.namespace,
                    name: c.claim_name,
                    uid: c.claim_uid.clone(),
                };
                (c.claim_uid, (claim, devices))
            })
            .collect())
    }

    /// Claim UID -> successful prepare calls, from the plugin's log (one `prepared` line per
    /// claim and call, in the claim's span).
    pub fn prepare_calls(&self) -> Result<HashMap<String, u32>> {
        let log = std::fs::read_to_string(self.node_dir.join("plugin.log")).unwrap_or_default();
        let mut calls = HashMap::new();
        for line in log.lines().filter(|l| l.contains(": prepared")) {
            if let Some(uid) =
                span_field(line, "claimUID").or_else(|| span_field(line, "claim_uid"))
            {
                *calls.entry(uid.to_string()).or_insert(0) += 1;
            }
        }
        Ok(calls)
    }
}

/// `name=value` of a text log line's span fields.
fn span_field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!("{name}="))? + name.len() + 1;
    let rest = &line[start..];
    let end = rest.find([' ', '}', ',']).unwrap_or(rest.len());
    Some(&rest[..end])
}

/// The parts of the kubelet's DRA checkpoint (`checkpoint.dra.kubelet.k8s.io/v1`) read here.
#[derive(Deserialize)]
struct Checkpoint {
    /// `null` until the kubelet has prepared a claim.
    #[serde(rename = "ClaimInfoStateList", default)]
    claim_info_state_list: Option<Vec<ClaimInfoState>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ClaimInfoState {
    #[serde(rename = "ClaimUID")]
    claim_uid: String,
    claim_name: String,
    namespace: String,
    #[serde(default)]
    driver_state: BTreeMap<String, DriverState>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DriverState {
    #[serde(default)]
    devices: Vec<CheckpointDevice>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CheckpointDevice {
    pool_name: String,
    device_name: String,
    #[serde(default)]
    request_names: Vec<String>,
    #[serde(rename = "CDIDeviceIDs", default)]
    cdi_device_ids: Vec<String>,
}

/// A free loopback TCP port (bound once and released).
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The KubeletConfiguration for a node without a real runtime, cgroup setup or host paths.
fn kubelet_config(node_dir: &Path, cri_socket: &Path) -> Result<String> {
    let logs = node_dir.join("pod-logs");
    std::fs::create_dir_all(&logs)?;
    let cfg = serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": free_port()?,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 0,
        "authentication": {"anonymous": {"enabled": true}, "webhook": {"enabled": false}},
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": format!("unix://{}", cri_socket.display()),
        "imageServiceEndpoint": format!("unix://{}", cri_socket.display()),
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": false,
        "enforceNodeAllocatable": [],
        "failCgroupV1": false,
        "failSwapOn": false,
        "podLogsDir": logs,
        "syncFrequency": "5s",
        "nodeStatusUpdateFrequency": "4s",
        "fileCheckFrequency": "5s",
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
            "nodefs.inodesFree": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": false,
        "localStorageCapacityIsolation": false,
        "shutdownGracePeriod": "0s",
        "resolvConf": "",
        "featureGates": {"ResourceHealthStatus": true},
    });
    Ok(serde_yaml::to_string(&cfg)?)
}
