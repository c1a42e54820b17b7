//! A mock NVIDIA driver root for running `--backend nvml` without a GPU: the mock libnvidia-ml
//! (`mock-nvml/`, built with the machine's C compiler) plus its node description, generated from
//! the same hardware profiles the simulated backend uses, so both backends see the same GPUs.
//!
//! `dra-plugin mock-nvml-root --profile h100-80gb:8 --node-name N --out DIR` (hidden subcommand;
//! the hardware comes from `--profile`/`--hardware-file`/`--mig-layout` or the same environment
//! variables that select the simulated backend's hardware: `SIMULATED_PROFILES`,
//! `SIMULATED_HARDWARE_FILE`, `SIMULATED_MIG_LAYOUT`) writes:
//!
//! ```text
//! DIR/root/usr/lib64/libnvidia-ml.so.1   the mock (--driver-root DIR/root)
//! DIR/root/usr/lib64/mock-nvml.conf      its node description (format below)
//! DIR/sys/                               sysfs with each GPU's PCIe root and NUMA node (HOST_SYSFS_ROOT)
//! DIR/mig-state                          MIG mode and instances, shared by every process
//! DIR/events                             injected events: `xid <minor> <code>`, `dbe <minor>`, `lost <minor>`
//! DIR/driver-not-loaded                  while it exists, NVML init fails (driver not loaded)
//! ```
//!
//! The description is one record a line (names run to the end of the line):
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
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use gpu_dra_api::inventory::Inventory;
use gpu_dra_api::profiles::{self, MigProfile};
use gpu_dra_api::simulated::{SIM_CUDA_DRIVER_VERSION, sim_mig_uuid};

use crate::cli::{Backend, DeviceArgs, MockRootArgs};

/// Where the mock's sources are in the repository this binary was built from.
pub fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mock-nvml")
}

