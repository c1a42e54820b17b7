//! What the reconciler reads and writes besides its object's status: the object itself, the
//! claims that hold devices, the published slices.
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use dra_plugin_core::miglayout::Refusal;
use gpu_dra_api::miglayout::MigLayout;
use gpu_dra_api::names::MIG_LAYOUT_PLUGIN_FIELD_MANAGER;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};

use super::{Reconciler, failed};
use crate::Error;

/// How long the API server may take to show slices without the withdrawn devices; past it the
/// change is given up for this pass (the publisher retries on its own).
const UNPUBLISH_TIMEOUT: Duration = Duration::from_secs(30);

impl Reconciler {
    /// Creates the node's MigLayout with an empty spec, owned by the Node (deleted with it).
    pub(super) async fn create(&self) -> Result<MigLayout, Error> {
        let node = Api::<Node>::all(self.client.clone())
            .get(&self.node)
            .await?;
        let body = serde_json::json!({
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "MigLayout",
            "metadata": {
                "name": self.node,
                "ownerReferences": [{
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": self.node,
                    "uid": node.metadata.uid.unwrap_or_default(),
                }],
            },
            "spec": {},
        });
        let params = PatchParams::apply(MIG_LAYOUT_PLUGIN_FIELD_MANAGER);
        let made = self
            .api()
            .patch(&self.node, &params, &Patch::Apply(body))
            .await?;
        tracing::info!(node = %self.node, "created this node's MigLayout");
        Ok(made)
    }

    /// Devices that must not change: prepared here (the checkpoint) or allocated in any
    /// ResourceClaim (this driver, this node's pool), prepared or not yet.
    pub(super) async fn held(&self) -> Result<BTreeSet<String>, Refusal> {
        let mut held = self.state.held_devices();
        let claims = Api::<ResourceClaim>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| failed(format!("cannot list ResourceClaims: {e}")))?;
        held.extend(allocated(&claims.items, &self.driver, &self.node));
        Ok(held)
    }

    /// Waits until no slice of this node publishes any of `names`.
    pub(super) async fn wait_unpublished(&self, names: &BTreeSet<String>) -> Result<(), Refusal> {
        let api = Api::<ResourceSlice>::all(self.client.clone());
        let lp = ListParams::default().fields(&format!(
            "spec.nodeName={},spec.driver={}",
            self.node, self.driver
        ));
        let deadline = Instant::now() + UNPUBLISH_TIMEOUT;
        loop {
            match api.list(&lp).await {
                Ok(list) if !publishes_any(&list.items, names) => return Ok(()),
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "listing slices failed; trying again"),
            }
            if Instant::now() > deadline {
                return Err(failed(format!(
                    "the slices still publish {names:?} after {UNPUBLISH_TIMEOUT:?}; not changed"
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The devices of `driver` in pool `pool` that these claims are allocated.
pub(crate) fn allocated(claims: &[ResourceClaim], driver: &str, pool: &str) -> BTreeSet<String> {
    claims
        .iter()
        .filter_map(|c| c.status.as_ref()?.allocation.as_ref()?.devices.as_ref())
        .flat_map(|d| d.results.iter().flatten())
        .filter(|r| r.driver == driver && r.pool == pool)
        .map(|r| r.device.clone())
        .collect()
}

fn publishes_any(slices: &[ResourceSlice], names: &BTreeSet<String>) -> bool {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .any(|d| names.contains(&d.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocated_devices_are_this_drivers_in_this_pool() {
        let claim = |driver: &str, pool: &str, device: &str| -> ResourceClaim {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "c", "namespace": "ns"},
                "spec": {},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "r", "driver": driver, "pool": pool, "device": device}
                ]}}}
            }))
            .unwrap()
        };
        let unallocated: ResourceClaim =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "u"}, "spec": {}}))
                .unwrap();
        let claims = [
            claim("gpu.nvidia.com", "n1", "gpu-0"),
            claim("gpu.nvidia.com", "n2", "gpu-1"),
            claim("other.example.com", "n1", "gpu-2"),
            claim("gpu.nvidia.com", "n1", "gpu-3-mig-3g40gb-9-4"),
            unallocated,
        ];
        let got = allocated(&claims, "gpu.nvidia.com", "n1");
        let want: BTreeSet<String> = ["gpu-0", "gpu-3-mig-3g40gb-9-4"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(got, want);
    }
}
