use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use super::*;
use crate::metrics::Metrics;

/// Sample name to the label-name lists it shows, from OpenMetrics text.
fn samples(text: &str) -> BTreeMap<String, BTreeSet<Vec<String>>> {
    let mut out: BTreeMap<String, BTreeSet<Vec<String>>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (name, labels) = match line.split_once('{') {
            Some((n, rest)) => (n, rest.split_once('}').unwrap().0),
            None => (line.split_once(' ').unwrap().0, ""),
        };
        // Order within a label set means nothing to Prometheus: compare them sorted.
        let mut names: Vec<String> = labels
            .split(',')
            .filter(|kv| !kv.is_empty())
            .map(|kv| kv.split_once('=').unwrap().0.to_string())
            .collect();
        names.sort();
        out.entry(name.to_string()).or_default().insert(names);
    }
    out
}

fn labels(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// A plugin that prepared and unprepared, failed once each way, and holds one MIG device.
fn exercised() -> String {
    let m = Metrics::new();
    m.nvidia.init("gpu.nvidia.com", "node-1", GPU_DEVICE_TYPES);
    let guard = m.nvidia.in_flight("prepare");
    m.nvidia.succeeded("prepare", Duration::from_millis(70));
    drop(guard);
    m.nvidia.succeeded("unprepare", Duration::from_millis(3));
    m.nvidia.failed("prepare", "busy");
    m.nvidia.failed("unprepare", "device");
    m.nvidia.set_prepared(["gpu-0-mig-1g.10gb-19-0"]);
    m.encode()
}

#[test]
fn every_nvidia_series_shows_its_name_type_and_labels() {
    let text = exercised();
    let found = samples(&text);
    for (name, kind, names) in SERIES {
        let family = match *kind {
            "counter" => name.strip_suffix("_total").unwrap(),
            _ => name,
        };
        assert!(
            text.contains(&format!("# TYPE {family} {kind}\n")),
            "{family} {kind}\n{text}"
        );
        let (sample, extra): (String, &[&str]) = match *kind {
            "histogram" => (format!("{name}_bucket"), &["le"]),
            _ => (name.to_string(), &[]),
        };
        let mut want: Vec<String> = labels(names).into_iter().chain(labels(extra)).collect();
        want.sort();
        let got = found
            .get(&sample)
            .unwrap_or_else(|| panic!("{sample}\n{text}"));
        assert_eq!(got, &BTreeSet::from([want]), "{sample}\n{text}");
    }
}

#[test]
fn label_values_and_buckets_are_nvidias() {
    let text = exercised();
    for line in [
        r#"nvidia_dra_requests_total{driver="gpu.nvidia.com",operation="prepare"} 1"#,
        r#"nvidia_dra_requests_total{driver="gpu.nvidia.com",operation="unprepare"} 1"#,
        r#"nvidia_dra_requests_inflight{driver="gpu.nvidia.com",operation="prepare"} 0"#,
        r#"nvidia_dra_request_duration_seconds_bucket{le="0.05",driver="gpu.nvidia.com",operation="prepare"} 0"#,
        r#"nvidia_dra_request_duration_seconds_bucket{le="0.1",driver="gpu.nvidia.com",operation="prepare"} 1"#,
        r#"nvidia_dra_request_duration_seconds_bucket{le="12.8",driver="gpu.nvidia.com",operation="prepare"} 1"#,
        r#"nvidia_dra_node_prepare_errors_total{driver="gpu.nvidia.com",error_type="lock_acquire"} 1"#,
        r#"nvidia_dra_node_unprepare_errors_total{driver="gpu.nvidia.com",error_type="unprepare_devices"} 1"#,
        r#"nvidia_dra_prepared_devices{node="node-1",driver="gpu.nvidia.com",device_type="mig"} 1"#,
        r#"nvidia_dra_prepared_devices{node="node-1",driver="gpu.nvidia.com",device_type="gpu"} 0"#,
        r#"nvidia_dra_prepared_devices{node="node-1",driver="gpu.nvidia.com",device_type="vfio"} 0"#,
        r#"nvidia_dra_prepared_devices{node="node-1",driver="gpu.nvidia.com",device_type="unknown"} 0"#,
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }
    // Nine buckets and +Inf, as NVIDIA's ExponentialBuckets(0.05, 2, 9).
    let buckets = text
        .lines()
        .filter(|l| l.starts_with("nvidia_dra_request_duration_seconds_bucket{"))
        .filter(|l| l.contains(r#"operation="prepare""#))
        .count();
    assert_eq!(buckets, 10, "{text}");
}

#[test]
fn request_series_start_at_zero_and_nothing_counts_before_init() {
    let m = Metrics::new();
    m.nvidia.succeeded("prepare", Duration::ZERO);
    assert!(!m.encode().contains("nvidia_dra_requests_total{"));
    m.nvidia
        .init("compute-domain.nvidia.com", "n", CD_DEVICE_TYPES);
    let text = m.encode();
    for op in ["prepare", "unprepare"] {
        let l = format!(r#"{{driver="compute-domain.nvidia.com",operation="{op}"}} 0"#);
        assert!(
            text.contains(&format!("nvidia_dra_requests_total{l}")),
            "{text}"
        );
        assert!(
            text.contains(&format!("nvidia_dra_requests_inflight{l}")),
            "{text}"
        );
    }
    m.nvidia
        .set_prepared(["channel-0", "daemon-0", "channel-0", "gpu-0"]);
    let text = m.encode();
    for (t, n) in [("channel", 2), ("daemon", 1), ("unknown", 1)] {
        let l = format!(r#"device_type="{t}"}} {n}"#);
        assert!(text.contains(&l), "{l}\n{text}");
    }
}

#[test]
fn device_types_follow_our_device_names() {
    for (name, t) in [
        ("gpu-0", "gpu"),
        ("gpu-3-mig-1g.10gb-19-0", "mig"),
        ("gpu-vfio-1", "vfio"),
        ("channel-0", "channel"),
        ("daemon-0", "daemon"),
        ("other", "unknown"),
    ] {
        assert_eq!(device_type(name), t, "{name}");
    }
}

/// NVIDIA's v0.5.0 source in the Go module cache, when present.
fn nvidia_source() -> Option<PathBuf> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let cache = std::env::var("GOMODCACHE").unwrap_or(format!("{home}/go/pkg/mod"));
    let dir = PathBuf::from(cache).join("sigs.k8s.io/dra-driver-nvidia-gpu@v0.5.0");
    dir.is_dir().then_some(dir)
}

/// `(full name, type, labels)` for each `metrics.New*Vec` of NVIDIA's dra_requests.go.
fn go_series(src: &str) -> BTreeSet<(String, String, Vec<String>)> {
    let mut out = BTreeSet::new();
    for chunk in src.split("metrics.New").skip(1) {
        let kind = match chunk.split('(').next().unwrap() {
            "CounterVec" => "counter",
            "GaugeVec" => "gauge",
            "HistogramVec" => "histogram",
            _ => continue,
        };
        let quoted_after = |key: &str| chunk.split(key).nth(1)?.split('"').nth(1);
        let (Some(ns), Some(name)) = (quoted_after("Namespace:"), quoted_after("Name:")) else {
            continue;
        };
        let list = chunk
            .split("[]string{")
            .nth(1)
            .unwrap()
            .split('}')
            .next()
            .unwrap();
        let labels = list
            .split(',')
            .map(|l| l.trim().trim_matches('"').to_string());
        out.insert((format!("{ns}_{name}"), kind.to_string(), labels.collect()));
    }
    out
}

#[test]
fn series_match_nvidias_go_source() {
    let Some(dir) = nvidia_source() else {
        println!("NVIDIA's v0.5.0 source is not in the Go module cache; skipped");
        return;
    };
    let read = |p: &str| std::fs::read_to_string(dir.join(p)).unwrap();
    let src = read("pkg/metrics/dra_requests.go");
    let ours: BTreeSet<_> = SERIES
        .iter()
        .map(|(n, k, l)| (n.to_string(), k.to_string(), labels(l)))
        .collect();
    assert_eq!(go_series(&src), ours);
    assert!(
        src.contains("ExponentialBuckets(0.05, 2, 9)"),
        "buckets changed"
    );
    // Our error types and device types, as NVIDIA's plugins pass them.
    let gpu = read("cmd/gpu-kubelet-plugin/driver.go");
    for t in ["lock_acquire", "prepare_devices", "unprepare_devices"] {
        assert!(gpu.contains(&format!("Error(DriverName, \"{t}\")")), "{t}");
    }
    let types = read("cmd/gpu-kubelet-plugin/types.go")
        + &read("cmd/gpu-kubelet-plugin/prepared.go")
        + &read("cmd/compute-domain-kubelet-plugin/types.go");
    for t in GPU_DEVICE_TYPES.iter().chain(CD_DEVICE_TYPES) {
        assert!(types.contains(&format!("= \"{t}\"")), "device type {t}");
    }
}
