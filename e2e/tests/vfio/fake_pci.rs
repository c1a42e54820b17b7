//! A fake host PCI bus for one node's plugin (`--host-sysfs-root`, `--host-dev-root`):
//! `<root>/sys/bus/pci/{devices,drivers}` with the simulated GPUs' addresses and IOMMU groups,
//! every function on `nvidia`, and a "kernel" thread that does what the kernel does when an
//! address is written to a driver's `unbind` or `bind`: it moves the function's `driver` link.
//! As with the real `vfio-pci` (which has no ID table), a bind there takes only when the
//! function's `driver_override` names it.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

pub const NVIDIA: &str = "nvidia";
pub const VFIO_PCI: &str = "vfio-pci";

pub struct FakePci {
    pub sys: PathBuf,
    pub dev: PathBuf,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<String>>>,
    thread: Option<JoinHandle<()>>,
}

fn mkdir(p: &Path) -> Result<()> {
    std::fs::create_dir_all(p).with_context(|| format!("creating {}", p.display()))
}

fn write(p: &Path, s: &str) -> Result<()> {
    std::fs::write(p, s).with_context(|| format!("writing {}", p.display()))
}

fn symlink(target: &Path, link: &Path) -> Result<()> {
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("linking {} to {}", link.display(), target.display()))
}

impl FakePci {
    /// Builds the tree under `root` for `(PCI address, IOMMU group, PCI device ID)` of each GPU
    /// and starts the kernel thread.
    pub fn start(root: &Path, gpus: &[(String, u32, u16)]) -> Result<FakePci> {
        let sys = root.join("sys");
        let dev = root.join("dev");
        for d in [NVIDIA, VFIO_PCI] {
            let dir = sys.join("bus/pci/drivers").join(d);
            mkdir(&dir)?;
            write(&dir.join("bind"), "")?;
            write(&dir.join("unbind"), "")?;
        }
        mkdir(&dev.join("vfio"))?;
        write(&dev.join("vfio/vfio"), "")?;
        for (addr, group, device_id) in gpus {
            let d = sys.join("bus/pci/devices").join(addr);
            let g = sys.join("kernel/iommu_groups").join(group.to_string());
            mkdir(&d)?;
            mkdir(&g)?;
            symlink(&g, &d.join("iommu_group"))?;
            symlink(&sys.join("bus/pci/drivers").join(NVIDIA), &d.join("driver"))?;
            write(&d.join("driver_override"), "\n")?;
            write(&d.join("vendor"), "0x10de\n")?;
            write(&d.join("device"), &format!("0x{device_id:04x}\n"))?;
            write(&dev.join("vfio").join(group.to_string()), "")?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (s, l, drivers) = (stop.clone(), log.clone(), sys.join("bus/pci"));
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                for line in step(&drivers) {
                    l.lock().expect("log lock").push(line);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Ok(FakePci {
            sys,
            dev,
            stop,
            log,
            thread: Some(thread),
        })
    }

    /// The driver `addr` is bound to now; `None` when unbound.
    pub fn driver_of(&self, addr: &str) -> Option<String> {
        let link = self.sys.join("bus/pci/devices").join(addr).join("driver");
        std::fs::read_link(link)
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
    }

    /// Every write the kernel acted on, `<driver>/<bind|unbind> <address>`, and refusals.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().expect("log lock").clone()
    }
}

impl Drop for FakePci {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One pass over every driver's `unbind` and `bind`; returns what it did.
fn step(bus: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(drivers) = std::fs::read_dir(bus.join("drivers")) else {
        return out;
    };
    for d in drivers.flatten() {
        let driver = d.file_name().to_string_lossy().into_owned();
        for op in ["unbind", "bind"] {
            let file = d.path().join(op);
            let addr = std::fs::read_to_string(&file).unwrap_or_default();
            let addr = addr.trim();
            if addr.is_empty() {
                continue;
            }
            let _ = std::fs::write(&file, "");
            let dev = bus.join("devices").join(addr);
            out.push(match act(&dev, &d.path(), &driver, op) {
                Ok(()) => format!("{driver}/{op} {addr}"),
                Err(e) => format!("{driver}/{op} {addr} refused: {e:#}"),
            });
        }
    }
    out
}

fn act(dev: &Path, driver_dir: &Path, driver: &str, op: &str) -> Result<()> {
    let link = dev.join("driver");
    let current = std::fs::read_link(&link).ok();
    if op == "unbind" {
        anyhow::ensure!(
            current.as_deref() == Some(driver_dir),
            "not bound to {driver}"
        );
        return std::fs::remove_file(&link).with_context(|| format!("{}", link.display()));
    }
    anyhow::ensure!(current.is_none(), "still bound to {current:?}");
    // driver_override, when set, is the only driver that may take the function.
    let over = std::fs::read_to_string(dev.join("driver_override")).unwrap_or_default();
    let over = over.trim();
    anyhow::ensure!(
        over == driver || (over.is_empty() && driver != VFIO_PCI),
        "driver_override is {over:?}"
    );
    symlink(driver_dir, &link)
}
