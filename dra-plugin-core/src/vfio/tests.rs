//! The binder against a fake sysfs tree, with a fake "kernel" thread that moves the `driver`
//! link when an address is written to a driver's `bind` or `unbind`, and logs every write.
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gpu_dra_api::config::{IommuConfig, VfioDeviceConfig};

use super::*;
use crate::cdi::{CdiDevice, ContainerEdits};

const ADDR: &str = "0000:18:00.0";

/// `<root>/sys/bus/pci/{devices,drivers}` and `<root>/dev`, one GPU on `nvidia` in group 20.
pub(crate) fn fake_tree(root: &Path, addrs: &[(&str, u32)]) -> PciBus {
    let sys = root.join("sys");
    for d in [NVIDIA_DRIVER, VFIO_PCI_DRIVER] {
        let dir = sys.join("bus/pci/drivers").join(d);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("bind"), "").unwrap();
        std::fs::write(dir.join("unbind"), "").unwrap();
    }
    for (addr, group) in addrs {
        let dev = sys.join("bus/pci/devices").join(addr);
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::create_dir_all(sys.join("kernel/iommu_groups").join(group.to_string())).unwrap();
        std::os::unix::fs::symlink(
            sys.join("kernel/iommu_groups").join(group.to_string()),
            dev.join("iommu_group"),
        )
        .unwrap();
        std::os::unix::fs::symlink(
            sys.join("bus/pci/drivers").join(NVIDIA_DRIVER),
            dev.join("driver"),
        )
        .unwrap();
        std::fs::write(dev.join("driver_override"), "").unwrap();
    }
    std::fs::create_dir_all(root.join("dev/vfio")).unwrap();
    let mut bus = PciBus::new(sys, root.join("dev"));
    bus.settle_timeout = Duration::from_secs(2);
    bus
}

/// Reacts to `bind`/`unbind` writes like the kernel would; `log` gets `<file> <content>` lines.
pub(crate) struct FakeKernel {
    stop: Arc<AtomicBool>,
    pub(crate) log: Arc<std::sync::Mutex<Vec<String>>>,
}

impl FakeKernel {
    pub(crate) fn start(sys: PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (s, l) = (stop.clone(), log.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                step(&sys, &l);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        FakeKernel { stop, log }
    }
}

impl Drop for FakeKernel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn step(sys: &Path, log: &std::sync::Mutex<Vec<String>>) {
    let drivers = sys.join("bus/pci/drivers");
    for d in std::fs::read_dir(&drivers).unwrap().flatten() {
        let driver = d.file_name().to_string_lossy().into_owned();
        for op in ["unbind", "bind"] {
            let file = d.path().join(op);
            let addr = std::fs::read_to_string(&file).unwrap_or_default();
            if addr.is_empty() {
                continue;
            }
            std::fs::write(&file, "").unwrap();
            log.lock().unwrap().push(format!("{driver}/{op} {addr}"));
            let dev = sys.join("bus/pci/devices").join(&addr);
            let _ = std::fs::remove_file(dev.join("driver"));
            let _ = std::fs::remove_dir_all(dev.join("vfio-dev"));
            if op == "bind" {
                std::os::unix::fs::symlink(d.path(), dev.join("driver")).unwrap();
                if driver == VFIO_PCI_DRIVER {
                    std::fs::create_dir_all(dev.join("vfio-dev/vfio3")).unwrap();
                }
            }
        }
    }
}

#[test]
fn configure_binds_to_vfio_and_unconfigure_goes_back_to_nvidia() {
    let dir = tempfile::tempdir().unwrap();
    let bus = fake_tree(dir.path(), &[(ADDR, 20)]);
    let kernel = FakeKernel::start(bus.sysfs.clone());
    bus.configure(ADDR).unwrap();
    assert_eq!(bus.driver_of(ADDR).unwrap().as_deref(), Some("vfio-pci"));
    let override_path = bus.device_dir(ADDR).join("driver_override");
    assert_eq!(std::fs::read_to_string(&override_path).unwrap(), "vfio-pci");
    assert_eq!(bus.iommu_group(ADDR).unwrap(), 20);
    assert_eq!(bus.iommufd_cdev(ADDR).unwrap(), "vfio3");
    // Already bound: nothing written.
    bus.configure(ADDR).unwrap();
    bus.unconfigure(ADDR).unwrap();
    assert_eq!(bus.driver_of(ADDR).unwrap().as_deref(), Some("nvidia"));
    assert_eq!(std::fs::read_to_string(&override_path).unwrap(), "nvidia");
    assert_eq!(
        *kernel.log.lock().unwrap(),
        [
            format!("nvidia/unbind {ADDR}"),
            format!("vfio-pci/bind {ADDR}"),
            format!("vfio-pci/unbind {ADDR}"),
            format!("nvidia/bind {ADDR}"),
        ]
    );
}

#[test]
fn a_change_cut_short_after_unbind_completes_on_retry() {
    let dir = tempfile::tempdir().unwrap();
    let bus = fake_tree(dir.path(), &[(ADDR, 20)]);
    // A restart between unbind and bind leaves the function on no driver.
    std::fs::remove_file(bus.device_dir(ADDR).join("driver")).unwrap();
    let kernel = FakeKernel::start(bus.sysfs.clone());
    bus.configure(ADDR).unwrap();
    assert_eq!(
        *kernel.log.lock().unwrap(),
        [format!("vfio-pci/bind {ADDR}")]
    );
    std::fs::remove_file(bus.device_dir(ADDR).join("driver")).unwrap();
    bus.unconfigure(ADDR).unwrap();
    assert_eq!(bus.driver_of(ADDR).unwrap().as_deref(), Some("nvidia"));
}

#[test]
fn errors_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let bus = fake_tree(dir.path(), &[(ADDR, 20)]);
    // No kernel: the bind write lands but the link never moves.
    let err = bus.configure(ADDR).unwrap_err().to_string();
    assert!(err.contains("0000:18:00.0/driver"), "{err}");
    let err = bus.configure("0000:99:00.0").unwrap_err().to_string();
    assert!(err.contains("bus/pci/devices/0000:99:00.0"), "{err}");
    std::fs::write(bus.device_dir(ADDR).join("sriov_numvfs"), "2\n").unwrap();
    let err = bus.configure(ADDR).unwrap_err().to_string();
    assert!(
        err.contains("sriov_numvfs") && err.contains("2 VFs"),
        "{err}"
    );
    std::fs::remove_dir_all(bus.driver_dir(VFIO_PCI_DRIVER)).unwrap();
    let err = bus.configure(ADDR).unwrap_err().to_string();
    assert!(
        err.contains("drivers/vfio-pci") && err.contains("loaded"),
        "{err}"
    );
}

