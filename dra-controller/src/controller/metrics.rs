//! Prometheus metrics, labelled only by controller name, error kind and pool role (all bounded).
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::error::Error;
use super::pool::PoolPlan;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    pub controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub controller: &'static str,
    pub error: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeStateLabel {
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// On-demand MIG: layout changes by kind, and claims left without a device by reason.
#[derive(Clone, Default)]
pub struct MigMetrics {
    pub changes: Family<KindLabel, Counter>,
    pub unmet: Family<ReasonLabel, Gauge>,
}

#[derive(Clone)]
pub struct ReconcileMetrics {
    runs: Family<ControllerLabel, Counter>,
    failures: Family<FailureLabels, Counter>,
    duration: Family<ControllerLabel, Histogram>,
}

impl ReconcileMetrics {
    /// Counts a run now and records its duration when the guard drops.
    pub fn measure(&self, controller: &'static str) -> Timer<'_> {
        self.runs
            .get_or_create(&ControllerLabel { controller })
            .inc();
        Timer {
            metrics: self,
            controller,
            start: Instant::now(),
        }
    }

    pub fn failure(&self, controller: &'static str, err: &Error) {
        self.failures
            .get_or_create(&FailureLabels {
                controller,
                error: err.metric_label(),
            })
            .inc();
    }
}

pub struct Timer<'a> {
    metrics: &'a ReconcileMetrics,
    controller: &'static str,
    start: Instant,
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        let label = ControllerLabel {
            controller: self.controller,
        };
        self.metrics
            .duration
            .get_or_create(&label)
            .observe(self.start.elapsed().as_secs_f64());
    }
}

#[derive(Clone, Default)]
pub struct PoolMetrics {
    nodes: Family<NodeStateLabel, Gauge>,
}

impl PoolMetrics {
    pub fn set(&self, plan: &PoolPlan) {
        let set = |state, n: usize| {
            self.nodes
                .get_or_create(&NodeStateLabel { state })
                .set(i64::try_from(n).unwrap_or(i64::MAX))
        };
        set("pool", plan.pool_nodes());
        set("ready", plan.ready_nodes());
        set("conflicting", plan.conflicting().len());
        set("draining", plan.draining().len());
    }
}

pub struct Metrics {
    pub reconcile: ReconcileMetrics,
    pub pool: PoolMetrics,
    pub leader: Gauge,
    pub mig: MigMetrics,
}

impl Metrics {
    pub fn new(registry: &mut Registry) -> Self {
        let reconcile = ReconcileMetrics {
            runs: Family::default(),
            failures: Family::default(),
            duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.01, 2.0, 12))
            }),
        };
        let sub = registry.sub_registry_with_prefix("gpu_dra_controller_reconcile");
        sub.register("runs", "Reconcile runs", reconcile.runs.clone());
        sub.register(
            "failures",
            "Reconcile failures by error kind",
            reconcile.failures.clone(),
        );
        sub.register(
            "duration_seconds",
            "Reconcile duration",
            reconcile.duration.clone(),
        );
        let pool = PoolMetrics::default();
        registry.register(
            "gpu_dra_pool_nodes",
            "Migration-pool nodes by state",
            pool.nodes.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "gpu_dra_controller_leader",
            "1 while this replica holds the lease",
            leader.clone(),
        );
        let mig = MigMetrics::default();
        let sub = registry.sub_registry_with_prefix("gpu_dra_mig");
        sub.register(
            "layout_changes",
            "MIG layout changes the controller wrote, by kind",
            mig.changes.clone(),
        );
        sub.register(
            "unmet_claims",
            "Pending claims no MIG change can serve, by reason (last pass)",
            mig.unmet.clone(),
        );
        Self {
            reconcile,
            pool,
            leader,
            mig,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconcile_metrics_are_encoded_with_bounded_labels() {
        let mut registry = Registry::default();
        let m = Metrics::new(&mut registry);
        drop(m.reconcile.measure("gpucluster"));
        m.reconcile.failure("gpucluster", &Error::MissingField("x"));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(
            out.contains(r#"gpu_dra_controller_reconcile_runs_total{controller="gpucluster"} 1"#),
            "{out}"
        );
        assert!(
            out.contains(r#"failures_total{controller="gpucluster",error="missing_field"} 1"#),
            "{out}"
        );
        assert!(out.contains(
            "gpu_dra_controller_reconcile_duration_seconds_count{controller=\"gpucluster\"} 1"
        ));
    }
}
