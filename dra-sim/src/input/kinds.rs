//! One document to its place in [`Objects`]: by apiVersion and kind.
use super::convert::{self, GROUP};
use super::strict::typed;
use super::{Objects, workload};
use crate::{Error, Result};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::Value;

/// The groups whose workload kinds the simulator reads; another version of them is an error.
const WORKLOAD_GROUPS: &[&str] = &["", "apps", "batch", "extensions"];

/// Adds the object `json` (from `origin`, "file: document N") to `objs`.
pub fn add(mut json: Value, origin: &str, objs: &mut Objects) -> Result<()> {
    let api_version = str_field(&json, "apiVersion");
    let kind = str_field(&json, "kind");
    // The object's own name finds it faster than a count, when the name itself is readable.
    let named = match json.pointer("/metadata/name").and_then(Value::as_str) {
        Some(n) if !kind.is_empty() => format!("{origin} ({kind} {n})"),
        _ if !kind.is_empty() => format!("{origin} ({kind})"),
        _ => origin.to_string(),
    };
    let origin = named.as_str();
    // kubectl refuses both ("apiVersion not set", "kind not set")
    for (field, value) in [("apiVersion", &api_version), ("kind", &kind)] {
        if value.is_empty() {
            return Err(Error::Invalid(format!(
                "{origin}: field {field}: not set (every Kubernetes object names its apiVersion and kind)"
            )));
        }
    }
    if kind.ends_with("List") {
        return add_items(&json, origin, objs);
    }
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", &api_version));
    if group == GROUP {
        return add_resource(&mut json, version, &kind, origin, objs);
    }
    if kind == "Node" && api_version == "v1" {
        objs.nodes.push(typed(&json, origin)?);
        return Ok(());
    }
    match workload::workload_api_version(&kind) {
        Some(served) if served == api_version => {
            objs.workloads.push(workload::parse(&kind, &json, origin)?);
        }
        Some(served) if WORKLOAD_GROUPS.contains(&group) => {
            return Err(Error::Invalid(format!(
                "{origin}: field apiVersion: {api_version} {kind} is not served by the API server (use {served})"
            )));
        }
        _ => objs
            .ignored
            .push(format!("{origin}: {}", ignored_reason(&kind, group))),
    }
    Ok(())
}

fn str_field(json: &Value, field: &str) -> String {
    json.get(field)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// `List` and `<Kind>List`: each item as its own object.
fn add_items(json: &Value, origin: &str, objs: &mut Objects) -> Result<()> {
    let items = json.get("items").and_then(Value::as_array);
    for (j, item) in items.into_iter().flatten().enumerate() {
        add(item.clone(), &format!("{origin}: items[{j}]"), objs)?;
    }
    Ok(())
}

fn add_resource(
    json: &mut Value,
    version: &str,
    kind: &str,
    origin: &str,
    objs: &mut Objects,
) -> Result<()> {
    let known = matches!(
        kind,
        "ResourceSlice" | "DeviceClass" | "ResourceClaim" | "ResourceClaimTemplate"
    );
    if !known {
        objs.ignored.push(format!(
            "{origin}: {GROUP} {kind} does not take part in allocation here"
        ));
        return Ok(());
    }
    match version {
        "v1" => {}
        "v1beta1" | "v1beta2" => {
            let note = convert::to_v1(version, kind, json);
            objs.notes.push(format!("{origin}: {note}"));
        }
        _ => {
            return Err(Error::Invalid(format!(
                "{origin}: field apiVersion: {GROUP}/{version} {kind} is no longer served by the API server ({}); Kubernetes 1.37 serves {kind} as {GROUP}/v1, v1beta2 and v1beta1",
                retired_reason(version)
            )));
        }
    }
    match kind {
        "ResourceSlice" => objs.slices.push(typed(json, origin)?),
        "DeviceClass" => objs.classes.push(typed(json, origin)?),
        "ResourceClaim" => {
            let mut c: ResourceClaim = typed(json, origin)?;
            // as `kubectl apply` would place it, and as claims from templates are named
            c.metadata.namespace.get_or_insert_with(|| "default".into());
            objs.claims.push(c);
        }
        _ => {
            let mut t: k8s_openapi::api::resource::v1::ResourceClaimTemplate = typed(json, origin)?;
            t.metadata.namespace.get_or_insert_with(|| "default".into());
            objs.templates.push(t);
        }
    }
    Ok(())
}

fn retired_reason(version: &str) -> &'static str {
    match version {
        "v1alpha2" => {
            "the classic DRA API with ResourceClass and parameters objects, removed in Kubernetes 1.31"
        }
        "v1alpha3" => {
            "structured parameters' first version; since 1.33 v1alpha3 serves only DeviceTaintRule and ResourcePoolStatusRequest"
        }
        _ => "not a version of the API",
    }
}

fn ignored_reason(kind: &str, group: &str) -> String {
    match (group, kind) {
        ("resource.nvidia.com", "ComputeDomain") => {
            "ignored: the ComputeDomain controller makes its channel ResourceClaimTemplate; the simulator does not run it".into()
        }
        (_, "Namespace") => "ignored: namespaces need no simulation (objects keep their namespace)".into(),
        _ => format!(
            "ignored: {kind} does not affect allocation{}",
            if group.is_empty() || group.ends_with("k8s.io") {
                ""
            } else {
                " (a custom resource: pods its controller would make are not simulated)"
            }
        ),
    }
}
