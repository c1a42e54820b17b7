//! `--on-demand-mig` wiring: the MigLayout reconciler with the state, backend and publisher hooks.
use std::sync::Arc;

use dra_plugin_core::backend::DeviceBackend;
use dra_plugin_core::state::DeviceState;

use crate::cli::RunArgs;
use crate::metrics::Metrics;
use crate::miglayout::{Reconciler, Withheld};

pub(super) fn reconciler(
    client: kube::Client,
    args: &RunArgs,
    (state, backend): (Arc<DeviceState>, Arc<dyn DeviceBackend>),
    (withheld, republish): (Withheld, Arc<dyn Fn() + Send + Sync>),
    metrics: Arc<Metrics>,
) -> Reconciler {
    Reconciler {
        client,
        node: args.device.node_name.clone(),
        driver: args.device.driver_name.clone(),
        state,
        backend,
        withheld,
        republish,
        metrics,
    }
}
