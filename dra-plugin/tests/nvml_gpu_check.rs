//! The check on a real NVIDIA GPU, in one go and read-only (never changes MIG mode, never creates
//! instances, never resets a GPU):
//!
//! ```text
//! cargo test -p dra-plugin --test nvml_gpu_check -- --ignored --nocapture
//! ```
//!
//! (`NVIDIA_DRIVER_ROOT=/run/nvidia/driver` for operator-installed drivers.) It prints what
//! `dra-plugin slices --backend nvml` publishes on this machine and checks it against NVML's own
//! view through nvml-wrapper's safe API: name, UUID, memory and MIG mode of every GPU. On a
//! machine without an NVIDIA GPU it fails, saying so. `bash e2e/gpu-check.sh` builds and runs it
//! in one go and keeps a log.
use std::collections::BTreeMap;
use std::process::Command;

use gpu_dra_api::quantity::format_bytes;
use nvml_wrapper::Nvml;

const BIN: &str = env!("CARGO_BIN_EXE_dra-plugin");

fn nvml() -> Nvml {
    let lib = std::env::var_os("NVIDIA_DRIVER_ROOT").and_then(|root| {
        [
            "usr/lib64",
            "usr/lib/x86_64-linux-gnu",
            "usr/lib/aarch64-linux-gnu",
            "usr/lib",
        ]
        .iter()
        .map(|d| {
            std::path::Path::new(&root)
                .join(d)
                .join("libnvidia-ml.so.1")
        })
        .find(|p| p.exists())
    });
    let mut b = Nvml::builder();
    if let Some(lib) = &lib {
        b.lib_path(lib.as_os_str());
    }
    b.init().unwrap_or_else(|e| {
        panic!("no NVML on this machine ({e}): this check needs an NVIDIA GPU and its driver")
    })
}

fn attr<'a>(d: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    d["attributes"][name]["string"].as_str()
}

#[test]
#[ignore = "needs a real NVIDIA GPU: cargo test -p dra-plugin --test nvml_gpu_check -- --ignored"]
fn published_slices_agree_with_nvml_on_this_gpu() {
    let nvml = nvml();
    let out = Command::new(BIN)
        .args([
            "slices",
            "--backend",
            "nvml",
            "--node-name",
            "gpu-check",
            "-o",
            "json",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "dra-plugin slices failed:\n{stderr}");
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    println!("=== dra-plugin slices --backend nvml ===");
    println!("{}", serde_json::to_string_pretty(&list).unwrap());

    let mut devices: BTreeMap<String, &serde_json::Value> = BTreeMap::new();
    for slice in list["items"].as_array().expect("a list of slices") {
        for d in slice["spec"]["devices"].as_array().into_iter().flatten() {
            devices.insert(d["name"].as_str().unwrap().to_string(), d);
        }
    }
    let count = nvml.device_count().unwrap();
    assert!(count > 0, "NVML sees no GPUs");
    println!("=== NVML's own view ===");
    for i in 0..count {
        let d = nvml.device_by_index(i).unwrap();
        let (minor, uuid, name) = (
            d.minor_number().unwrap(),
            d.uuid().unwrap(),
            d.name().unwrap(),
        );
        let total = d.memory_info().unwrap().total;
        let mig_on = d.mig_mode().map(|m| m.current == 1).unwrap_or(false);
        let mig_devices = if mig_on {
            (0..d.mig_device_count().unwrap_or(0))
                .filter(|k| d.mig_device_by_index(*k).is_ok())
                .count()
        } else {
            0
        };
        println!(
            "gpu-{minor}: {name} {uuid} memory {} MIG {} ({mig_devices} MIG devices)",
            format_bytes(total),
            if mig_on { "on" } else { "off" }
        );
        let key = format!("gpu-{minor}");
        if mig_on {
            assert!(
                !devices.contains_key(&key),
                "{key} is in MIG mode: published as its MIG devices, not whole"
            );
            let published = devices
                .values()
                .filter(|p| attr(p, "parentUUID") == Some(uuid.as_str()))
                .count();
            assert_eq!(published, mig_devices, "MIG devices of {key}");
        } else {
            let p = devices
                .get(&key)
                .unwrap_or_else(|| panic!("{key} is not published"));
            assert_eq!(attr(p, "uuid"), Some(uuid.as_str()), "{key} UUID");
            assert_eq!(attr(p, "productName"), Some(name.as_str()), "{key} name");
            assert_eq!(
                p["capacity"]["memory"]["value"].as_str(),
                Some(format_bytes(total).as_str()),
                "{key} memory"
            );
        }
    }
    println!("=== agree: {count} GPU(s) ===");
}