#[test]
fn a_foreign_driver_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bus = fake_tree(dir.path(), &[(ADDR, 20)]);
    let other = bus.driver_dir("nouveau");
    std::fs::create_dir_all(&other).unwrap();
    let link = bus.device_dir(ADDR).join("driver");
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(&other, &link).unwrap();
    let err = bus.configure(ADDR).unwrap_err().to_string();
    assert!(err.contains("\"nouveau\""), "{err}");
}

fn spec_with(devices: &[&str]) -> Spec {
    Spec {
        cdi_version: "0.6.0".into(),
        kind: "k8s.gpu.nvidia.com/claim".into(),
        annotations: Default::default(),
        devices: devices
            .iter()
            .map(|d| CdiDevice {
                name: format!("uid-{d}"),
                container_edits: ContainerEdits {
                    env: vec!["NVIDIA_VISIBLE_DEVICES=x".into()],
                    ..Default::default()
                },
            })
            .collect(),
        container_edits: ContainerEdits {
            device_nodes: vec![DeviceNode {
                path: "/dev/nvidiactl".into(),
            }],
            ..Default::default()
        },
    }
}

// vfio-cdi.go: GetCommonEdits / GetDeviceSpecsByPCIBusID.
#[test]
fn spec_edits_follow_nvidia() {
    let prepared = [VfioPrepared {
        device_name: "gpu-vfio-0".into(),
        device_node: "/dev/vfio/20".into(),
    }];
    let mut spec = spec_with(&["gpu-vfio-0"]);
    let mut config = VfioDeviceConfig::default();
    apply_to_spec(&mut spec, "uid", &prepared, &config, false);
    assert_eq!(spec.container_edits.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
    assert!(spec.container_edits.device_nodes.is_empty());
    assert!(spec.devices[0].container_edits.env.is_empty());
    assert_eq!(
        spec.devices[0].container_edits.device_nodes[0].path,
        "/dev/vfio/20"
    );

    config.iommu = Some(IommuConfig {
        backend_policy: Some(IommuBackendPolicy::LegacyOnly),
        enable_api_device: Some(true),
    });
    let mut spec = spec_with(&["gpu-vfio-0"]);
    apply_to_spec(&mut spec, "uid", &prepared, &config, false);
    assert_eq!(spec.container_edits.device_nodes[0].path, "/dev/vfio/vfio");
    let mut spec = spec_with(&["gpu-vfio-0"]);
    apply_to_spec(&mut spec, "uid", &prepared, &config, true);
    assert_eq!(spec.container_edits.device_nodes[0].path, "/dev/iommu");
}

#[test]
fn iommufd_needs_the_policy_and_the_api_device() {
    let dir = tempfile::tempdir().unwrap();
    let bus = fake_tree(dir.path(), &[(ADDR, 20)]);
    let config = VfioDeviceConfig {
        iommu: Some(IommuConfig {
            backend_policy: Some(IommuBackendPolicy::PreferIommuFD),
            enable_api_device: Some(false),
        }),
    };
    assert!(!use_iommufd(&config, &bus));
    std::fs::write(bus.dev.join("iommu"), "").unwrap();
    assert!(use_iommufd(&config, &bus));
    assert!(!use_iommufd(&VfioDeviceConfig::default(), &bus));
    assert_eq!(device_node(&bus, ADDR, false).unwrap(), "/dev/vfio/20");
}
