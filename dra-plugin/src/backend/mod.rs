//! Device backends, the implementations of the core's device port
//! ([`dra_plugin_core::backend::DeviceBackend`]): NVML for real GPUs, the core's simulated backend
//! for hardware profiles, and the mock NVML driver root that lets tests run the NVML backend
//! without a GPU. [`build_backend`] picks one from the command line.
use std::path::Path;
use std::sync::Arc;

use dra_plugin_core::backend::DeviceBackend;
use dra_plugin_core::backend::simulated::SimulatedBackend;
use gpu_dra_api::gates::FeatureGates;
use gpu_dra_api::simulated::{GpuGroup, HardwareFile};

use crate::cli::{Backend, DeviceArgs};

pub mod nvml;
pub mod nvml_mock_root;

use nvml::{NvmlBackend, NvmlOptions};

/// The device backend. `state_dir` (the plugin directory) is where a simulated node takes injected
/// health events and, with on-demand MIG, keeps its MIG devices across restarts.
pub fn build_backend(
    args: &DeviceArgs,
    state_dir: Option<&Path>,
) -> anyhow::Result<Arc<dyn DeviceBackend>> {
    Ok(match args.backend {
        Backend::Simulated => {
            let (groups, default_layout) = match &args.hardware.hardware_file {
                Some(path) => (HardwareFile::load(path)?.gpus, args.mig_layout.clone()),
                None => {
                    anyhow::ensure!(
                        !args.hardware.profiles.is_empty(),
                        "--backend simulated needs --profile (e.g. h100-80gb:8) or --hardware-file"
                    );
                    let groups = args
                        .hardware
                        .profiles
                        .iter()
                        .map(|p| GpuGroup::parse(p))
                        .collect::<Result<Vec<_>, _>>()?;
                    (groups, args.mig_layout.clone())
                }
            };
            let gates = FeatureGates::parse(&args.feature_gates)?;
            let layout = if gates.dynamic_mig() {
                None
            } else {
                default_layout
            };
            let mut sim = SimulatedBackend::new(&args.node_name, &groups, layout.as_deref())?;
            if let Some(dir) = state_dir {
                sim = sim.with_health_file(dir.join("simulated-health-events"));
                if args.on_demand_mig {
                    sim = sim.with_mig_state_file(dir.join("simulated-mig.json"))?;
                }
            }
            Arc::new(sim)
        }
        Backend::Nvml => Arc::new(NvmlBackend::with_options(NvmlOptions {
            sysfs_root: args.host.sysfs.clone(),
            ..NvmlOptions::new(args.driver_root.clone())
        })),
    })
}
