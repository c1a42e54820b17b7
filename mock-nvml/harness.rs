//! Test harness for the mock libnvidia-ml (included by the plugin's tests with `#[path]`).
//!
//! Builds the mock with the machine's C compiler and turns a node made from our hardware profiles
//! (`gpu_dra_api::simulated::simulate_node`, the simulated backend's source) into the mock's node
//! description, so the NVML backend and the simulated backend see the same GPUs. The description,
//! `mock-nvml.conf` next to the library, is one record a line (names run to the end of the line):
//!
//! ```text
//! driver <version>                       cuda <version as NVML's int, 13000>
//! state <path>   events <path>   fail_init_while <path>     (see mock_nvml.c)
//! gpu <minor> <uuid> <busId> <pciDeviceId> <brand> <arch> <ccMajor> <ccMinor> <memBytes>
//!     <numa|-1> <addressingMode|-1> <migCapable> <migMode> <memSlices> <computeSlices> <name>
//! profile <NVML profile index> <id> <slices> <instances> <SMs> <CEs> <decoders> <encoders>
//!     <JPEGs> <OFAs> <memMiB> <name>            (of the last gpu)
//! place <profile id> <start> <size> <MIG UUID of a device made there>
//! gi <profile id> <start>                       (a MIG device that exists at start)
//! mig_needs_reset 1                             (MIG mode changes wait for a GPU reset)
//! ```
#![allow(dead_code)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpu_dra_api::inventory::Inventory;
use gpu_dra_api::profiles::{self, MigProfile};
use gpu_dra_api::simulated::{SIM_CUDA_DRIVER_VERSION, sim_mig_uuid};

/// Where the mock's sources are.
pub fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mock-nvml")
}

/// Whether a C compiler is there to build the mock.
pub fn have_cc() -> bool {
    Command::new("gcc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Builds the mock once per test process; the path of the built library.
pub fn built_library() -> PathBuf {
    static LIB: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    LIB.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("mock-nvml")
            .join(std::process::id().to_string());
        let o = Command::new("make")
            .arg("-C")
            .arg(source_dir())
            .arg(format!("OUT={}", out.display()))
            .output()
            .expect("running make for mock-nvml");
        assert!(
            o.status.success(),
            "building mock-nvml failed:\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        out.join("usr/lib64/libnvidia-ml.so.1")
    })
    .clone()
}

/// `NVML_GPU_INSTANCE_PROFILE_*` of a profile, from its name (`1g.10gb+me` is `1_SLICE_REV1`...).
pub fn nvml_profile_index(p: &MigProfile) -> u32 {
    let by_slices = |c: u32| match c {
        1 => 0,
        2 => 1,
        3 => 2,
        4 => 3,
        7 => 4,
        8 => 5,
        6 => 6,
        _ => panic!("no NVML profile of {c} slices"),
    };
    let c = p.compute_slices;
    if p.name.ends_with("+me.all") {
        return [15, 16][c as usize - 1];
    }
    if p.name.ends_with("-me") {
        return [13, 14][c as usize - 1];
    }
    if p.name.ends_with("+gfx") {
        return match c {
            1 => 10,
            2 => 11,
            4 => 12,
            _ => panic!("no +gfx profile of {c} slices"),
        };
    }
    if p.name.ends_with("+me") {
        return [7, 8][c as usize - 1];
    }
    if c == 1 && p.memory_slices == 2 {
        return 9; // 1_SLICE_REV2: one compute slice with two memory slices
    }
    by_slices(c)
}

fn brand_code(brand: &str) -> u32 {
    match brand {
        "Quadro" => 1,
        "Tesla" => 2,
        "NVS" => 3,
        "GeForce" => 5,
        "Titan" => 6,
        "NvidiaRTX" => 13,
        "NVIDIA" => 14,
        _ => 0,
    }
}

fn arch_code(arch: &str) -> u32 {
    match arch {
        "Volta" => 5,
        "Turing" => 6,
        "Ampere" => 7,
        "Ada Lovelace" => 8,
        "Hopper" => 9,
        "Blackwell" => 10,
        _ => u32::MAX,
    }
}

/// The mock's description of the node `inv` (the simulated backend's view of it).
pub fn node_config(inv: &Inventory, extra: &str) -> String {
    let mut c = String::new();
    let first = inv.gpus.first().expect("a node with GPUs");
    let (maj, min) = SIM_CUDA_DRIVER_VERSION.split_once('.').unwrap();
    let cuda: u32 = maj.parse::<u32>().unwrap() * 1000 + min.parse::<u32>().unwrap() * 10;
    writeln!(c, "driver {}\ncuda {cuda}", first.driver_version).unwrap();
    c.push_str(extra);
    for g in &inv.gpus {
        let model = profiles::catalog()
            .iter()
            .find(|m| m.product_name == g.product_name)
            .expect("a known model");
        let (ccmaj, ccmin) = g.cuda_compute_capability.split_once('.').unwrap();
        let addressing = match g.addressing_mode.as_deref() {
            Some("None") => 0,
            Some("HMM") => 1,
            Some("ATS") => 2,
            Some(other) => panic!("addressing mode {other:?} has no NVML value"),
            None => -1, // NVML without the call (older drivers): not supported
        };
        let mig = g.mig.as_ref();
        writeln!(
            c,
            "gpu {} {} {} {} {} {} {ccmaj} {ccmin} {} {} {addressing} {} {} {} {} {}",
            g.minor,
            g.uuid,
            g.pci_bus_id,
            model.pci_device_id,
            brand_code(&g.brand),
            arch_code(&g.architecture),
            g.memory_bytes,
            g.numa_node.unwrap_or(-1),
            u8::from(mig.is_some()),
            u8::from(mig.is_some_and(|m| m.enabled)),
            mig.map_or(0, |m| m.memory_slices),
            mig.map_or(0, |m| m.compute_slices),
            g.product_name
        )
        .unwrap();
        let Some(mig) = mig else { continue };
        for p in &mig.profiles {
            writeln!(
                c,
                "profile {} {} {} {} {} {} {} {} {} {} {} {}",
                nvml_profile_index(p),
                p.gi_profile_id,
                p.compute_slices,
                p.max_instances,
                p.multiprocessors,
                p.copy_engines,
                p.decoders,
                p.encoders,
                p.jpeg_engines,
                p.ofa_engines,
                p.memory_mib,
                p.name
            )
            .unwrap();
            for [start, size] in &p.placements {
                writeln!(
                    c,
                    "place {} {start} {size} {}",
                    p.gi_profile_id,
                    sim_mig_uuid(&g.uuid, p.gi_profile_id, *start)
                )
                .unwrap();
            }
        }
        for d in &mig.devices {
            writeln!(c, "gi {} {}", d.gi_profile_id, d.placement_start).unwrap();
        }
    }
    c
}

/// A sysfs tree with each GPU's PCI device under its root complex and its NUMA node, the way
/// `/sys/bus/pci/devices/<id>` links into `/sys/devices/pci<domain>:<bus>/...`.
pub fn fake_sysfs(root: &Path, inv: &Inventory) {
    std::fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
    for g in &inv.gpus {
        let complex = g.pcie_root.clone().unwrap_or_else(|| "pci0000:00".into());
        let bridge = format!("{}:01.0", complex.trim_start_matches("pci"));
        let dev = root
            .join("devices")
            .join(&complex)
            .join(bridge)
            .join(&g.pci_bus_id);
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(
            dev.join("numa_node"),
            format!("{}\n", g.numa_node.unwrap_or(-1)),
        )
        .unwrap();
        let link = root.join("bus/pci/devices").join(&g.pci_bus_id);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&dev, link).unwrap();
    }
}

