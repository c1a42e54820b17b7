//! The `nvidia_dra_*` series of NVIDIA's kubelet plugins, under their names, types and labels,
//! so that dashboards and alerts written for NVIDIA's driver read ours unchanged. Served beside
//! our own `gpu_dra_*` series, not instead of them.
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// NVIDIA's namespace for these series.
pub const PREFIX: &str = "nvidia_dra";

/// Each series as a scraper sees it: full name, type and label names in order.
pub const SERIES: &[(&str, &str, &[&str])] = &[
    (
        "nvidia_dra_requests_total",
        "counter",
        &["driver", "operation"],
    ),
    (
        "nvidia_dra_request_duration_seconds",
        "histogram",
        &["driver", "operation"],
    ),
    (
        "nvidia_dra_requests_inflight",
        "gauge",
        &["driver", "operation"],
    ),
    (
        "nvidia_dra_prepared_devices",
        "gauge",
        &["node", "driver", "device_type"],
    ),
    (
        "nvidia_dra_node_prepare_errors_total",
        "counter",
        &["driver", "error_type"],
    ),
    (
        "nvidia_dra_node_unprepare_errors_total",
        "counter",
        &["driver", "error_type"],
    ),
];

/// The `device_type` values of the GPU driver, and of the compute-domain driver.
pub const GPU_DEVICE_TYPES: &[&str] = &["gpu", "mig", "vfio", "unknown"];
pub const CD_DEVICE_TYPES: &[&str] = &["channel", "daemon", "unknown"];

/// NVIDIA's duration buckets: 50 ms doubling to 12.8 s.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.05, 2.0, 9))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub driver: String,
    /// `prepare` or `unprepare`.
    pub operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PreparedLabels {
    pub node: String,
    pub driver: String,
    /// One of [`GPU_DEVICE_TYPES`] or [`CD_DEVICE_TYPES`].
    pub device_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorTypeLabels {
    pub driver: String,
    /// `lock_acquire`, `prepare_devices`, `unprepare_devices` (or `publish_resources`, which
    /// this plugin never counts: it republishes outside the kubelet's calls).
    pub error_type: &'static str,
}

/// Who the series speak for, set once the driver name and node are known.
struct Identity {
    driver: String,
    node: String,
    device_types: &'static [&'static str],
}

type DurationFamily = Family<RequestLabels, Histogram, fn() -> Histogram>;

pub struct NvidiaMetrics {
    identity: OnceLock<Identity>,
    requests: Family<RequestLabels, Counter>,
    duration: DurationFamily,
    inflight: Family<RequestLabels, Gauge>,
    prepared: Family<PreparedLabels, Gauge>,
    prepare_errors: Family<ErrorTypeLabels, Counter>,
    unprepare_errors: Family<ErrorTypeLabels, Counter>,
}

/// Lowers `requests_inflight` when the claim's call ends, however it ends.
pub struct InFlight(Option<Gauge>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(g) = &self.0 {
            g.dec();
        }
    }
}

impl NvidiaMetrics {
    /// Registers the series on `registry`, which must carry no prefix of its own.
    pub fn register(registry: &mut Registry) -> Self {
        let m = NvidiaMetrics {
            identity: OnceLock::new(),
            requests: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
            inflight: Family::default(),
            prepared: Family::default(),
            prepare_errors: Family::default(),
            unprepare_errors: Family::default(),
        };
        let r = registry.sub_registry_with_prefix(PREFIX);
        let help = "Total number of DRA prepare and unprepare requests";
        r.register("requests", help, m.requests.clone());
        let help = "Duration of DRA prepare and unprepare requests";
        r.register("request_duration_seconds", help, m.duration.clone());
        let help = "Number of in-flight DRA prepare and unprepare requests";
        r.register("requests_inflight", help, m.inflight.clone());
        let help = "Current number of prepared devices by device type";
        r.register("prepared_devices", help, m.prepared.clone());
        let help = "Total number of failures during DRA node prepare for kubelet plugins";
        r.register("node_prepare_errors", help, m.prepare_errors.clone());
        let help = "Total number of failures during DRA node unprepare for kubelet plugins";
        r.register("node_unprepare_errors", help, m.unprepare_errors.clone());
        m
    }

