//! The workload object written back for `kubectl apply`: its `nvidia.com/*` resources replaced
//! by the planned claim, and what the API server set on it when it was read (status, uid,
//! managedFields, a Pod's nodeName, a Job's generated selector) taken out, since applying those
//! back would be refused or would pin the new pods to the old placement.
use super::claims::Design;
use super::requests::{Ask, template_pointer};
use crate::workloads::Workload;
use serde_json::{Map, Value, json};

/// Metadata the API server owns.
const SERVER_METADATA: &[&str] = &[
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "generation",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];
/// Annotations written by kubectl and controllers, not by the user.
const SERVER_ANNOTATIONS: &[&str] = &[
    "kubectl.kubernetes.io/last-applied-configuration",
    "deployment.kubernetes.io/revision",
];
/// Labels the Job controller puts on its pod template along with the generated selector.
const JOB_LABELS: &[&str] = &[
    "controller-uid",
    "batch.kubernetes.io/controller-uid",
    "job-name",
    "batch.kubernetes.io/job-name",
];

/// `w`'s object with the planned claim in place of its asks.
pub fn rewrite(w: &Workload, asks: &[Ask], design: &Design, notes: &mut Vec<String>) -> Value {
    let mut obj = w.source.clone();
    if let Some(o) = obj.as_object_mut() {
        o.remove("status");
        if let Some(meta) = o.get_mut("metadata") {
            clean_metadata(meta);
        }
    }
    if w.kind == "Job" {
        drop_job_selector(&mut obj, notes);
    }
    let Some(template) = obj.pointer_mut(template_pointer(&w.kind)) else {
        return obj;
    };
    let spec = &mut template["spec"];
    if w.kind == "Pod" {
        let old = spec.as_object_mut().and_then(|s| s.remove("nodeName"));
        notes.push(format!(
            "a Pod's spec cannot change: delete {} and create it from this file{}",
            w.name,
            if old.is_some() {
                " (its nodeName is left out so that the scheduler places it)"
            } else {
                ""
            }
        ));
    }
    let single = design.requests.len() == 1;
    for (ask, request) in asks.iter().zip(&design.per_ask) {
        replace_resource(spec, ask, &design.entry, (!single).then_some(request));
    }
    let source_field = if design.kind == "ResourceClaim" {
        "resourceClaimName"
    } else {
        "resourceClaimTemplateName"
    };
    let entry = json!({ "name": design.entry, source_field: design.name });
    push(spec, "resourceClaims", entry);
    obj
}

fn clean_metadata(meta: &mut Value) {
    let Some(m) = meta.as_object_mut() else {
        return;
    };
    for k in SERVER_METADATA {
        m.remove(*k);
    }
    let empty = match m.get_mut("annotations").and_then(Value::as_object_mut) {
        Some(a) => {
            for k in SERVER_ANNOTATIONS {
                a.remove(*k);
            }
            a.is_empty()
        }
        None => false,
    };
    if empty {
        m.remove("annotations");
    }
}

/// A Job read back carries the selector and template labels its controller generated; applying
/// them to a new Job is refused unless `manualSelector` is set.
fn drop_job_selector(obj: &mut Value, notes: &mut Vec<String>) {
    notes.push(
        "a Job's pod template cannot change: delete the Job and create it from this file".into(),
    );
    if obj.pointer("/spec/manualSelector") == Some(&Value::Bool(true)) {
        return;
    }
    if let Some(spec) = obj.pointer_mut("/spec").and_then(Value::as_object_mut) {
        spec.remove("selector");
    }
    for meta in ["/metadata", "/spec/template/metadata"] {
        let Some(m) = obj.pointer_mut(meta).and_then(Value::as_object_mut) else {
            continue;
        };
        let Some(labels) = m.get_mut("labels").and_then(Value::as_object_mut) else {
            continue;
        };
        for k in JOB_LABELS {
            labels.remove(*k);
        }
        if labels.is_empty() {
            m.remove("labels");
        }
    }
}

/// Takes `ask.resource` out of the container's limits and requests and names the claim (and
/// with several requests, the request) in its `resources.claims`.
fn replace_resource(spec: &mut Value, ask: &Ask, entry: &str, request: Option<&String>) {
    let Some(container) = spec
        .get_mut(ask.list)
        .and_then(|l| l.get_mut(ask.index))
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let resources = container
        .entry("resources")
        .or_insert_with(|| Value::Object(Map::new()));
    for field in ["limits", "requests"] {
        let Some(map) = resources.get_mut(field).and_then(Value::as_object_mut) else {
            continue;
        };
        map.remove(&ask.resource);
        if map.is_empty()
            && let Some(r) = resources.as_object_mut()
        {
            r.remove(field);
        }
    }
    let claim = match request {
        Some(r) => json!({ "name": entry, "request": r }),
        None => json!({ "name": entry }),
    };
    let already = resources
        .get("claims")
        .and_then(Value::as_array)
        .is_some_and(|c| c.contains(&claim));
    if !already {
        push(resources, "claims", claim);
    }
}

/// Appends `item` to the array `field` of `obj`, creating it.
fn push(obj: &mut Value, field: &str, item: Value) {
    let Some(o) = obj.as_object_mut() else {
        return;
    };
    let list = o.entry(field).or_insert_with(|| Value::Array(Vec::new()));
    if let Some(a) = list.as_array_mut() {
        a.push(item);
    }
}

/// The file's text: a comment saying where it came from and what to know, the claim object,
/// then the workload (so `kubectl apply -f` creates the claim first).
pub fn render_file(origin: &str, notes: &[String], objects: &[Value]) -> crate::Result<String> {
    let mut s = format!("# Planned by `dra-controller plan` from {origin}\n");
    for n in notes {
        s.push_str(&format!("# note: {n}\n"));
    }
    for o in objects {
        s.push_str("---\n");
        s.push_str(&serde_yaml::to_string(o)?);
    }
    Ok(s)
}
