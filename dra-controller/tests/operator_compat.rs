//! Our GPUCluster CRD is a superset of the GPU Operator's (v26.7): every object in
//! `tests/operator/gpuclusters.yaml` (each valid for the operator's CRD) must pass our generated
//! openAPIV3Schema without losing a field to pruning, and must deserialize into our Rust type.
//!
//! The schema walk does what the API server's structural-schema validation and pruning do for the
//! keywords our CRDs use. `OPERATOR_GPUCLUSTER_CRD=<path to nvidia.com_gpuclusters.yaml>` also
//! checks the fixtures against the operator's own CRD, to keep the fixtures honest.
use dra_controller::controller::crd::{GPUCluster, gpucluster_crd};
use serde::Deserialize;
use serde_json::Value;

const FIXTURES: &str = include_str!("operator/gpuclusters.yaml");

fn fixtures() -> Vec<Value> {
    serde_yaml::Deserializer::from_str(FIXTURES)
        .map(|doc| Value::deserialize(doc).expect("fixture parses"))
        .collect()
}

fn our_schema() -> Value {
    let crd = serde_json::to_value(gpucluster_crd()).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

#[test]
fn our_crd_accepts_every_operator_gpucluster_and_prunes_nothing() {
    let schema = our_schema();
    for (i, obj) in fixtures().iter().enumerate() {
        let errors = validate(&schema, obj);
        assert!(errors.is_empty(), "fixture {}: {errors:#?}", i + 1);
    }
}

#[test]
fn our_type_reads_every_operator_gpucluster_and_keeps_the_dcgm_specs() {
    for (i, obj) in fixtures().iter().enumerate() {
        let mut obj = obj.clone();
        // what the API server stores for an object without spec: the CRD's default
        if obj.get("spec").is_none() {
            obj["spec"] = our_schema()["properties"]["spec"]["default"].clone();
        }
        let gc: GPUCluster = serde_json::from_value(obj.clone())
            .unwrap_or_else(|e| panic!("fixture {}: {e}", i + 1));
        let back = serde_json::to_value(&gc).unwrap();
        for key in ["dcgm", "dcgmExporter"] {
            assert_eq!(
                back["spec"][key],
                obj["spec"][key],
                "fixture {}: {key}",
                i + 1
            );
        }
    }
}

#[test]
fn the_maximal_fixture_uses_the_fields_the_operator_types_define() {
    let all = fixtures();
    let max = &all[3]["spec"];
    for path in [
        "/draDriver/gpus/kubeletPlugin/healthcheck/port",
        "/draDriver/computeDomains/controller/resources/requests",
        "/dcgm/hostPort",
        "/dcgmExporter/serviceMonitor/relabelings/1/modulus",
        "/dcgmExporter/hpcJobMapping/directory",
        "/hostPaths/kubeletRootDir",
        "/daemonsets/podSecurityContext/seccompProfile/type",
        "/daemonsets/rollingUpdate/maxUnavailable",
    ] {
        assert!(max.pointer(path).is_some(), "{path}");
    }
}

#[test]
fn the_schema_walk_finds_what_the_api_server_refuses_or_prunes() {
    let schema = our_schema();
    let mut bad = fixtures()[0].clone();
    bad["spec"]["draDriver"]["image"] = "no/slashes".into();
    bad["spec"]["draDriver"]["gpus"] =
        serde_json::json!({ "kubeletPlugin": { "healthcheck": { "port": 70000 } } });
    bad["spec"]["daemonsets"] = serde_json::json!({ "updateStrategy": "Recreate", "typo": 1 });
    bad["metadata"]["name"] = "other".into();
    let errors = validate(&schema, &bad).join("\n");
    for want in [
        ".spec.draDriver.image: does not match",
        ".spec.draDriver.gpus.kubeletPlugin.healthcheck.port: above maximum",
        ".spec.daemonsets.updateStrategy: not one of",
        ".spec.daemonsets.typo: unknown field (pruned)",
        "name must be gpu-cluster",
    ] {
        assert!(errors.contains(want), "missing {want:?} in\n{errors}");
    }
}

#[test]
fn fixtures_are_valid_for_the_operators_crd_when_given() {
    let Some(path) = std::env::var_os("OPERATOR_GPUCLUSTER_CRD") else {
        return;
    };
    let text = std::fs::read_to_string(path).expect("operator CRD readable");
    let crd: Value = serde_yaml::from_str(&text).expect("operator CRD parses");
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    for (i, obj) in fixtures().iter().enumerate() {
        let errors = validate(schema, obj);
        assert!(errors.is_empty(), "fixture {}: {errors:#?}", i + 1);
    }
}

/// Every reason the API server would refuse `obj`, or drop part of it, under `schema`.
fn validate(schema: &Value, obj: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    walk(schema, obj, "", &mut errors);
    root_rules(schema, obj, &mut errors);
    errors
}

/// The root's CEL rules. Only the singleton rule is known; any other fails the test, so a new
/// rule gets a deliberate check here rather than a silent pass.
fn root_rules(schema: &Value, obj: &Value, errors: &mut Vec<String>) {
    let rules = schema["x-kubernetes-validations"].as_array();
    for rule in rules.into_iter().flatten() {
        match rule["rule"].as_str() {
            Some("self.metadata.name == 'gpu-cluster'") => {
                if obj["metadata"]["name"] != "gpu-cluster" {
                    errors.push("name must be gpu-cluster".into());
                }
            }
            other => errors.push(format!("unknown root rule {other:?}")),
        }
    }
}

fn walk(s: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
    if v.is_null() {
        if s["nullable"] != true {
            errors.push(format!("{at}: null"));
        }
        return;
    }
    if !type_ok(s, v) {
        errors.push(format!("{at}: not of type {}", s["type"]));
        return;
    }
    scalar_checks(s, v, at, errors);
    match v {
        // the API server checks metadata itself
        Value::Object(map) if at != ".metadata" => walk_object(s, map, at, errors),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                walk(&s["items"], item, &format!("{at}[{i}]"), errors);
            }
        }
        _ => {}
    }
}

