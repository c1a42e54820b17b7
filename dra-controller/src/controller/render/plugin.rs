//! The kubelet-plugin DaemonSet: `gpus` and, when enabled, `compute-domains` containers, placed only on
//! nodes the migration pool marked ready (`nvidia.com/gpu.deploy.dra-driver=true`).
use k8s_openapi::api::apps::v1::DaemonSet;
use serde_json::{Value, json};

use super::{Target, container_env, liveness, typed};
use crate::controller::error::Result;
use crate::controller::labels::{COMPUTE_DOMAIN_DRIVER, DRA_DRIVER_LABEL, GPU_DRIVER};

/// Name of the DaemonSet, its ServiceAccount and its RBAC objects.
pub const PLUGIN: &str = "gpu-dra-kubelet-plugin";

fn base_env(t: &Target<'_>, driver: &str, port: i32) -> Vec<Value> {
    vec![
        json!({ "name": "DRIVER_NAME", "value": driver }),
        json!({ "name": "NODE_NAME", "valueFrom": { "fieldRef": { "fieldPath": "spec.nodeName" } } }),
        json!({ "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } }),
        json!({ "name": "POD_UID", "valueFrom": { "fieldRef": { "fieldPath": "metadata.uid" } } }),
        json!({ "name": "FEATURE_GATES", "value": t.feature_gates() }),
        json!({ "name": "HEALTHCHECK_PORT", "value": port.to_string() }),
        json!({ "name": "KUBELET_ROOT_DIR", "value": t.spec.host_paths.kubelet_root() }),
        json!({ "name": "DRIVER_ROOT", "value": "/driver-root" }),
        json!({ "name": "CDI_ROOT", "value": "/var/run/cdi" }),
        json!({ "name": "GPU_CLIQUE_LABEL_ENABLED", "value": "true" }),
    ]
}

fn container(
    t: &Target<'_>,
    name: &str,
    driver: &str,
    spec: &crate::controller::crd::KubeletPluginSpec,
) -> Value {
    let kubelet = t.spec.host_paths.kubelet_root();
    let mut c = json!({
        "name": name,
        "image": t.image(),
        "imagePullPolicy": t.pull_policy(),
        "command": ["dra-plugin"],
        "env": container_env(base_env(t, driver, spec.healthcheck.port), &spec.env),
        "securityContext": { "privileged": true },
        "volumeMounts": [
            { "name": "plugins-registry", "mountPath": format!("{kubelet}/plugins_registry") },
            { "name": "plugins", "mountPath": format!("{kubelet}/plugins"), "mountPropagation": "Bidirectional" },
            { "name": "cdi", "mountPath": "/var/run/cdi" },
            { "name": "driver-root", "mountPath": "/driver-root", "readOnly": true, "mountPropagation": "HostToContainer" },
        ],
    });
    if let Some(r) = &spec.resources {
        c["resources"] = json!(r);
    }
    if let Some(p) = liveness(spec) {
        c["livenessProbe"] = p;
    }
    c
}

pub fn plugin_daemonset(t: &Target<'_>) -> Result<DaemonSet> {
    let ds = &t.spec.daemonsets;
    let kubelet = t.spec.host_paths.kubelet_root();
    let mut containers = vec![container(
        t,
        "gpus",
        GPU_DRIVER,
        &t.spec.dra_driver.gpus.kubelet_plugin,
    )];
    let cd = &t.spec.dra_driver.compute_domains;
    if cd.enabled {
        containers.push(container(
            t,
            "compute-domains",
            COMPUTE_DOMAIN_DRIVER,
            &cd.kubelet_plugin,
        ));
    }
    let selector = json!({ "app.kubernetes.io/name": PLUGIN });
    let mut pod_meta = json!({ "labels": t.labels(PLUGIN, true) });
    if !ds.annotations.is_empty() {
        pod_meta["annotations"] = json!(ds.annotations);
    }
    let strategy = match ds.update_strategy {
        Some(crate::controller::crd::UpdateStrategy::OnDelete) => json!({ "type": "OnDelete" }),
        _ => {
            let max = ds
                .rolling_update
                .as_ref()
                .and_then(|r| r.max_unavailable.clone());
            let max = max.map_or(json!(1), |m| {
                m.parse::<i32>().map_or(json!(m), |n| json!(n))
            });
            json!({ "type": "RollingUpdate", "rollingUpdate": { "maxUnavailable": max } })
        }
    };
    let mut meta = t.metadata(PLUGIN, Some(t.namespace), PLUGIN);
    meta["labels"] = json!(t.labels(PLUGIN, true));
    if !ds.annotations.is_empty() {
        meta["annotations"] = json!(ds.annotations);
    }
    typed(json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta,
        "spec": {
            "selector": { "matchLabels": selector },
            "updateStrategy": strategy,
            "template": {
                "metadata": pod_meta,
                "spec": {
                    "serviceAccountName": PLUGIN,
                    "priorityClassName": ds.priority_class_name.as_deref().unwrap_or("system-node-critical"),
                    "nodeSelector": { DRA_DRIVER_LABEL: "true" },
                    "tolerations": ds.tolerations,
                    "imagePullSecrets": t.pull_secrets(),
                    "containers": containers,
                    "volumes": [
                        { "name": "plugins-registry", "hostPath": { "path": format!("{kubelet}/plugins_registry"), "type": "DirectoryOrCreate" } },
                        { "name": "plugins", "hostPath": { "path": format!("{kubelet}/plugins"), "type": "DirectoryOrCreate" } },
                        { "name": "cdi", "hostPath": { "path": "/var/run/cdi", "type": "DirectoryOrCreate" } },
                        { "name": "driver-root", "hostPath": { "path": t.spec.host_paths.driver_root(), "type": "Directory" } },
                    ],
                },
            },
        },
    }))
}
