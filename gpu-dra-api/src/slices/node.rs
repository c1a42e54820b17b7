//! The slices a simulated node publishes, shaped by the same plugin settings as a real node's:
//! the simulator, `dra-plugin slices` tests and the benchmarks share this.
use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::ResourceSlice;

use super::{
    ConsumableShares, SliceOptions, TaintMap, add_passthrough_devices, build_pool,
    enable_consumable_shares, to_resource_slices,
};
use crate::simulated::{GpuGroup, simulate_node};
use crate::{Error, Result};

/// A simulated node: its hardware profiles and the plugin settings that change its slices.
#[derive(Debug, Clone, Default)]
pub struct SimulatedNode<'a> {
    pub name: &'a str,
    /// Hardware profiles such as `h100-80gb:8`.
    pub profiles: &'a [&'a str],
    /// A static MIG layout (ignored with `dynamic_mig`, which starts with MIG mode off).
    pub mig_layout: Option<&'a str>,
    /// `DynamicMIG`: every MIG placement published, with shared counters.
    pub dynamic_mig: bool,
    /// `PassthroughSupport`: a `gpu-vfio-<index>` device per GPU without MIG devices.
    pub passthrough: bool,
    /// `--consumable-shares` (with the `ConsumableShares` gate).
    pub consumable_shares: ConsumableShares,
}

impl SimulatedNode<'_> {
    /// The node's ResourceSlices as a cluster >= 1.35 gets them, nothing held yet. NVIDIA's plugin
    /// refuses DynamicMIG with PassthroughSupport, and so does this.
    pub fn slices(&self) -> Result<Vec<ResourceSlice>> {
        if self.dynamic_mig && self.passthrough {
            return Err(Error::FeatureGates(
                "feature gate DynamicMIG is currently mutually exclusive with PassthroughSupport"
                    .into(),
            ));
        }
        let groups = self
            .profiles
            .iter()
            .map(|p| GpuGroup::parse(p))
            .collect::<Result<Vec<_>>>()?;
        let layout = self.mig_layout.filter(|_| !self.dynamic_mig);
        let inv = simulate_node(self.name, &groups, layout)?;
        let opts = SliceOptions {
            dynamic_mig: self.dynamic_mig,
            ..SliceOptions::new(self.name)
        };
        let mut contents = build_pool(&inv, &opts, &TaintMap::new());
        if self.passthrough {
            add_passthrough_devices(&mut contents, &inv, &BTreeSet::new());
        }
        enable_consumable_shares(&mut contents, self.consumable_shares);
        Ok(to_resource_slices(contents, &opts, 1, None))
    }
}

/// The slices of a simulated node with default plugin settings but for MIG.
pub fn simulated_node_slices(
    node_name: &str,
    profiles: &[&str],
    mig_layout: Option<&str>,
    dynamic_mig: bool,
) -> Result<Vec<ResourceSlice>> {
    SimulatedNode {
        name: node_name,
        profiles,
        mig_layout,
        dynamic_mig,
        ..Default::default()
    }
    .slices()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(slices: &[ResourceSlice]) -> Vec<&str> {
        slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.as_str()))
            .collect()
    }

    #[test]
    fn a_simulated_node_publishes_vfio_devices_with_the_gate() {
        let node = SimulatedNode {
            name: "n",
            profiles: &["h100-80gb:2"],
            passthrough: true,
            ..Default::default()
        };
        let slices = node.slices().unwrap();
        assert_eq!(
            names(&slices),
            ["gpu-0", "gpu-1", "gpu-vfio-0", "gpu-vfio-1"]
        );
        let both = SimulatedNode {
            dynamic_mig: true,
            ..node
        };
        assert!(
            both.slices()
                .unwrap_err()
                .to_string()
                .contains("DynamicMIG")
        );
    }

    #[test]
    fn consumable_shares_make_gpus_shareable_but_not_vfio_devices() {
        let node = SimulatedNode {
            name: "n",
            profiles: &["h100-80gb:1"],
            passthrough: true,
            consumable_shares: ConsumableShares::Shares(4),
            ..Default::default()
        };
        let slices = node.slices().unwrap();
        let devices: Vec<_> = slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .collect();
        let gpu = devices.iter().find(|d| d.name == "gpu-0").unwrap();
        assert_eq!(gpu.allow_multiple_allocations, Some(true));
        let shares = &gpu.capacity.as_ref().unwrap()["shares"];
        assert_eq!(shares.value.0, "4");
        let vfio = devices.iter().find(|d| d.name == "gpu-vfio-0").unwrap();
        assert_eq!(vfio.allow_multiple_allocations, None);
    }
}