    /// Names the driver and node, and creates the request series at zero so that the first
    /// scrape already shows them (as NVIDIA's plugins do). Later calls change nothing.
    pub fn init(&self, driver: &str, node: &str, device_types: &'static [&'static str]) {
        let id = self.identity.get_or_init(|| Identity {
            driver: driver.to_string(),
            node: node.to_string(),
            device_types,
        });
        for operation in ["prepare", "unprepare"] {
            let l = self.labels(id, operation);
            drop(self.requests.get_or_create(&l));
            drop(self.duration.get_or_create(&l));
            drop(self.inflight.get_or_create(&l));
        }
    }

    fn labels(&self, id: &Identity, operation: &'static str) -> RequestLabels {
        RequestLabels {
            driver: id.driver.clone(),
            operation,
        }
    }

    /// Raises `requests_inflight` for one claim until the guard drops; nothing before `init`.
    pub fn in_flight(&self, operation: &'static str) -> InFlight {
        let Some(id) = self.identity.get() else {
            return InFlight(None);
        };
        let labels = self.labels(id, operation);
        // A gauge's clone shares its value, so the guard lowers the family's own series.
        let gauge = self.inflight.get_or_create(&labels).clone();
        gauge.inc();
        InFlight(Some(gauge))
    }

    /// A claim done without error: NVIDIA counts and times only those.
    pub fn succeeded(&self, operation: &'static str, took: Duration) {
        if let Some(id) = self.identity.get() {
            let l = self.labels(id, operation);
            self.requests.get_or_create(&l).inc();
            self.duration.get_or_create(&l).observe(took.as_secs_f64());
        }
    }

    /// A claim that failed; `reason` is [`crate::Error::reason`]'s value.
    pub fn failed(&self, operation: &'static str, reason: &'static str) {
        let Some(id) = self.identity.get() else {
            return;
        };
        let (family, error_type) = match (operation, reason) {
            // The checkpoint lock held by another process: NVIDIA's lock timeout.
            (_, "busy") => (self.family(operation), "lock_acquire"),
            ("prepare", _) => (&self.prepare_errors, "prepare_devices"),
            _ => (&self.unprepare_errors, "unprepare_devices"),
        };
        let driver = id.driver.clone();
        family
            .get_or_create(&ErrorTypeLabels { driver, error_type })
            .inc();
    }

    fn family(&self, operation: &str) -> &Family<ErrorTypeLabels, Counter> {
        match operation {
            "prepare" => &self.prepare_errors,
            _ => &self.unprepare_errors,
        }
    }

    /// Sets `prepared_devices` for every type of this driver from the names of the devices of
    /// completed claims; types with none read zero.
    pub fn set_prepared<'a>(&self, device_names: impl IntoIterator<Item = &'a str>) {
        let Some(id) = self.identity.get() else {
            return;
        };
        let mut counts: BTreeMap<&str, i64> = id.device_types.iter().map(|t| (*t, 0)).collect();
        for name in device_names {
            let t = device_type(name);
            let t = if counts.contains_key(t) { t } else { "unknown" };
            *counts.entry(t).or_default() += 1;
        }
        for t in id.device_types {
            let labels = PreparedLabels {
                node: id.node.clone(),
                driver: id.driver.clone(),
                device_type: t,
            };
            self.prepared.get_or_create(&labels).set(counts[t]);
        }
    }
}

/// The `device_type` of a prepared device, from the device names our slices publish.
pub fn device_type(name: &str) -> &'static str {
    if name.starts_with("channel-") {
        "channel"
    } else if name.starts_with("daemon-") {
        "daemon"
    } else if name.starts_with("gpu-vfio-") {
        "vfio"
    } else if name.starts_with("gpu-") && name.contains("-mig-") {
        "mig"
    } else if name.starts_with("gpu-") {
        "gpu"
    } else {
        "unknown"
    }
}

#[cfg(test)]
mod tests;
