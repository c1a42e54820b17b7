//! The ComputeDomain controller Deployment: this binary, running only the ComputeDomain controller.
use k8s_openapi::api::apps::v1::Deployment;
use serde_json::json;

use super::{Target, container_env, typed};
use crate::controller::error::Result;

/// Name of the Deployment, its ServiceAccount and its RBAC objects.
pub const CD_CONTROLLER: &str = "compute-domain-controller";

pub fn cd_controller_deployment(t: &Target<'_>) -> Result<Deployment> {
    let spec = &t.spec.dra_driver.compute_domains.controller;
    let mut base = vec![
        json!({ "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } }),
        json!({ "name": "FEATURE_GATES", "value": t.feature_gates() }),
        json!({ "name": "DAEMON_IMAGE", "value": t.image() }),
    ];
    base.extend(t.log_env_entries());
    let mut container = json!({
        "name": "controller",
        "image": t.image(),
        "imagePullPolicy": t.pull_policy(),
        "command": ["dra-controller"],
        "args": ["run", "--controllers=computedomain", format!("--lease-name={CD_CONTROLLER}")],
        "env": container_env(base, &spec.env),
        "ports": [{ "name": "metrics", "containerPort": 8080 }],
        "livenessProbe": { "httpGet": { "path": "/healthz", "port": "metrics" } },
        "readinessProbe": { "httpGet": { "path": "/readyz", "port": "metrics" } },
    });
    if let Some(r) = &spec.resources {
        container["resources"] = json!(r);
    }
    let selector = json!({ "app.kubernetes.io/name": CD_CONTROLLER });
    typed(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": t.metadata(CD_CONTROLLER, Some(t.namespace), CD_CONTROLLER),
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": selector },
            "template": {
                "metadata": { "labels": t.labels(CD_CONTROLLER, false) },
                "spec": {
                    "serviceAccountName": CD_CONTROLLER,
                    "imagePullSecrets": t.pull_secrets(),
                    "containers": [container],
                },
            },
        },
    }))
}
