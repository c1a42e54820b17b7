//! Extended resources backed by DRA (KEP-5004, `DRAExtendedResource`): a container asking for
//! `nvidia.com/gpu: 2` gets devices of the DeviceClass whose `spec.extendedResourceName` is that
//! name (or of the class `<c>` for `deviceclass.resource.kubernetes.io/<c>`), through one claim the
//! scheduler makes for the pod. Mirrors `extendeddynamicresources.go` of kube-scheduler 1.37.
use super::SimPod;
use crate::cel::value::quantity::Quantity;
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceClass, DeviceRequest, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::{BTreeMap, BTreeSet};

/// The implicit extended resource name of every DeviceClass: this prefix and the class name.
pub const DEVICE_CLASS_PREFIX: &str = "deviceclass.resource.kubernetes.io/";
/// The annotation that marks the scheduler's extended-resource claim.
const EXTENDED_CLAIM_ANNOTATION: &str = "resource.kubernetes.io/extended-resource-claim";

/// The claim the scheduler makes for `pod`'s extended resources on a node whose own allocatable
/// (a device plugin's) has the resources for which `node_advertises` is true; `None` when DRA
/// serves none of them. An error when a resource is neither advertised nor backed by a class.
pub fn extended_resource_claim(
    pod: &SimPod,
    classes: &[DeviceClass],
    node_advertises: &dyn Fn(&str) -> bool,
) -> Result<Option<ResourceClaim>, String> {
    let containers: Vec<&Container> = pod
        .spec
        .init_containers
        .iter()
        .flatten()
        .chain(&pod.spec.containers)
        .collect();
    let n_init = pod.spec.init_containers.as_ref().map_or(0, Vec::len);
    let requests: Vec<BTreeMap<String, Quantity>> =
        containers.iter().map(|c| effective_requests(c)).collect();
    let names: BTreeSet<&String> = requests
        .iter()
        .flat_map(|r| r.iter())
        .filter(|(name, q)| is_dra_extended_name(name) && q.sign() != 0)
        .map(|(name, _)| name)
        .collect();
    let mut device_requests = Vec::new();
    for name in names {
        let class = class_for(name, classes);
        match class {
            Some(_) if node_advertises(name) => continue,
            None if node_advertises(name) => continue,
            None => {
                return Err(format!(
                    "cannot fit resource {name}: no DeviceClass has it as extendedResourceName and the node does not advertise it"
                ));
            }
            Some(class) => {
                let class_name = class.metadata.name.clone().unwrap_or_default();
                device_requests.extend(requests_for(
                    name,
                    &class_name,
                    &requests,
                    &containers,
                    n_init,
                ));
            }
        }
    }
    if device_requests.is_empty() {
        return Ok(None);
    }
    device_requests.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Some(ResourceClaim {
        metadata: ObjectMeta {
            name: Some(format!("{}-extended-resources", pod.name)),
            namespace: Some(pod.namespace.clone()),
            annotations: Some([(EXTENDED_CLAIM_ANNOTATION.to_string(), "true".to_string())].into()),
            ..Default::default()
        },
        spec: ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(device_requests),
                ..Default::default()
            }),
        }
        .into(),
        status: None,
    }))
}

/// `requests`, with each limit that has no request as its request (the API server's default).
fn effective_requests(c: &Container) -> BTreeMap<String, Quantity> {
    let resources = c.resources.as_ref();
    let limits = resources
        .and_then(|r| r.limits.as_ref())
        .into_iter()
        .flatten();
    let requests = resources
        .and_then(|r| r.requests.as_ref())
        .into_iter()
        .flatten();
    let mut out = BTreeMap::new();
    for (name, q) in limits.chain(requests) {
        if let Ok(q) = Quantity::parse(&q.0) {
            out.insert(name.clone(), q);
        }
    }
    out
}

/// `IsDRAExtendedResourceName`: a domain-prefixed name outside `kubernetes.io`, or a class's
/// implicit name.
fn is_dra_extended_name(name: &str) -> bool {
    let extended =
        name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.");
    extended || name.starts_with(DEVICE_CLASS_PREFIX)
}

/// The class backing `name`: of those naming it, the newest, then the first by name (the
/// scheduler's extended-resource cache); else the class of an implicit name.
fn class_for<'a>(name: &str, classes: &'a [DeviceClass]) -> Option<&'a DeviceClass> {
    let created = |c: &DeviceClass| c.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let explicit = classes
        .iter()
        .filter(|c| {
            c.spec
                .as_ref()
                .and_then(|s| s.extended_resource_name.as_deref())
                == Some(name)
        })
        .max_by(|a, b| {
            created(a)
                .cmp(&created(b))
                .then_with(|| b.metadata.name.cmp(&a.metadata.name))
        });
    explicit.or_else(|| {
        let class = name.strip_prefix(DEVICE_CLASS_PREFIX)?;
        classes
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(class))
    })
}

/// The requests for resource `name` (`createRequestsAndMappings`): one per long-lived container
/// (regular or sidecar) asking for it, `container-<i>-request-<j>` with `i` counted over init
/// containers then containers and `j` the name's place among the container's sorted requests;
/// init containers that run to completion reuse the devices of long-lived containers after them
/// and add only the largest remainder among themselves.
fn requests_for(
    name: &str,
    class: &str,
    requests: &[BTreeMap<String, Quantity>],
    containers: &[&Container],
    n_init: usize,
) -> Vec<DeviceRequest> {
    let make = |i: usize, count: i64| DeviceRequest {
        name: format!(
            "container-{i}-request-{}",
            requests[i].keys().position(|k| k == name).unwrap_or(0)
        ),
        exactly: Some(ExactDeviceRequest {
            device_class_name: class.to_string(),
            allocation_mode: Some("ExactCount".into()),
            count: Some(count),
            ..Default::default()
        }),
        first_available: None,
    };
    let wanted = |i: usize| {
        requests[i]
            .get(name)
            .and_then(Quantity::as_i64)
            .filter(|n| *n != 0)
    };
    let short_lived =
        |i: usize| i < n_init && containers[i].restart_policy.as_deref() != Some("Always");
    let long: Vec<Option<i64>> = (0..containers.len())
        .map(|i| if short_lived(i) { None } else { wanted(i) })
        .collect();
    let mut max_short: Option<(usize, i64)> = None;
    for i in (0..containers.len()).filter(|&i| short_lived(i)) {
        let Some(want) = wanted(i) else { continue };
        let reusable: i64 = long[i..].iter().flatten().sum();
        let extra = want - reusable;
        if extra > 0 && max_short.is_none_or(|(_, m)| m < extra) {
            max_short = Some((i, extra));
        }
    }
    let mut out: Vec<DeviceRequest> = max_short.map(|(i, n)| make(i, n)).into_iter().collect();
    out.extend(
        long.iter()
            .enumerate()
            .filter_map(|(i, n)| n.map(|n| make(i, n))),
    );
    out
}
