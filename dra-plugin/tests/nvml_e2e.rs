//! The real `dra-plugin` binary with `--backend nvml` on the mock libnvidia-ml: it publishes what
//! the simulated backend publishes for the same hardware, waits for a driver that is not ready
//! yet, and dynamic MIG prepare/unprepare creates and destroys the instance in (mock) NVML.
mod common;
#[path = "../../mock-nvml/harness.rs"]
mod harness;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dra_plugin::grpc::client::{get_info, unix_channel};
use gpu_dra_api::simulated::{GpuGroup, sim_mig_uuid, simulate_node};
use harness::MockNode;
use kubelet_proto::dra_v1::{self as v1, dra_plugin_client::DraPluginClient};

const BIN: &str = env!("CARGO_BIN_EXE_dra-plugin");

fn can_build() -> bool {
    if harness::have_cc() {
        return true;
    }
    eprintln!("SKIPPED: no gcc on this machine to build the mock libnvidia-ml (mock-nvml/)");
    false
}

fn slices(args: &[&str], sysfs: &Path) -> serde_json::Value {
    let out = Command::new(BIN)
        .arg("slices")
        .args(["--node-name", "node-1", "-o", "json"])
        .args(args)
        .env("HOST_SYSFS_ROOT", sysfs)
        .env_remove("NVIDIA_DRIVER_ROOT")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "dra-plugin slices {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn slices_of_the_nvml_backend_equal_the_simulated_ones() {
    if !can_build() {
        return;
    }
    let groups = [
        GpuGroup::parse("h100-80gb:2").unwrap(),
        GpuGroup::parse("l40s:1").unwrap(),
    ];
    let inv = simulate_node("node-1", &groups, None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let node = MockNode::new(dir.path(), &inv);
    let root = node.driver_root.to_str().unwrap();
    for gates in ["", "DynamicMIG=true"] {
        let nvml = slices(
            &[
                "--backend",
                "nvml",
                "--driver-root",
                root,
                "--feature-gates",
                gates,
            ],
            &node.sysfs,
        );
        let sim = slices(
            &[
                "--backend",
                "simulated",
                "--profile",
                "h100-80gb:2,l40s:1",
                "--feature-gates",
                gates,
            ],
            &node.sysfs,
        );
        assert_eq!(nvml, sim, "feature gates {gates:?}");
        assert!(nvml["items"].as_array().is_some_and(|i| !i.is_empty()));
    }
}

struct Plugin {
    child: Child,
    log: std::path::PathBuf,
}

impl Plugin {
    fn start(dir: &Path, node: &MockNode, gates: &str) -> Plugin {
        common::offline_dir(dir);
        let log = dir.join("plugin.log");
        let child = Command::new(BIN)
            .arg("run")
            .args(["--backend", "nvml", "--node-name", "node-1"])
            .arg("--driver-root")
            .arg(&node.driver_root)
            .args(["--feature-gates", gates])
            .arg("--offline-claims-dir")
            .arg(dir.join("claims"))
            .arg("--plugin-dir")
            .arg(dir.join("plugin"))
            .arg("--registrar-dir")
            .arg(dir.join("registry"))
            .arg("--cdi-root")
            .arg(dir.join("cdi"))
            .arg("--boot-id-file")
            .arg(dir.join("boot_id"))
            .args(["--metrics-port", "0", "--healthcheck-port", "0"])
            .env("HOST_SYSFS_ROOT", &node.sysfs)
            // The driver root comes from the flag alone.
            .env_remove("NVIDIA_DRIVER_ROOT")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Plugin { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the registration socket answers.
    async fn registered(&mut self, dir: &Path, within: Duration) -> bool {
        let reg = dir.join("registry/gpu.nvidia.com-reg.sock");
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if get_info(&reg).await.is_ok() {
                return true;
            }
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "the plugin exited:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    fn stop(mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.child.try_wait().unwrap().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        panic!("the plugin did not stop on SIGTERM:\n{}", self.log());
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn claim(dir: &Path, name: &str, uid: &str, device: &str) -> v1::Claim {
    let obj = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "mig", "driver": "gpu.nvidia.com", "pool": "node-1", "device": device}
        ]}}}
    });
    common::put_claim(dir, &obj);
    v1::Claim {
        namespace: "ns".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

/// `dra-plugin mock-nvml-root`: the hardware named by the simulated backend's environment variable
/// (here `SIMULATED_HARDWARE_FILE`, a YAML file with a static MIG layout) becomes a mock driver
/// root, built with make, whose NVML publishes exactly the simulated slices.
#[test]
fn mock_nvml_root_subcommand_serves_the_profile_the_environment_names() {
    if !can_build() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let hw = dir.path().join("hardware.yaml");
    std::fs::write(
        &hw,
        "gpus:\n- profile: a100-80gb\n  count: 2\n  migLayout: all-balanced\n- profile: l40s\n",
    )
    .unwrap();
    let out = dir.path().join("mock");
    let run = |env: &[(&str, &std::ffi::OsStr)]| {
        let mut c = Command::new(BIN);
        c.args(["mock-nvml-root", "--node-name", "node-1", "--out"])
            .arg(&out);
        for v in [
            "SIMULATED_PROFILES",
            "SIMULATED_HARDWARE_FILE",
            "SIMULATED_MIG_LAYOUT",
            "MOCK_NVML_LIBRARY",
            "MOCK_NVML_SOURCE",
        ] {
            c.env_remove(v);
        }
        c.envs(env.iter().copied()).output().unwrap()
    };
    let none = run(&[]);
    assert!(!none.status.success(), "no hardware named: an error");
    assert!(
        String::from_utf8_lossy(&none.stderr).contains("--profile"),
        "{}",
        String::from_utf8_lossy(&none.stderr)
    );

    let o = run(&[("SIMULATED_HARDWARE_FILE", hw.as_os_str())]);
    assert!(
        o.status.success(),
        "mock-nvml-root: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let root = out.join("root");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains(&format!("export NVIDIA_DRIVER_ROOT={}", root.display()))
            && stdout.contains(&format!(
                "export HOST_SYSFS_ROOT={}",
                out.join("sys").display()
            )),
        "{stdout}"
    );
    assert!(root.join("usr/lib64/libnvidia-ml.so.1").is_file());
    let nvml = slices(
        &["--backend", "nvml", "--driver-root", root.to_str().unwrap()],
        &out.join("sys"),
    );
    let sim = slices(
        &[
            "--backend",
            "simulated",
            "--hardware-file",
            hw.to_str().unwrap(),
        ],
        &out.join("sys"),
    );
    assert_eq!(nvml, sim);
    let names: Vec<&str> = nvml["items"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().unwrap())
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert!(
        names.iter().any(|n| n.starts_with("gpu-0-mig-")) && names.contains(&"gpu-2"),
        "the static MIG layout and the L40S: {names:?}"
    );
}

#[tokio::test]
async fn dynamic_mig_prepare_creates_the_instance_in_nvml() {
    if !can_build() {
        return;
    }
    let inv = simulate_node("node-1", &[GpuGroup::parse("h100-80gb:2").unwrap()], None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let node = MockNode::new(dir.path(), &inv);
    let mut p = Plugin::start(dir.path(), &node, "DynamicMIG=true");
    assert!(
        p.registered(dir.path(), Duration::from_secs(60)).await,
        "not registered:\n{}",
        p.log()
    );
    let mut client = DraPluginClient::new(
        unix_channel(&dir.path().join("plugin/dra.sock"))
            .await
            .unwrap(),
    );
    let c = claim(dir.path(), "train", "uid-1", "gpu-1-mig-3g40gb-9-4");
    let resp = client
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![c.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.claims["uid-1"].error, "", "{}", p.log());
    // NVML (the mock's shared state) now holds a 3g.40gb GPU instance at 4 on gpu-1 with its
    // compute instance, and MIG mode is on.
    let state = node.state_lines();
    assert!(state.contains(&"gpu 1 1 1".to_string()), "{state:?}");
    assert!(
        state
            .iter()
            .any(|l| l.starts_with("gi 1 ") && l.ends_with(" 9 4")),
        "{state:?}"
    );
    assert_eq!(state.iter().filter(|l| l.starts_with("ci 1 ")).count(), 1);
    let spec = std::fs::read_to_string(dir.path().join("cdi/k8s.gpu.nvidia.com-claim_uid-1.json"))
        .unwrap();
    let uuid = sim_mig_uuid(&inv.gpus[1].uuid, 9, 4);
    assert!(
        spec.contains(&uuid),
        "the MIG device's UUID from NVML: {spec}"
    );

    let un = client
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: vec![c] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(un.claims["uid-1"].error, "", "{}", p.log());
    let state = node.state_lines();
    assert!(!state.iter().any(|l| l.starts_with("gi ")), "{state:?}");
    assert!(
        state.contains(&"gpu 1 0 0".to_string()),
        "MIG mode off again: {state:?}"
    );

    // An instance the mock cannot make fails that claim with NVML's reason, and leaves nothing.
    let other = claim(dir.path(), "big", "uid-2", "gpu-0-mig-7g80gb-0-0");
    let blocker = claim(dir.path(), "small", "uid-3", "gpu-0-mig-1g10gb-19-6");
    let ok = client
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![blocker],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.claims["uid-3"].error, "", "{}", p.log());
    let refused = client
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![other],
        })
        .await
        .unwrap()
        .into_inner();
    let e = &refused.claims["uid-2"].error;
    assert!(e.contains("overlaps"), "{e}");
    let state = node.state_lines();
    let gis: Vec<_> = state.iter().filter(|l| l.starts_with("gi 0 ")).collect();
    assert_eq!(gis.len(), 1, "only the 1g.10gb: {state:?}");
    assert!(gis[0].ends_with(" 19 6"), "{state:?}");
    p.stop();
}

