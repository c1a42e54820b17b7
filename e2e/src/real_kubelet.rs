//! The stock kubelet (built from `k8s.io/kubernetes` with the control plane) and a fake container
//! runtime (`e2e/kubelet-tools`, `fake-cri`) for one node. The kubelet registers its Node, runs
//! the DRA manager against our plugin and creates containers in the fake runtime, which checks
//! every CDI device against the spec files on disk as containerd does and records each
//! CreateContainer call.
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
    #[serde(default, rename = "podUID")]
    pub pod_uid: String,
    #[serde(default)]
    pub pod_name: String,
    #[serde(default)]
    pub container: String,
    #[serde(default)]
    pub cdi_devices: Vec<String>,
    #[serde(default)]
    pub envs: std::collections::BTreeMap<String, String>,
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

    /// The claims the kubelet's DRA manager holds as prepared (its checkpoint), by UID.
    pub fn prepared_claims(&self) -> Result<Vec<String>> {
        let path = self.root.join("dra_manager_state");
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(Vec::new());
        };
        let mut v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        // The checkpoint's data is itself JSON, kept as a string beside its checksum.
        if let Some(data) = v.get("Data").and_then(|d| d.as_str()) {
            v = serde_json::from_str(data)
                .with_context(|| format!("parsing {} Data", path.display()))?;
        }
        let mut uids = Vec::new();
        collect_claim_uids(&v, &mut uids);
        uids.sort();
        uids.dedup();
        Ok(uids)
    }
}

/// The kubelet's checkpoint keeps one entry with a `ClaimUID` per prepared claim.
fn collect_claim_uids(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v.as_str()) {
                    ("ClaimUID" | "claimUID", Some(uid)) => out.push(uid.to_string()),
                    _ => collect_claim_uids(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_claim_uids(v, out)),
        _ => {}
    }
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
