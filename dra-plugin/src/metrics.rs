//! Prometheus metrics with bounded labels, and the HTTP endpoint that serves them.
use std::net::SocketAddr;
use std::sync::Arc;

use dra_plugin_core::checkpoint::{Checkpoint, ClaimState};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub mod nvidia;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// `prepare`, `unprepare` or `device_metadata` (metadata files not written at prepare).
    pub operation: &'static str,
    /// One of [`crate::Error::reason`]'s fixed values.
    pub reason: &'static str,
}

/// A failed or refused call, or a broken connection, on one of the kubelet's sockets.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SocketErrorLabels {
    /// `registration` or `dra`.
    pub socket: &'static str,
    /// One of [`crate::grpc::observe`]'s fixed reasons.
    pub reason: &'static str,
}

/// A server-side apply of a claim's `status.devices` entries (see [`crate::kube::status`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimStatusLabels {
    /// `apply` (after prepare) or `clear` (after unprepare).
    pub operation: &'static str,
    /// `ok`, `retry` (failed, tried again later) or `dropped` (the claim is gone, replaced or
    /// deallocated, or retries ran out).
    pub result: &'static str,
}

/// A MIG device created or destroyed by on-demand MIG (see [`crate::miglayout`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MigDeviceOperationLabels {
    /// `create` or `destroy`.
    pub op: &'static str,
    /// `ok` or `error`.
    pub result: &'static str,
}

/// A GPU whose wanted MIG layout was not applied, by the refusal's fixed reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MigLayoutRefusalLabels {
    /// `Invalid`, `InUse` or `Failed`.
    pub reason: &'static str,
}

/// A count as a gauge's value (gauges hold an `i64`, which no count comes near).
pub fn gauge_count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub struct Metrics {
    pub registry: Registry,
    pub prepare_duration: Histogram,
    pub unprepare_duration: Histogram,
    pub errors: Family<ErrorLabels, Counter>,
    pub prepared_devices: Gauge,
    pub published_devices: Gauge,
    pub publish_errors: Counter,
    pub socket_errors: Family<SocketErrorLabels, Counter>,
    pub registration_refused: Counter,
    pub claim_status_writes: Family<ClaimStatusLabels, Counter>,
    pub mig_device_operations: Family<MigDeviceOperationLabels, Counter>,
    pub mig_layout_refusals: Family<MigLayoutRefusalLabels, Counter>,
    /// NVIDIA's `nvidia_dra_*` series, for its dashboards and alerts.
    pub nvidia: nvidia::NvidiaMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        // Unprefixed root: our series under `gpu_dra`, NVIDIA's under `nvidia_dra`.
        let mut root = Registry::default();
        let nvidia = nvidia::NvidiaMetrics::register(&mut root);
        let registry = root.sub_registry_with_prefix("gpu_dra");
        // 0.5 ms .. ~16 s
        let buckets = || exponential_buckets(0.0005, 2.0, 16);
        let prepare_duration = Histogram::new(buckets());
        let unprepare_duration = Histogram::new(buckets());
        let errors = Family::<ErrorLabels, Counter>::default();
        let prepared_devices = Gauge::default();
        let published_devices = Gauge::default();
        let publish_errors = Counter::default();
        let socket_errors = Family::<SocketErrorLabels, Counter>::default();
        let registration_refused = Counter::default();
        let claim_status_writes = Family::<ClaimStatusLabels, Counter>::default();
        let mig_device_operations = Family::<MigDeviceOperationLabels, Counter>::default();
        let mig_layout_refusals = Family::<MigLayoutRefusalLabels, Counter>::default();
        registry.register(
            "node_prepare_duration_seconds",
            "Duration of NodePrepareResources calls",
            prepare_duration.clone(),
        );
        registry.register(
            "node_unprepare_duration_seconds",
            "Duration of NodeUnprepareResources calls",
            unprepare_duration.clone(),
        );
        registry.register(
            "claim_errors",
            "Failed claim operations by reason",
            errors.clone(),
        );
        registry.register(
            "prepared_devices",
            "Devices of prepared claims on this node",
            prepared_devices.clone(),
        );
        registry.register(
            "published_devices",
            "Devices published in this node's ResourceSlices",
            published_devices.clone(),
        );
        registry.register(
            "publish_errors",
            "Failed attempts to publish ResourceSlices",
            publish_errors.clone(),
        );
        registry.register(
            "kubelet_socket_errors",
            "Failed or refused calls and broken connections on the kubelet sockets",
            socket_errors.clone(),
        );
        registry.register(
            "registration_refused",
            "NotifyRegistrationStatus calls in which the kubelet refused the plugin",
            registration_refused.clone(),
        );
        registry.register(
            "claim_status_writes",
            "Server-side applies of ResourceClaim status.devices entries by outcome",
            claim_status_writes.clone(),
        );
        registry.register(
            "mig_device_operations",
            "MIG devices created or destroyed for this node's MigLayout, by outcome",
            mig_device_operations.clone(),
        );
        registry.register(
            "mig_layout_refusals",
            "GPUs whose wanted MIG layout was refused or failed, by reason",
            mig_layout_refusals.clone(),
        );
        Metrics {
            registry: root,
            prepare_duration,
            unprepare_duration,
            errors,
            prepared_devices,
            published_devices,
            publish_errors,
            socket_errors,
            registration_refused,
            claim_status_writes,
            mig_device_operations,
            mig_layout_refusals,
            nvidia,
        }
    }

    pub fn error(&self, operation: &'static str, reason: &'static str) {
        self.errors
            .get_or_create(&ErrorLabels { operation, reason })
            .inc();
    }

    pub fn claim_status(&self, operation: &'static str, result: &'static str) {
        self.claim_status_writes
            .get_or_create(&ClaimStatusLabels { operation, result })
            .inc();
    }

    pub fn socket_error(&self, socket: &'static str, reason: &'static str) {
        self.socket_errors
            .get_or_create(&SocketErrorLabels { socket, reason })
            .inc();
    }

    /// Sets ours and NVIDIA's prepared-device gauges from the checkpoint's completed claims.
    pub fn set_prepared(&self, checkpoint: &Checkpoint) {
        checkpoint.with_claims(|claims| {
            let names: Vec<&str> = claims
                .values()
                .filter(|r| r.state == ClaimState::PrepareCompleted)
                .flat_map(|r| r.devices.iter().map(|d| d.device_name.as_str()))
                .collect();
            self.prepared_devices.set(gauge_count(names.len()));
            self.nvidia.set_prepared(names);
        });
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String");
        out
    }
}

