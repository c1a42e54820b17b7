//! `resource.k8s.io/v1beta1` and `v1beta2` objects converted to `v1` the way the API server
//! converts them (`k8s.io/kubernetes/pkg/apis/resource/v1beta1/conversion.go` and the generated
//! conversions): v1beta2 has v1's fields; v1beta1 requests carry the `exactly` fields directly and
//! v1beta1 devices keep theirs under `basic`.
use serde_json::{Map, Value};

/// The group of the DRA API.
pub const GROUP: &str = "resource.k8s.io";

/// The fields of a v1beta1 request that v1 keeps under `exactly`, in the API's order.
const EXACT_FIELDS: &[&str] = &[
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
    "derivedAttributes",
];

/// The fields of a v1beta1 `BasicDevice`, which v1 has on the device itself.
const BASIC_FIELDS: &[&str] = &[
    "attributes",
    "capacity",
    "consumesCounters",
    "nodeName",
    "nodeSelector",
    "allNodes",
    "taints",
    "bindsToNode",
    "bindingConditions",
    "bindingFailureConditions",
    "allowMultipleAllocations",
    "nodeAllocatableResources",
];

/// Converts `obj` (of `kind`, served as `resource.k8s.io/<version>`) to v1 in place. Returns what
/// the conversion did, for the note that tells the user.
pub fn to_v1(version: &str, kind: &str, obj: &mut Value) -> String {
    obj["apiVersion"] = Value::String(format!("{GROUP}/v1"));
    if version == "v1beta2" {
        return format!("converted from {GROUP}/v1beta2 to v1 (the same fields)");
    }
    let changed = match kind {
        "ResourceClaim" => requests_to_v1(obj.pointer_mut("/spec/devices/requests")),
        "ResourceClaimTemplate" => requests_to_v1(obj.pointer_mut("/spec/spec/devices/requests")),
        "ResourceSlice" => slice_to_v1(obj),
        _ => false,
    };
    let what = match (kind, changed) {
        ("ResourceSlice", true) => ": device fields moved out of `basic`",
        (_, true) => ": `deviceClassName`, `selectors`, `count`, ... moved under `exactly`",
        _ => " (the same fields)",
    };
    format!("converted from {GROUP}/v1beta1 to v1 as the API server does{what}")
}

fn requests_to_v1(requests: Option<&mut Value>) -> bool {
    let Some(Value::Array(requests)) = requests else {
        return false;
    };
    let mut changed = false;
    for request in requests.iter_mut().filter_map(Value::as_object_mut) {
        default_request(request);
        if EXACT_FIELDS.iter().any(|f| is_set(request.get(*f))) {
            let mut exactly = Map::new();
            for field in EXACT_FIELDS {
                if let Some(v) = request.remove(*field).filter(|v| !v.is_null()) {
                    exactly.insert(field.to_string(), v);
                }
            }
            request.insert("exactly".into(), Value::Object(exactly));
            changed = true;
        }
    }
    changed
}

/// `SetDefaults_DeviceRequest` of v1beta1, which runs before the conversion.
fn default_request(request: &mut Map<String, Value>) {
    if !is_set(request.get("deviceClassName")) {
        return;
    }
    if !is_set(request.get("allocationMode")) {
        request.insert("allocationMode".into(), "ExactCount".into());
    }
    if request.get("allocationMode") == Some(&Value::from("ExactCount"))
        && !is_set(request.get("count"))
    {
        request.insert("count".into(), 1.into());
    }
}

/// `hasAnyMainRequestFieldsSet`: a non-empty string or count, or any list or object (even empty).
fn is_set(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(_) => true,
    }
}

fn slice_to_v1(obj: &mut Value) -> bool {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return false;
    };
    // v1beta1's plain `nodeName: ""` and `allNodes: false` are v1's unset fields
    if spec.get("nodeName") == Some(&Value::from("")) {
        spec.remove("nodeName");
    }
    if spec.get("allNodes") == Some(&Value::Bool(false)) {
        spec.remove("allNodes");
    }
    let Some(Value::Array(devices)) = spec.get_mut("devices") else {
        return false;
    };
    let mut changed = false;
    for device in devices.iter_mut().filter_map(Value::as_object_mut) {
        let Some(Value::Object(mut basic)) = device.remove("basic") else {
            continue;
        };
        for field in BASIC_FIELDS {
            if let Some(v) = basic.remove(*field) {
                device.insert(field.to_string(), v);
            }
        }
        // what is left is not a v1beta1 field: strict decoding names it under `basic`
        if !basic.is_empty() {
            device.insert("basic".into(), Value::Object(basic));
        }
        changed = true;
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn v1beta1_requests_move_under_exactly_with_the_defaults() {
        let mut claim = json!({"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim",
            "spec": {"devices": {"requests": [
                {"name": "a", "deviceClassName": "gpu.nvidia.com", "selectors": []},
                {"name": "b", "firstAvailable": [{"name": "x", "deviceClassName": "c"}]}]}}});
        to_v1("v1beta1", "ResourceClaim", &mut claim);
        assert_eq!(
            claim["spec"]["devices"]["requests"],
            json!([
                {"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [],
                    "allocationMode": "ExactCount", "count": 1}},
                {"name": "b", "firstAvailable": [{"name": "x", "deviceClassName": "c"}]}
            ])
        );
        assert_eq!(claim["apiVersion"], "resource.k8s.io/v1");
    }

    #[test]
    fn v1beta1_devices_leave_basic() {
        let mut slice = json!({"spec": {"nodeName": "", "allNodes": true, "devices": [
            {"name": "d", "basic": {"attributes": {"a": {"int": 1}}, "capacity": {}}}]}});
        to_v1("v1beta1", "ResourceSlice", &mut slice);
        assert_eq!(
            slice["spec"],
            json!({"allNodes": true, "devices": [
                {"name": "d", "attributes": {"a": {"int": 1}}, "capacity": {}}]})
        );
    }
}
