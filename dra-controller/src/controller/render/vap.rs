//! A ValidatingAdmissionPolicy that confines the plugin's ServiceAccount to ResourceSlices of the node
//! its pod runs on (the node name comes from the bound token's `node-name` extra).
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use serde_json::json;

use super::{PLUGIN, Target, typed};
use crate::controller::error::Result;

pub const VAP_NAME: &str = "gpu-dra-resourceslices-own-node";

pub fn slice_policy(t: &Target<'_>) -> Result<ValidatingAdmissionPolicy> {
    let user = format!("system:serviceaccount:{}:{PLUGIN}", t.namespace);
    typed(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": t.metadata(VAP_NAME, None, PLUGIN),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": { "resourceRules": [{
                "apiGroups": ["resource.k8s.io"],
                "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE", "DELETE"],
                "resources": ["resourceslices"],
            }]},
            "matchConditions": [{
                "name": "is-plugin-service-account",
                "expression": format!("request.userInfo.username == '{user}'"),
            }],
            "variables": [
                { "name": "userNode",
                  "expression": "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')" },
                { "name": "sliceNode",
                  "expression": "(request.operation == 'DELETE' ? oldObject : object).spec.?nodeName.orValue('')" },
            ],
            "validations": [
                { "expression": "variables.userNode != ''",
                  "message": "the kubelet plugin's token is not bound to a node; it must run in a pod" },
                { "expression": "variables.userNode == variables.sliceNode",
                  "messageExpression": "'the kubelet plugin on node ' + variables.userNode + ' may only write ResourceSlices of that node, not ' + (variables.sliceNode == '' ? 'slices without a node' : 'slices of node ' + variables.sliceNode)" },
            ],
        },
    }))
}

pub fn slice_policy_binding(t: &Target<'_>) -> Result<ValidatingAdmissionPolicyBinding> {
    typed(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": t.metadata(VAP_NAME, None, PLUGIN),
        "spec": { "policyName": VAP_NAME, "validationActions": ["Deny"] },
    }))
}
