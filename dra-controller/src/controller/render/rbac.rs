//! ServiceAccounts and cluster roles for the kubelet plugin and the ComputeDomain controller.
use gpu_dra_api::names::GPU_DRIVER;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde_json::{Value, json};

use super::{CD_CONTROLLER, PLUGIN, Target, typed};
use crate::controller::error::Result;

/// One identity: its ServiceAccount, ClusterRole and the binding between them (all named alike).
pub struct Rbac {
    pub service_account: ServiceAccount,
    pub role: ClusterRole,
    pub binding: ClusterRoleBinding,
}

const ALL: [&str; 7] = [
    "get", "list", "watch", "create", "update", "patch", "delete",
];
const READ: [&str; 3] = ["get", "list", "watch"];

fn rbac(t: &Target<'_>, name: &str, rules: Value) -> Result<Rbac> {
    Ok(Rbac {
        service_account: typed(json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": t.metadata(name, Some(t.namespace), name),
        }))?,
        role: typed(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": t.metadata(name, None, name),
            "rules": rules,
        }))?,
        binding: typed(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": t.metadata(name, None, name),
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name },
            "subjects": [{ "kind": "ServiceAccount", "name": name, "namespace": t.namespace }],
        }))?,
    })
}

/// The plugin publishes its node's slices (the VAP narrows this to its own node), reads claims and
/// writes its devices' entries in their status, labels its node for ComputeDomains, and records Warning events on it (a corrupt checkpoint, a
/// registration the kubelet refused; core/v1 Events).
pub fn plugin_rbac(t: &Target<'_>) -> Result<Rbac> {
    rbac(
        t,
        PLUGIN,
        json!([
            { "apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ALL.iter().chain(&["deletecollection"]).collect::<Vec<_>>() },
            { "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "deviceclasses"], "verbs": READ },
            // status.devices entries (server-side apply). Since 1.36 the API server also asks for
            // the driver's own verb on `resourceclaims/driver`, `associated-node:` for a token
            // bound to the claim's node (the plugin pod's), which is all the plugin needs.
            { "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"], "verbs": ["get", "patch"] },
            { "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"], "resourceNames": [GPU_DRIVER], "verbs": ["associated-node:patch"] },
            { "apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch", "update"] },
            { "apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"] },
            { "apiGroups": [""], "resources": ["pods"], "verbs": READ },
            { "apiGroups": ["resource.nvidia.com"], "resources": ["computedomains", "computedomains/status"], "verbs": ["get", "list", "watch", "patch", "update"] },
            // IMEXDaemonsWithDNSNames: the compute-domain plugin keeps a daemon's hosts file from its clique.
            { "apiGroups": ["resource.nvidia.com"], "resources": ["computedomaincliques"], "verbs": READ },
            // On-demand MIG: the plugin creates its node's MigLayout and reports in its status.
            { "apiGroups": ["nvidia.com"], "resources": ["miglayouts", "miglayouts/status"], "verbs": ["get", "list", "watch", "create", "patch"] },
        ]),
    )
}

pub fn cd_controller_rbac(t: &Target<'_>) -> Result<Rbac> {
    rbac(
        t,
        CD_CONTROLLER,
        json!([
            { "apiGroups": ["resource.nvidia.com"], "resources": ["computedomains", "computedomains/status", "computedomains/finalizers"], "verbs": ALL },
            { "apiGroups": ["resource.nvidia.com"], "resources": ["computedomaincliques"], "verbs": ALL },
            { "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"], "verbs": ALL },
            { "apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ALL },
            { "apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"] },
            { "apiGroups": [""], "resources": ["pods"], "verbs": READ },
            { "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"] },
            { "apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"] },
        ]),
    )
}