#[tokio::test]
async fn the_plugin_waits_for_the_driver_and_says_why() {
    if !can_build() {
        return;
    }
    let inv = simulate_node("node-1", &[GpuGroup::parse("a100-80gb:1").unwrap()], None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let node = MockNode::new(dir.path(), &inv);
    std::fs::write(&node.init_gate, "").unwrap();
    let mut p = Plugin::start(dir.path(), &node, "");
    assert!(
        !p.registered(dir.path(), Duration::from_millis(1500)).await,
        "no registration before the GPUs are known"
    );
    let log = p.log();
    assert!(
        log.contains("cannot initialise NVML") && log.contains("libnvidia-ml.so.1"),
        "the log says why: {log}"
    );
    std::fs::remove_file(&node.init_gate).unwrap();
    assert!(
        p.registered(dir.path(), Duration::from_secs(60)).await,
        "registered once the driver is up:\n{}",
        p.log()
    );
    p.stop();
}

/// `--driver-root` given as a flag (no `NVIDIA_DRIVER_ROOT` in the environment) is where the MPS
/// control daemon comes from too, not `/`. The driver root's `nvidia-cuda-mps-control` here is a
/// stand-in that says it ran and fails, so the claim's error shows which binary was started.
#[tokio::test]
async fn mps_control_comes_from_the_driver_root_given_as_a_flag() {
    if !can_build() {
        return;
    }
    let inv = simulate_node("node-1", &[GpuGroup::parse("h100-80gb:1").unwrap()], None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let node = MockNode::new(dir.path(), &inv);
    let bin = node.driver_root.join("usr/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let control = bin.join("nvidia-cuda-mps-control");
    std::fs::write(
        &control,
        "#!/bin/sh\necho \"driver-root nvidia-cuda-mps-control $*\" >&2\nexit 1\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&control, std::fs::Permissions::from_mode(0o755)).unwrap();

    let mut p = Plugin::start(dir.path(), &node, "MPSSupport=true");
    assert!(
        p.registered(dir.path(), Duration::from_secs(60)).await,
        "not registered:\n{}",
        p.log()
    );
    let obj = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "mps", "namespace": "ns", "uid": "uid-mps"},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-0"}],
            "config": [{"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                "sharing": {"strategy": "MPS"}}}}]
        }}}
    });
    common::put_claim(dir.path(), &obj);
    let c = v1::Claim {
        namespace: "ns".into(),
        uid: "uid-mps".into(),
        name: "mps".into(),
    };
    let mut client = DraPluginClient::new(
        unix_channel(&dir.path().join("plugin/dra.sock"))
            .await
            .unwrap(),
    );
    let resp = common::prepare(&mut client, &c).await;
    assert!(
        resp.error
            .contains("driver-root nvidia-cuda-mps-control -d"),
        "the driver root's MPS control was started: {}\n{}",
        resp.error,
        p.log()
    );
    p.stop();
}