/// A fake driver installation: `<dir>/root/usr/lib64/libnvidia-ml.so.1` (its own copy, so each
/// test gets its own mock state in-process) with its node description, plus a sysfs tree and the
/// shared state and event files.
pub struct MockNode {
    pub driver_root: PathBuf,
    pub config: PathBuf,
    pub sysfs: PathBuf,
    pub state: PathBuf,
    pub events: PathBuf,
    pub init_gate: PathBuf,
}

impl MockNode {
    pub fn new(dir: &Path, inv: &Inventory) -> Self {
        Self::with_extra(dir, inv, "")
    }

    /// `extra` lines go into the description (e.g. `mig_needs_reset 1` applies to the GPU before it).
    pub fn with_extra(dir: &Path, inv: &Inventory, extra: &str) -> Self {
        let driver_root = dir.join("root");
        let libdir = driver_root.join("usr/lib64");
        std::fs::create_dir_all(&libdir).unwrap();
        std::fs::copy(built_library(), libdir.join("libnvidia-ml.so.1")).unwrap();
        let node = MockNode {
            config: libdir.join("mock-nvml.conf"),
            sysfs: dir.join("sys"),
            state: dir.join("mig-state"),
            events: dir.join("events"),
            init_gate: dir.join("driver-not-loaded"),
            driver_root,
        };
        let files = format!(
            "state {}\nevents {}\nfail_init_while {}\n",
            node.state.display(),
            node.events.display(),
            node.init_gate.display()
        );
        std::fs::write(&node.config, node_config(inv, &(files + extra))).unwrap();
        fake_sysfs(&node.sysfs, inv);
        node
    }

    /// Appends an event line (`xid 0 79`, `dbe 1`, `lost 2`).
    pub fn inject(&self, line: &str) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.events)
            .unwrap();
        writeln!(f, "{line}").unwrap();
    }

    /// The mock's MIG state file: `gi <minor> <gi id> <profile id> <start>` lines and more.
    pub fn state_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.state)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}
