use serde_json::{Value, json};

use super::review;

fn gpu(parameters: Value) -> Value {
    json!({"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": parameters}})
}

fn claim_request(configs: Vec<Value>) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "7f3c",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "operation": "CREATE",
            "object": {"spec": {"devices": {"requests": [], "config": configs}}},
        },
    })
}

fn template_request(configs: Vec<Value>) -> Value {
    json!({
        "request": {
            "uid": "a1",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaimTemplate"},
            "operation": "UPDATE",
            "object": {"spec": {"spec": {"devices": {"config": configs}}}},
        },
    })
}

fn time_slicing(strategy: &str) -> Value {
    json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": strategy, "timeSlicingConfig": {"interval": "Long"}},
    })
}

/// The response's `allowed`, and its message when refused.
fn verdict(response: &Value) -> (bool, String) {
    let r = &response["response"];
    (
        r["allowed"].as_bool().expect("allowed is a bool"),
        r["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

#[test]
fn a_good_gpu_config_is_allowed_with_the_requests_uid() {
    let out = review(&claim_request(vec![gpu(time_slicing("TimeSlicing"))]));
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(out["kind"], "AdmissionReview");
    assert_eq!(out["response"]["uid"], "7f3c");
    assert_eq!(verdict(&out), (true, String::new()));
}

#[test]
fn an_unknown_sharing_strategy_is_refused_with_its_field_path() {
    let out = review(&claim_request(vec![gpu(time_slicing("Timeslicing"))]));
    let (allowed, message) = verdict(&out);
    assert!(!allowed);
    assert!(
        message.starts_with("spec.devices.config[0].opaque.parameters.sharing.strategy: "),
        "{message}"
    );
    assert!(
        message.contains("unknown GPU sharing strategy"),
        "{message}"
    );
    assert_eq!(out["response"]["status"]["code"], 422);
}

#[test]
fn an_unknown_field_is_refused_by_the_strict_decoder() {
    let mut params = time_slicing("TimeSlicing");
    params["sharing"]["timeslicingConfig"] = json!({});
    let out = review(&claim_request(vec![gpu(time_slicing("MPS")), gpu(params)]));
    let (allowed, message) = verdict(&out);
    assert!(!allowed);
    // The first config is wrong too (MPS with timeSlicingConfig): both are named.
    assert!(
        message.contains("spec.devices.config[0].opaque.parameters.sharing.timeSlicingConfig"),
        "{message}"
    );
    assert!(
        message.contains("spec.devices.config[1].opaque.parameters.sharing"),
        "{message}"
    );
    assert!(message.contains("timeslicingConfig"), "{message}");
}

#[test]
fn a_wrong_api_version_or_kind_is_refused() {
    let out = review(&claim_request(vec![gpu(
        json!({"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"}),
    )]));
    let (allowed, message) = verdict(&out);
    assert!(!allowed);
    assert!(
        message.starts_with("spec.devices.config[0].opaque.parameters.apiVersion: "),
        "{message}"
    );
    let out = review(&claim_request(vec![gpu(
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig", "domainID": "d"}),
    )]));
    let (allowed, message) = verdict(&out);
    assert!(!allowed, "a channel config is no GPU config");
    assert!(message.contains("parameters.kind"), "{message}");
}

#[test]
fn a_template_is_checked_under_spec_spec() {
    let out = review(&template_request(vec![gpu(time_slicing("Exclusive"))]));
    assert_eq!(out["response"]["uid"], "a1");
    let (allowed, message) = verdict(&out);
    assert!(!allowed);
    assert!(
        message.starts_with("spec.spec.devices.config[0].opaque.parameters.sharing.strategy: "),
        "{message}"
    );
    let good = review(&template_request(vec![gpu(time_slicing("TimeSlicing"))]));
    assert!(verdict(&good).0);
}

#[test]
fn compute_domain_configs_are_checked_against_their_own_kinds() {
    let channel = |params: Value| json!({"opaque": {"driver": "compute-domain.nvidia.com", "parameters": params}});
    let good = channel(json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomainChannelConfig",
        "domainID": "f00d",
    }));
    assert!(verdict(&review(&claim_request(vec![good]))).0);
    let empty = channel(json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomainChannelConfig",
        "domainID": "",
    }));
    let (allowed, message) = verdict(&review(&claim_request(vec![empty])));
    assert!(!allowed);
    assert!(
        message.starts_with("spec.devices.config[0].opaque.parameters.domainID: "),
        "{message}"
    );
}

#[test]
fn other_drivers_and_objects_without_configs_pass() {
    let other = json!({"opaque": {"driver": "example.com", "parameters": {"anything": [1, 2]}}});
    assert!(verdict(&review(&claim_request(vec![other]))).0);
    let no_opaque = json!({"requests": ["a"]});
    assert!(verdict(&review(&claim_request(vec![no_opaque]))).0);
    let no_config = json!({"request": {"uid": "u", "kind": {"kind": "ResourceClaim"},
        "object": {"spec": {"devices": {"requests": []}}}}});
    assert!(verdict(&review(&no_config)).0);
}

#[test]
fn a_delete_without_an_object_is_allowed() {
    let delete = json!({"request": {"uid": "d", "kind": {"kind": "ResourceClaim"},
        "operation": "DELETE", "object": null}});
    let out = review(&delete);
    assert_eq!(out["response"]["uid"], "d");
    assert!(verdict(&out).0);
}

#[test]
fn parameters_that_are_not_an_object_are_refused() {
    let out = review(&claim_request(vec![gpu(json!("GpuConfig"))]));
    let (allowed, message) = verdict(&out);
    assert!(!allowed);
    assert!(
        message.starts_with("spec.devices.config[0].opaque.parameters: "),
        "{message}"
    );
}

#[test]
fn an_update_that_keeps_the_configs_passes_even_when_they_are_bad() {
    let bad = vec![gpu(time_slicing("Timeslicing"))];
    let mut update = claim_request(bad.clone());
    update["request"]["operation"] = json!("UPDATE");
    update["request"]["oldObject"] = update["request"]["object"].clone();
    update["request"]["object"]["metadata"] = json!({"finalizers": []});
    assert!(
        verdict(&review(&update)).0,
        "a finalizer change is not refused"
    );
    // An update that brings a bad config in is checked (were the spec ever mutable).
    update["request"]["oldObject"]["spec"]["devices"]["config"] = json!([]);
    assert!(!verdict(&review(&update)).0);
    let mut template = template_request(bad);
    template["request"]["oldObject"] = template["request"]["object"].clone();
    assert!(
        verdict(&review(&template)).0,
        "a template update keeping its configs"
    );
}