/// Serves the metrics at `path` (such as `/metrics`) and `/healthz` until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    path: &str,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<SocketAddr> {
    use axum::routing::get;
    let scrape = get(move || {
        let m = metrics.clone();
        async move {
            (
                [(
                    "content-type",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )],
                m.encode(),
            )
        }
    });
    let app = axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(path, scrape);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::warn!(error = %e, "metrics server stopped");
        }
    });
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_the_documented_series() {
        let m = Metrics::new();
        m.prepare_duration.observe(0.002);
        m.error("prepare", "config");
        m.prepared_devices.set(3);
        m.socket_error("registration", "protocol");
        m.registration_refused.inc();
        m.claim_status("apply", "retry");
        let op = MigDeviceOperationLabels {
            op: "create",
            result: "ok",
        };
        m.mig_device_operations.get_or_create(&op).inc();
        let refusal = MigLayoutRefusalLabels { reason: "InUse" };
        m.mig_layout_refusals.get_or_create(&refusal).inc();
        let text = m.encode();
        for series in [
            "gpu_dra_node_prepare_duration_seconds_bucket",
            "gpu_dra_claim_errors_total{operation=\"prepare\",reason=\"config\"} 1",
            "gpu_dra_prepared_devices 3",
            "gpu_dra_published_devices 0",
            "gpu_dra_kubelet_socket_errors_total{socket=\"registration\",reason=\"protocol\"} 1",
            "gpu_dra_registration_refused_total 1",
            "gpu_dra_claim_status_writes_total{operation=\"apply\",result=\"retry\"} 1",
            "gpu_dra_mig_device_operations_total{op=\"create\",result=\"ok\"} 1",
            "gpu_dra_mig_layout_refusals_total{reason=\"InUse\"} 1",
        ] {
            assert!(text.contains(series), "{series} missing from\n{text}");
        }
    }
}
