//! The review itself: an AdmissionReview request in, its response out, with no I/O, so the whole
//! decision is unit-tested here.
//!
//! Each `opaque` config of `gpu.nvidia.com` or `compute-domain.nvidia.com` in a ResourceClaim
//! (`spec.devices.config[]`) or ResourceClaimTemplate (`spec.spec.devices.config[]`) goes through
//! the plugin's strict decoder ([`OpaqueConfig::decode`]) and then the value checks the plugin
//! makes when it applies the config, with every feature gate a config can need switched on: the
//! webhook does not know each node's gates, so it refuses only what no node would accept.
use gpu_dra_api::config::OpaqueConfig;
use gpu_dra_api::gates::FeatureGates;
use gpu_dra_api::names::{COMPUTE_DOMAIN_DRIVER, GPU_DRIVER};
use serde_json::{Value, json};

/// The gates that only unlock config values (sharing strategies, VFIO); none changes decoding.
const CONFIG_GATES: &str = "TimeSlicingSettings=true,MPSSupport=true,PassthroughSupport=true";

/// The response to one AdmissionReview request (`admission.k8s.io/v1`).
pub fn review(request: &Value) -> Value {
    let req = &request["request"];
    let uid = req["uid"].clone();
    let allowed = match problems(req) {
        Ok(()) => json!({"uid": uid, "allowed": true}),
        Err(message) => json!({
            "uid": uid,
            "allowed": false,
            "status": {"code": 422, "reason": "Invalid", "message": message},
        }),
    };
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": allowed,
    })
}

/// Every refused config of the request's object, joined into one message; Ok when there is none.
fn problems(req: &Value) -> Result<(), String> {
    // DELETE sends no object, and nothing else can be wrong with one.
    let object = &req["object"];
    if object.is_null() {
        return Ok(());
    }
    let template = req["kind"]["kind"].as_str() == Some("ResourceClaimTemplate");
    let (list, prefix) = configs(object, template);
    // An update that keeps the configs (a finalizer, a label) must pass even when a config went
    // in while the webhook was unreachable, or the claim could never be released.
    if req["operation"] == "UPDATE" && list == configs(&req["oldObject"], template).0 {
        return Ok(());
    }
    let Some(list) = list.as_array() else {
        return Ok(());
    };
    let errors: Vec<String> = list
        .iter()
        .enumerate()
        .filter_map(|(i, c)| check(&c["opaque"], &format!("{prefix}.config[{i}].opaque")).err())
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// The object's `devices.config` list (null when absent), and its path.
fn configs(object: &Value, template: bool) -> (&Value, &'static str) {
    if template {
        (
            &object["spec"]["spec"]["devices"]["config"],
            "spec.spec.devices",
        )
    } else {
        (&object["spec"]["devices"]["config"], "spec.devices")
    }
}

/// One `opaque` config: other drivers' configs (and non-opaque ones) pass untouched.
fn check(opaque: &Value, at: &str) -> Result<(), String> {
    let driver = opaque["driver"].as_str().unwrap_or_default();
    if driver != GPU_DRIVER && driver != COMPUTE_DOMAIN_DRIVER {
        return Ok(());
    }
    let at = format!("{at}.parameters");
    let result = OpaqueConfig::decode(&opaque["parameters"], &at).and_then(|config| {
        if driver == GPU_DRIVER {
            let gates = FeatureGates::parse_unchecked(CONFIG_GATES)?;
            config.device_config(&gates, &at).map(drop)
        } else {
            config.compute_domain_config(&at).map(drop)
        }
    });
    result.map_err(|e| match e {
        gpu_dra_api::Error::Config { path, reason } => format!("{path}: {reason}"),
        other => format!("{at}: {other}"),
    })
}

#[cfg(test)]
#[path = "review_tests.rs"]
mod tests;
