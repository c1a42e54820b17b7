//! Fuzzes the opaque-config decoder (`OpaqueConfig::decode`) and what applies a decoded config
//! (`device_config`, `compute_domain_config`): random JSON shaped like the configs (their field
//! names and kinds, values of every JSON type, deep nesting) and mutated JSON text of valid
//! configs. Every input must be answered, with a config or an error: no panic, no hang. See
//! `fuzz/harness.rs` for the knobs (`SIM_FUZZ_CASES=100` for a longer run).
#[path = "fuzz/harness.rs"]
mod harness;

use gpu_dra_api::config::{API_VERSION, OpaqueConfig};
use gpu_dra_api::gates::FeatureGates;
use harness::{Rng, cases, mutate, rng, run};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};

/// How many inputs decoded, and how many of those applied to their kind of device: the fuzzer
/// must get past the first checks often enough to mean something.
static DECODED: AtomicUsize = AtomicUsize::new(0);
static APPLIED: AtomicUsize = AtomicUsize::new(0);

const KINDS: &[&str] = &[
    "GpuConfig",
    "MigDeviceConfig",
    "VfioDeviceConfig",
    "ComputeDomainChannelConfig",
    "ComputeDomainDaemonConfig",
    "ComputeDomain",
    "gpuconfig",
    "",
];

const FIELDS: &[&str] = &[
    "sharing",
    "strategy",
    "timeSlicingConfig",
    "mpsConfig",
    "interval",
    "defaultActiveThreadPercentage",
    "defaultPinnedDeviceMemoryLimit",
    "defaultPerDevicePinnedMemoryLimit",
    "multiUser",
    "iommu",
    "backendPolicy",
    "enableAPIDevice",
    "domainID",
    "allocationMode",
    "apiVersion",
    "kind",
    "Sharing",
    "0",
    "GPU-0",
];

const STRINGS: &[&str] = &[
    "TimeSlicing",
    "MPS",
    "Default",
    "Short",
    "Medium",
    "Long",
    "All",
    "Single",
    "PreferIommuFD",
    "10Ki",
    "1Gi",
    "-1Gi",
    "0",
    "1e3",
    "1.5",
    "1048575.5",
    "99999999999999999999Ei",
    "Gi",
    "",
    " ",
    "é",
    "\u{0}",
];

/// A JSON value, mostly shaped like a config's fields.
fn value(r: &mut Rng, depth: usize) -> Value {
    match r.n(if depth == 0 { 5 } else { 8 }) {
        0 => Value::Null,
        1 => json!(r.coin(50)),
        2 => json!(*r.pick(&[0, 1, -1, 50, 100, 101, i64::MAX, i64::MIN])),
        3 => json!(*r.pick(&[0.5, -0.0, 1e308, -1e308, 100.0])),
        4 => json!(*r.pick(STRINGS)),
        5 => Value::Array((0..r.n(3)).map(|_| value(r, depth - 1)).collect()),
        _ => object(r, depth - 1),
    }
}

fn object(r: &mut Rng, depth: usize) -> Value {
    let mut m = serde_json::Map::new();
    for _ in 0..r.n(4) {
        let f = *r.pick(FIELDS);
        m.insert(f.into(), value(r, depth));
    }
    Value::Object(m)
}

/// A config: mostly the right apiVersion and a known kind, fields of any of the kinds.
fn config(r: &mut Rng) -> Value {
    let mut v = object(r, 4);
    if let Value::Object(m) = &mut v {
        if r.coin(90) {
            m.insert("apiVersion".into(), json!(API_VERSION));
        }
        if r.coin(90) {
            m.insert("kind".into(), json!(*r.pick(KINDS)));
        }
    }
    v
}

/// Valid configs whose text is mutated.
const SEEDS: &[&str] = &[
    r#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}"#,
    r#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":50,"defaultPinnedDeviceMemoryLimit":"10Gi","defaultPerDevicePinnedMemoryLimit":{"0":"5Gi"}}}}"#,
    r#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig","sharing":{"strategy":"MPS","mpsConfig":{"multiUser":true}}}"#,
    r#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"VfioDeviceConfig","iommu":{"backendPolicy":"PreferIommuFD","enableAPIDevice":true}}"#,
    r#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"ComputeDomainChannelConfig","domainID":"uid-1","allocationMode":"All"}"#,
    r#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"ComputeDomainDaemonConfig","domainID":"uid-1"}"#,
];

const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "null",
    "true",
    "1e999",
    "-0",
    "\"\"",
    "\"x\"",
    "\\u0000",
    "\\ud800",
    "\"sharing\":",
    "\"strategy\":\"MPS\"",
    "[[[[[[[[",
    "]]]]]]]]",
];

/// Decodes, then applies the config the way the plugin does for its kind of device.
fn check(v: &Value) {
    let Ok(c) = OpaqueConfig::decode(v, "p") else {
        return;
    };
    DECODED.fetch_add(1, Ordering::Relaxed);
    let device = c.device_config(&FeatureGates::default(), "p").is_ok();
    let domain = c.compute_domain_config("p").is_ok();
    if device || domain {
        APPLIED.fetch_add(1, Ordering::Relaxed);
    }
    let _ = (c.kind_name(), c.device_kind(), c.compute_domain_kind());
}

fn inputs(r: &mut Rng, n: usize) -> Vec<Value> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        if r.coin(50) {
            out.push(config(r));
            continue;
        }
        let (seed, other) = (*r.pick(SEEDS), *r.pick(SEEDS));
        let text = mutate(r, seed, TOKENS, other);
        // what does not parse never reaches the decoder
        if let Ok(v) = serde_json::from_str(&text) {
            out.push(v);
        }
    }
    out
}

#[test]
fn opaque_config_decoder_survives_random_input() {
    let mut r = rng(1);
    let n = cases(20_000);
    run("opaque-config", inputs(&mut r, n), check);
    let (decoded, applied) = (
        DECODED.load(Ordering::Relaxed),
        APPLIED.load(Ordering::Relaxed),
    );
    eprintln!("opaque-config: {decoded} decoded, {applied} applied");
    assert!(
        decoded * 50 >= n && applied * 200 >= n,
        "too few valid configs"
    );
}