/// Builds the mock from `source` into the driver-root layout under `out`; the library's path.
pub fn build_library(source: &Path, out: &Path) -> anyhow::Result<PathBuf> {
    let out = std::path::absolute(out)?;
    let o = Command::new("make")
        .arg("-s")
        .arg("-C")
        .arg(source)
        .arg(format!("OUT={}", out.display()))
        .output()
        .with_context(|| format!("running make -C {} (needs make and gcc)", source.display()))?;
    if !o.status.success() {
        bail!(
            "building the mock libnvidia-ml in {} failed:\n{}{}",
            source.display(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(out.join("usr/lib64/libnvidia-ml.so.1"))
}

/// `NVML_GPU_INSTANCE_PROFILE_*` of a profile, from its name (`1g.10gb+me` is `1_SLICE_REV1`...).
pub fn nvml_profile_index(p: &MigProfile) -> anyhow::Result<u32> {
    let c = p.compute_slices;
    let pick = |table: &[u32]| {
        table
            .get((c as usize).wrapping_sub(1))
            .copied()
            .with_context(|| format!("no NVML profile for {} ({c} slices)", p.name))
    };
    if p.name.ends_with("+me.all") {
        return pick(&[15, 16]);
    }
    if p.name.ends_with("-me") {
        return pick(&[13, 14]);
    }
    if p.name.ends_with("+gfx") {
        return Ok(match c {
            1 => 10,
            2 => 11,
            4 => 12,
            _ => bail!("no +gfx NVML profile of {c} slices ({})", p.name),
        });
    }
    if p.name.ends_with("+me") {
        return pick(&[7, 8]);
    }
    if c == 1 && p.memory_slices == 2 {
        return Ok(9); // 1_SLICE_REV2: one compute slice with two memory slices
    }
    Ok(match c {
        1 => 0,
        2 => 1,
        3 => 2,
        4 => 3,
        7 => 4,
        8 => 5,
        6 => 6,
        _ => bail!("no NVML profile of {c} slices ({})", p.name),
    })
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

/// The mock's description of the node `inv` (the simulated backend's view of it); `extra` lines
/// go in before the GPUs.
pub fn node_config(inv: &Inventory, extra: &str) -> anyhow::Result<String> {
    let mut c = String::new();
    let first = inv.gpus.first().context("a node without GPUs")?;
    let (maj, min) = SIM_CUDA_DRIVER_VERSION
        .split_once('.')
        .context("CUDA version")?;
    let cuda: u32 = maj.parse::<u32>()? * 1000 + min.parse::<u32>()? * 10;
    writeln!(c, "driver {}\ncuda {cuda}", first.driver_version)?;
    c.push_str(extra);
    for g in &inv.gpus {
        let model = profiles::catalog()
            .iter()
            .find(|m| m.product_name == g.product_name)
            .with_context(|| format!("{} is not in the hardware profiles", g.product_name))?;
        let (ccmaj, ccmin) = g
            .cuda_compute_capability
            .split_once('.')
            .context("compute capability")?;
        let addressing = match g.addressing_mode.as_deref() {
            Some("None") => 0,
            Some("HMM") => 1,
            Some("ATS") => 2,
            Some(other) => bail!("addressing mode {other:?} has no NVML value"),
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
        )?;
        let Some(mig) = mig else { continue };
        for p in &mig.profiles {
            writeln!(
                c,
                "profile {} {} {} {} {} {} {} {} {} {} {} {}",
                nvml_profile_index(p)?,
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
            )?;
            for [start, size] in &p.placements {
                writeln!(
                    c,
                    "place {} {start} {size} {}",
                    p.gi_profile_id,
                    sim_mig_uuid(&g.uuid, p.gi_profile_id, *start)
                )?;
            }
        }
        for d in &mig.devices {
            writeln!(c, "gi {} {}", d.gi_profile_id, d.placement_start)?;
        }
    }
    Ok(c)
}

/// A sysfs tree with each GPU's PCI device under its root complex and its NUMA node, the way
/// `/sys/bus/pci/devices/<id>` links into `/sys/devices/pci<domain>:<bus>/...`.
pub fn fake_sysfs(root: &Path, inv: &Inventory) -> std::io::Result<()> {
    std::fs::create_dir_all(root.join("bus/pci/devices"))?;
    for g in &inv.gpus {
        let complex = g.pcie_root.clone().unwrap_or_else(|| "pci0000:00".into());
        let bridge = format!("{}:01.0", complex.trim_start_matches("pci"));
        let dev = root
            .join("devices")
            .join(&complex)
            .join(bridge)
            .join(&g.pci_bus_id);
        std::fs::create_dir_all(&dev)?;
        std::fs::write(
            dev.join("numa_node"),
            format!("{}\n", g.numa_node.unwrap_or(-1)),
        )?;
        let link = root.join("bus/pci/devices").join(&g.pci_bus_id);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&dev, link)?;
    }
    Ok(())
}

/// The paths of a mock driver installation written by [`write_root`].
#[derive(Debug, Clone)]
pub struct MockRoot {
    /// `--driver-root` / `NVIDIA_DRIVER_ROOT`.
    pub driver_root: PathBuf,
    pub library: PathBuf,
    pub config: PathBuf,
    /// `HOST_SYSFS_ROOT`.
    pub sysfs: PathBuf,
    pub state: PathBuf,
    pub events: PathBuf,
    pub init_gate: PathBuf,
}

/// Writes a mock driver installation for `inv` under `dir` (layout in the module docs) with its
/// own copy of `library` (so each root gets its own mock state in-process). `extra` lines go into
/// the description (e.g. `mig_needs_reset 1`). An earlier MIG state under `dir` is discarded.
pub fn write_root(
    dir: &Path,
    inv: &Inventory,
    library: &Path,
    extra: &str,
) -> anyhow::Result<MockRoot> {
    let dir = std::path::absolute(dir)?;
    let driver_root = dir.join("root");
    let libdir = driver_root.join("usr/lib64");
    std::fs::create_dir_all(&libdir).with_context(|| format!("creating {}", libdir.display()))?;
    let lib = libdir.join("libnvidia-ml.so.1");
    if std::fs::canonicalize(library).ok() != std::fs::canonicalize(&lib).ok() {
        // Through a temp name: a process may have the old copy mapped.
        let tmp = libdir.join(".libnvidia-ml.so.1.tmp");
        std::fs::copy(library, &tmp).with_context(|| format!("copying {}", library.display()))?;
        std::fs::rename(&tmp, &lib)?;
    }
    let root = MockRoot {
        library: lib,
        config: libdir.join("mock-nvml.conf"),
        sysfs: dir.join("sys"),
        state: dir.join("mig-state"),
        events: dir.join("events"),
        init_gate: dir.join("driver-not-loaded"),
        driver_root,
    };
    for f in [&root.state, &root.events] {
        match std::fs::remove_file(f) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", f.display()));
            }
            _ => {}
        }
    }
    let files = format!(
        "state {}\nevents {}\nfail_init_while {}\n",
        root.state.display(),
        root.events.display(),
        root.init_gate.display()
    );
    std::fs::write(&root.config, node_config(inv, &(files + extra))?)?;
    if root.sysfs.exists() {
        std::fs::remove_dir_all(&root.sysfs)?;
    }
    fake_sysfs(&root.sysfs, inv).with_context(|| format!("writing {}", root.sysfs.display()))?;
    Ok(root)
}

/// `dra-plugin mock-nvml-root`: builds (or copies) the mock and writes its root for the hardware
/// the simulated backend would have with the same flags; prints how to point the plugin at it.
pub fn run(args: MockRootArgs) -> anyhow::Result<()> {
    // The simulated backend's own construction, so the mock is its hardware exactly.
    let device = DeviceArgs {
        node_name: args.node_name.clone(),
        driver_name: gpu_dra_api::names::GPU_DRIVER.to_string(),
        feature_gates: String::new(),
        backend: Backend::Simulated,
        hardware: args.hardware.clone(),
        consumable_shares: Default::default(),
        mig_layout: args.mig_layout.clone(),
        driver_root: None,
        host: Default::default(),
        on_demand_mig: false,
    };
    let inv = crate::backend::build_backend(&device, None)?.discover()?;
    let out = std::path::absolute(&args.out)?;
    let library = match &args.library {
        Some(lib) => lib.clone(),
        None => {
            let source = args.mock_source.clone().unwrap_or_else(source_dir);
            build_library(&source, &out.join("root"))?
        }
    };
    let root = write_root(&out, &inv, &library, "")?;
    println!("# mock NVML driver root for {}", args.node_name);
    println!("export NVIDIA_DRIVER_ROOT={}", root.driver_root.display());
    println!("export HOST_SYSFS_ROOT={}", root.sysfs.display());
    println!(
        "# dra-plugin run --backend nvml --driver-root {} ...; events: echo 'xid <minor> 79' >> {}",
        root.driver_root.display(),
        root.events.display()
    );
    Ok(())
}
