//! What a workload asks of the device plugin: `nvidia.com/gpu`, `nvidia.com/mig-<profile>` and
//! their `.shared` renames (time-slicing with `renameByDefault`) in container resources.
use super::nodes::mig_profile_name;
use crate::workloads::Workload;
use crate::{Error, Result};
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// The kind of device a device-plugin resource stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Device {
    /// `nvidia.com/gpu`: a whole GPU (a MIG device under `mig.strategy=single`).
    Gpu,
    /// `nvidia.com/mig-<profile>`: a MIG device of that profile.
    Mig(String),
}

/// One container's ask for one resource.
#[derive(Debug, Clone)]
pub struct Ask {
    /// `containers` or `initContainers`.
    pub list: &'static str,
    pub index: usize,
    pub container: String,
    /// The resource name as written (`nvidia.com/gpu`).
    pub resource: String,
    pub device: Device,
    pub count: i64,
    /// `.shared`: only time-sliced GPUs serve it.
    pub shared: bool,
    /// An init container that runs to completion before the others start (not a sidecar).
    pub runs_first: bool,
}

/// Where a workload kind keeps its pod template in the object, as a JSON pointer.
pub fn template_pointer(kind: &str) -> &'static str {
    match kind {
        "Pod" => "",
        "PodTemplate" => "/template",
        "CronJob" => "/spec/jobTemplate/spec/template",
        _ => "/spec/template",
    }
}

/// The same place as a field path for messages (`spec.template.spec.containers[0]`).
fn field_prefix(kind: &str) -> String {
    let p = template_pointer(kind)
        .trim_start_matches('/')
        .replace('/', ".");
    if p.is_empty() { p } else { format!("{p}.") }
}

/// The asks of `w`'s containers; other `nvidia.com/*` resources go to `unknown` (left as they
/// are). Errors name the workload and the field.
pub fn asks_of(w: &Workload, unknown: &mut Vec<String>) -> Result<Vec<Ask>> {
    let Some(spec) = w.template.spec.as_ref() else {
        return Ok(vec![]);
    };
    let mut out = Vec::new();
    let lists = [
        (
            "initContainers",
            spec.init_containers.as_deref().unwrap_or(&[]),
        ),
        ("containers", spec.containers.as_slice()),
    ];
    for (list, containers) in lists {
        for (index, c) in containers.iter().enumerate() {
            let at = format!("{}spec.{list}[{index}].resources", field_prefix(&w.kind));
            for (resource, count) in container_resources(c, &at, w)? {
                let Some((device, shared)) = device_of(&resource) else {
                    unknown.push(format!("{}: {at}: {resource}", w.origin));
                    continue;
                };
                if count == 0 {
                    continue;
                }
                out.push(Ask {
                    runs_first: list == "initContainers"
                        && c.restart_policy.as_deref() != Some("Always"),
                    list,
                    index,
                    container: c.name.clone(),
                    resource,
                    device,
                    count,
                    shared,
                });
            }
        }
    }
    Ok(out)
}

/// The device kind of a resource name, and whether it is a `.shared` rename.
fn device_of(resource: &str) -> Option<(Device, bool)> {
    let name = resource.strip_prefix("nvidia.com/")?;
    let (name, shared) = match name.strip_suffix(".shared") {
        Some(n) => (n, true),
        None => (name, false),
    };
    if name == "gpu" {
        return Some((Device::Gpu, shared));
    }
    let profile = name.strip_prefix("mig-")?;
    Some((Device::Mig(mig_profile_name(profile)), shared))
}

/// The container's `nvidia.com/*` amounts: the limit, else the request (extended resources
/// must have them equal when both are set, as the API server requires).
fn container_resources(c: &Container, at: &str, w: &Workload) -> Result<BTreeMap<String, i64>> {
    let r = c.resources.as_ref();
    let limits = r.and_then(|r| r.limits.as_ref());
    let requests = r.and_then(|r| r.requests.as_ref());
    let mut out = BTreeMap::new();
    for (field, map) in [("limits", limits), ("requests", requests)] {
        for (name, q) in map.into_iter().flatten() {
            if !name.starts_with("nvidia.com/") {
                continue;
            }
            let n = whole(q).ok_or_else(|| {
                Error::Invalid(format!(
                    "{}: field {at}.{field}.{name}: {:?} is not a whole number of devices",
                    w.origin, q.0
                ))
            })?;
            match out.get(name) {
                Some(&limit) if limit != n => {
                    return Err(Error::Invalid(format!(
                        "{}: field {at}.requests.{name}: {n} differs from the limit {limit} \
                         (the API server requires them equal for extended resources)",
                        w.origin
                    )));
                }
                _ => {
                    out.insert(name.clone(), n);
                }
            }
        }
    }
    Ok(out)
}

fn whole(q: &Quantity) -> Option<i64> {
    q.0.trim().parse::<i64>().ok().filter(|n| *n >= 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_names_map_to_devices() {
        assert_eq!(device_of("nvidia.com/gpu"), Some((Device::Gpu, false)));
        assert_eq!(
            device_of("nvidia.com/gpu.shared"),
            Some((Device::Gpu, true))
        );
        assert_eq!(
            device_of("nvidia.com/mig-1g.10gb"),
            Some((Device::Mig("1g.10gb".into()), false))
        );
        assert_eq!(
            device_of("nvidia.com/mig-1g.10gb.me"),
            Some((Device::Mig("1g.10gb+me".into()), false))
        );
        assert_eq!(device_of("nvidia.com/hostdev"), None);
        assert_eq!(device_of("example.com/gpu"), None);
    }
}