fn walk_object(
    s: &Value,
    map: &serde_json::Map<String, Value>,
    at: &str,
    errors: &mut Vec<String>,
) {
    for req in s["required"].as_array().into_iter().flatten() {
        if !map.contains_key(req.as_str().unwrap_or_default()) {
            errors.push(format!(
                "{at}.{}: required",
                req.as_str().unwrap_or_default()
            ));
        }
    }
    let preserve = s["x-kubernetes-preserve-unknown-fields"] == true;
    for (key, value) in map {
        let here = format!("{at}.{key}");
        if let Some(prop) = s["properties"].get(key) {
            walk(prop, value, &here, errors);
        } else if s["additionalProperties"].is_object() {
            walk(&s["additionalProperties"], value, &here, errors);
        } else if !(preserve || at.is_empty() && is_implicit(key)) {
            errors.push(format!("{here}: unknown field (pruned)"));
        }
    }
}

/// Root fields the API server knows without a schema.
fn is_implicit(key: &str) -> bool {
    matches!(key, "apiVersion" | "kind" | "metadata")
}

fn type_ok(s: &Value, v: &Value) -> bool {
    if s["x-kubernetes-int-or-string"] == true {
        return v.is_i64() || v.is_u64() || v.is_string();
    }
    match s["type"].as_str() {
        None => true,
        Some("object") => v.is_object(),
        Some("array") => v.is_array(),
        Some("string") => v.is_string(),
        Some("boolean") => v.is_boolean(),
        Some("integer") => v.is_i64() || v.is_u64(),
        Some("number") => v.is_number(),
        Some(other) => panic!("schema type {other} unknown to this walk"),
    }
}

fn scalar_checks(s: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
    if let Some(allowed) = s["enum"].as_array()
        && !allowed.contains(v)
    {
        errors.push(format!("{at}: not one of {allowed:?}"));
    }
    if let (Some(p), Some(text)) = (s["pattern"].as_str(), v.as_str()) {
        let re = regex::Regex::new(p).expect("schema pattern compiles");
        if !re.is_match(text) {
            errors.push(format!("{at}: does not match {p}"));
        }
    }
    if let (Some(min), Some(n)) = (s["minimum"].as_f64(), v.as_f64())
        && n < min
    {
        errors.push(format!("{at}: below minimum {min}"));
    }
    if let (Some(max), Some(n)) = (s["maximum"].as_f64(), v.as_f64())
        && n > max
    {
        errors.push(format!("{at}: above maximum {max}"));
    }
    if let (Some(max), Some(text)) = (s["maxLength"].as_u64(), v.as_str())
        && text.chars().count() as u64 > max
    {
        errors.push(format!("{at}: longer than {max}"));
    }
    if let (Some(min), Some(text)) = (s["minLength"].as_u64(), v.as_str())
        && (text.chars().count() as u64) < min
    {
        errors.push(format!("{at}: shorter than {min}"));
    }
}
