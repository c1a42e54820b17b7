//! `PassthroughSupport` wiring: the PCI bus the core binds on, PCI facts for GPUs the backend
//! found without them (NVML), and republishing when a claim takes a GPU as gpu or vfio.
use std::collections::BTreeSet;
use std::sync::Arc;

use dra_plugin_core::state::DeviceState;
use dra_plugin_core::vfio::PciBus;
use gpu_dra_api::gates::FeatureGates;
use gpu_dra_api::inventory::Inventory;
use gpu_dra_api::slices::{SliceContent, add_passthrough_devices};
use tokio::sync::watch;

use crate::cli::HostRoots;

/// The host's PCI bus under PassthroughSupport (`--host-sysfs-root`, `--host-dev-root`).
pub(super) fn pci_bus(gates: &FeatureGates, host: &HostRoots) -> Option<PciBus> {
    gates
        .enabled("PassthroughSupport")
        .then(|| PciBus::new(&host.sysfs, &host.dev))
}

/// Fills in what sysfs says about each GPU's PCI function; the node's iommufd support wins over
/// a backend's guess.
pub(super) fn fill_pci(inv: &mut Inventory, bus: &PciBus) {
    for g in &mut inv.gpus {
        match g.pci.as_mut() {
            Some(p) => p.iommufd = bus.iommufd_enabled(),
            None => g.pci = bus.pci_function(&g.pci_bus_id),
        }
    }
}

/// `dra-plugin slices`: the passthrough devices of a node where nothing is held.
pub(super) fn add_unheld(
    contents: &mut Vec<SliceContent>,
    mut inv: Inventory,
    gates: &FeatureGates,
    host: &HostRoots,
) {
    if let Some(bus) = pci_bus(gates, host) {
        fill_pci(&mut inv, &bus);
        add_passthrough_devices(contents, &inv, &BTreeSet::new());
    }
}

pub(super) fn attach(state: DeviceState, bus: Option<PciBus>) -> DeviceState {
    match bus {
        Some(b) => state.with_pci_bus(b),
        None => state,
    }
}

/// Adds the passthrough devices, leaving out the sibling of whatever is held now.
pub(super) fn add_to_pool(contents: &mut Vec<SliceContent>, inv: &Inventory, state: &DeviceState) {
    add_passthrough_devices(contents, inv, &state.held_devices());
}

/// Sends a fresh pool each time a claim comes or goes (NVIDIA republishes after each call).
pub(super) fn spawn_republish(
    state: Arc<DeviceState>,
    tx: watch::Sender<Vec<SliceContent>>,
    pool: impl Fn() -> Vec<SliceContent> + Send + 'static,
) {
    let mut changes = state.held_changes();
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            if tx.send(pool()).is_err() {
                return;
            }
        }
    });
}
