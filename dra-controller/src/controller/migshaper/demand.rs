//! Demand, read from the API's objects: which claims pending pods wait for, which of them ask for
//! this driver's devices, which claims hold devices.
use std::collections::{BTreeMap, BTreeSet};

use gpu_dra_api::names::GPU_DRIVER;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use kube::ResourceExt;

use super::decide::PendingClaim;

/// Whether a class selects devices of `gpu.nvidia.com` (its CEL names the driver).
pub fn is_gpu_class(class: &DeviceClass) -> bool {
    let quoted = [format!("'{GPU_DRIVER}'"), format!("\"{GPU_DRIVER}\"")];
    let selectors = class.spec.as_ref().and_then(|s| s.selectors.as_ref());
    selectors.into_iter().flatten().any(|s| {
        s.cel
            .as_ref()
            .is_some_and(|c| quoted.iter().any(|q| c.expression.contains(q.as_str())))
    })
}

/// The class names a claim's requests and their alternatives name.
fn classes_of(claim: &ResourceClaim) -> BTreeSet<&str> {
    let requests = claim
        .spec
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .and_then(|d| d.requests.as_ref());
    let mut out = BTreeSet::new();
    for r in requests.into_iter().flatten() {
        if let Some(e) = &r.exactly {
            out.insert(e.device_class_name.as_str());
        }
        for s in r.first_available.iter().flatten() {
            out.insert(s.device_class_name.as_str());
        }
    }
    out
}

/// Claims with an allocation.
pub fn allocated(claims: &[ResourceClaim]) -> Vec<ResourceClaim> {
    claims
        .iter()
        .filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some()))
        .cloned()
        .collect()
}

/// The claims that pods not yet bound to a node wait for: unallocated, not being deleted, and
/// asking for at least one device of a `gpu.nvidia.com` class.
pub fn pending(
    pods: &[Pod],
    claims: &[ResourceClaim],
    classes: &[DeviceClass],
) -> Vec<PendingClaim> {
    let gpu_classes: BTreeSet<&str> = classes
        .iter()
        .filter(|c| is_gpu_class(c))
        .filter_map(|c| c.metadata.name.as_deref())
        .collect();
    let by_key: BTreeMap<String, &ResourceClaim> = claims
        .iter()
        .map(|c| (key(c.namespace().as_deref(), &c.name_any()), c))
        .collect();
    let mut out = BTreeMap::new();
    for pod in pods.iter().filter(|p| waiting(p)) {
        let ns = pod.namespace();
        for name in claim_names(pod) {
            let k = key(ns.as_deref(), &name);
            let Some(claim) = by_key.get(&k) else {
                continue;
            };
            let unallocated = claim.status.as_ref().is_none_or(|s| s.allocation.is_none());
            let ours = classes_of(claim).iter().any(|c| gpu_classes.contains(c));
            if unallocated && ours && claim.metadata.deletion_timestamp.is_none() {
                out.entry(k.clone()).or_insert_with(|| PendingClaim {
                    key: k,
                    pod: key(ns.as_deref(), &pod.name_any()),
                    claim: (*claim).clone(),
                    node_selector: pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.node_selector.clone())
                        .unwrap_or_default(),
                });
            }
        }
    }
    out.into_values().collect()
}

fn key(ns: Option<&str>, name: &str) -> String {
    format!("{}/{name}", ns.unwrap_or_default())
}

/// Not bound to a node, not being deleted, not finished.
fn waiting(pod: &Pod) -> bool {
    let bound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !bound && pod.metadata.deletion_timestamp.is_none() && matches!(phase, None | Some("Pending"))
}

/// The ResourceClaims a pod uses: named ones, and the generated claims of templates as the
/// pod's status records them.
fn claim_names(pod: &Pod) -> Vec<String> {
    let refs = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref());
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref());
    refs.into_iter()
        .flatten()
        .filter_map(|r| {
            r.resource_claim_name.clone().or_else(|| {
                statuses
                    .into_iter()
                    .flatten()
                    .find(|s| s.name == r.name)
                    .and_then(|s| s.resource_claim_name.clone())
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn class(name: &str, driver: &str) -> DeviceClass {
        serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": { "selectors": [{ "cel": { "expression": format!("device.driver == '{driver}'") } }] },
        }))
        .unwrap()
    }

    fn claim(name: &str, class: &str, allocated: bool) -> ResourceClaim {
        let mut c = json!({
            "metadata": { "name": name, "namespace": "ns" },
            "spec": { "devices": { "requests": [{ "name": "r", "exactly": { "deviceClassName": class } }] } },
        });
        if allocated {
            c["status"] = json!({ "allocation": { "devices": { "results": [] } } });
        }
        serde_json::from_value(c).unwrap()
    }

    /// A pending pod using `claim` through a template (its status names the generated claim).
    fn pod(name: &str, claim: &str, node: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": "ns" },
            "spec": {
                "nodeName": node,
                "nodeSelector": { "zone": "a" },
                "containers": [{ "name": "c" }],
                "resourceClaims": [{ "name": "gpu", "resourceClaimTemplateName": "t" }],
            },
            "status": {
                "phase": "Pending",
                "resourceClaimStatuses": [{ "name": "gpu", "resourceClaimName": claim }],
            },
        }))
        .unwrap()
    }

    #[test]
    fn only_unallocated_gpu_claims_of_unbound_pods_are_pending() {
        let classes = [
            class("mig.nvidia.com", "gpu.nvidia.com"),
            class("other", "example.com"),
        ];
        let claims = [
            claim("mig", "mig.nvidia.com", false),
            claim("done", "mig.nvidia.com", true),
            claim("foreign", "other", false),
            claim("bound", "mig.nvidia.com", false),
        ];
        let pods = [
            pod("p1", "mig", None),
            pod("p2", "done", None),
            pod("p3", "foreign", None),
            pod("p4", "bound", Some("n1")),
            pod("p5", "missing", None),
        ];
        let got = pending(&pods, &claims, &classes);
        let keys: Vec<_> = got
            .iter()
            .map(|p| (p.key.as_str(), p.pod.as_str()))
            .collect();
        assert_eq!(keys, [("ns/mig", "ns/p1")]);
        assert_eq!(
            got[0].node_selector.get("zone").map(String::as_str),
            Some("a")
        );
        assert_eq!(allocated(&claims).len(), 1);
    }
}
