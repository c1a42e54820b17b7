//! `spec.dcgmExporter`: NVIDIA's DCGM exporter on the DRA nodes, as the GPU Operator runs it next to
//! its DRA driver. The exporter pod gets the node's GPUs through an admin-access claim in `All` mode,
//! so it sees every GPU (those that workloads hold too) without a device plugin or `privileged`.
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{EnvVar, Service};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Target, container_env, typed};
use crate::controller::crd::OperandSpec;
use crate::controller::error::{Error, Result};
use gpu_dra_api::names::DRA_DRIVER_LABEL;

/// Name of the DaemonSet, its Service and its ResourceClaimTemplate (the operator's names).
pub const DCGM_EXPORTER: &str = "nvidia-dcgm-exporter";
/// The namespace label without which the API server refuses `adminAccess: true` requests.
pub const ADMIN_ACCESS_LABEL: &str = "resource.kubernetes.io/admin-access";
pub const DCGM_METRICS_PORT: i32 = 9400;
pub const DEFAULT_DCGM_REPOSITORY: &str = "nvcr.io/nvidia/k8s";
pub const DEFAULT_DCGM_IMAGE: &str = "dcgm-exporter";
pub const DEFAULT_DCGM_VERSION: &str = "4.4.1-4.6.0-ubuntu22.04";
/// The claim's name inside the exporter pod.
const CLAIM: &str = "gpus";
const GPU_CLASS: &str = "gpu.nvidia.com";

/// The operator's fields of `spec.dcgmExporter` that this controller acts on; the rest stay as written.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ExporterFields {
    repository: Option<String>,
    image: Option<String>,
    version: Option<String>,
    image_pull_policy: Option<String>,
    #[serde(default)]
    image_pull_secrets: Vec<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
    #[serde(default)]
    args: Vec<String>,
    resources: Option<Value>,
}

/// The exporter spec when it is to run: present and not `enabled: false` (the operator's rule).
pub fn enabled_exporter<'a>(t: &Target<'a>) -> Option<&'a OperandSpec> {
    t.spec
        .dcgm_exporter
        .as_ref()
        .filter(|s| s.enabled != Some(false))
}

fn fields(spec: &OperandSpec) -> Result<ExporterFields> {
    let v = Value::Object(spec.rest.clone().into_iter().collect());
    serde_json::from_value(v).map_err(Error::Serialize)
}

/// One request for every GPU of the node, with admin access: the allocator then ignores other
/// claims' holds, and the plugin prepares the devices without refusing them as busy.
pub fn dcgm_claim_template(t: &Target<'_>) -> Result<ResourceClaimTemplate> {
    typed(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": t.metadata(DCGM_EXPORTER, Some(t.namespace), DCGM_EXPORTER),
        "spec": { "spec": { "devices": { "requests": [{
            "name": CLAIM,
            "exactly": { "deviceClassName": GPU_CLASS, "allocationMode": "All", "adminAccess": true },
        }] } } },
    }))
}

pub fn dcgm_exporter_daemonset(t: &Target<'_>, spec: &OperandSpec) -> Result<DaemonSet> {
    let f = fields(spec)?;
    let container = exporter_container(&f);
    let ds = &t.spec.daemonsets;
    let mut meta = t.metadata(DCGM_EXPORTER, Some(t.namespace), DCGM_EXPORTER);
    meta["labels"] = json!(t.labels(DCGM_EXPORTER, true));
    let mut pod_meta = json!({ "labels": t.labels(DCGM_EXPORTER, true) });
    if !ds.annotations.is_empty() {
        meta["annotations"] = json!(ds.annotations);
        pod_meta["annotations"] = json!(ds.annotations);
    }
    let secrets: Vec<Value> = f
        .image_pull_secrets
        .iter()
        .map(|n| json!({ "name": n }))
        .collect();
    let kubelet_root = t.spec.host_paths.kubelet_root().trim_end_matches('/');
    typed(json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta,
        "spec": {
            "selector": { "matchLabels": { "app.kubernetes.io/name": DCGM_EXPORTER } },
            "template": {
                "metadata": pod_meta,
                "spec": {
                    "priorityClassName": ds.priority_class_name.as_deref().unwrap_or("system-node-critical"),
                    // The kubelet plugin's nodes: the claim can only be prepared where it runs.
                    "nodeSelector": { DRA_DRIVER_LABEL: "true" },
                    "tolerations": ds.tolerations,
                    "securityContext": ds.pod_security_context,
                    "imagePullSecrets": secrets,
                    "resourceClaims": [{ "name": CLAIM, "resourceClaimTemplateName": DCGM_EXPORTER }],
                    "containers": [container],
                    "volumes": [{ "name": "pod-gpu-resources", "hostPath": { "path": format!("{kubelet_root}/pod-resources") } }],
                },
            },
        },
    }))
}

/// The exporter container: NVIDIA's env, port and probes, the spec's image, env and args, and the
/// claim in its resources.
fn exporter_container(f: &ExporterFields) -> Value {
    let image = format!(
        "{}/{}:{}",
        f.repository
            .as_deref()
            .unwrap_or(DEFAULT_DCGM_REPOSITORY)
            .trim_end_matches('/'),
        f.image.as_deref().unwrap_or(DEFAULT_DCGM_IMAGE),
        f.version.as_deref().unwrap_or(DEFAULT_DCGM_VERSION)
    );
    let base = vec![
        json!({ "name": "DCGM_EXPORTER_LISTEN", "value": format!(":{DCGM_METRICS_PORT}") }),
        json!({ "name": "DCGM_EXPORTER_KUBERNETES", "value": "true" }),
        json!({ "name": "DCGM_EXPORTER_COLLECTORS", "value": "/etc/dcgm-exporter/dcp-metrics-included.csv" }),
        json!({ "name": "NODE_NAME", "valueFrom": { "fieldRef": { "fieldPath": "spec.nodeName" } } }),
    ];
    let health = json!({ "httpGet": { "port": DCGM_METRICS_PORT, "path": "/health" }, "initialDelaySeconds": 45, "periodSeconds": 5 });
    // Indexing a non-object Value panics; the schema does not type `resources`.
    let mut resources = f
        .resources
        .clone()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    resources["claims"] = json!([{ "name": CLAIM }]);
    let mut container = json!({
        "name": DCGM_EXPORTER,
        "image": image,
        "imagePullPolicy": f.image_pull_policy.as_deref().unwrap_or("IfNotPresent"),
        "env": container_env(base, &f.env),
        "ports": [{ "name": "metrics", "containerPort": DCGM_METRICS_PORT }],
        "livenessProbe": health,
        "readinessProbe": health,
        "resources": resources,
        // Profiling metrics need SYS_ADMIN; not privileged, which would expose every device
        // node whatever the claim says.
        "securityContext": { "capabilities": { "add": ["SYS_ADMIN"] } },
        "volumeMounts": [{ "name": "pod-gpu-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": true }],
    });
    if !f.args.is_empty() {
        container["args"] = json!(f.args);
    }
    container
}

pub fn dcgm_exporter_service(t: &Target<'_>) -> Result<Service> {
    typed(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": t.metadata(DCGM_EXPORTER, Some(t.namespace), DCGM_EXPORTER),
        "spec": {
            "selector": { "app.kubernetes.io/name": DCGM_EXPORTER },
            "ports": [{ "name": "gpu-metrics", "port": DCGM_METRICS_PORT, "targetPort": DCGM_METRICS_PORT, "protocol": "TCP" }],
        },
    }))
}

/// The namespace with our admin-access label (`labelled`) or without it: an apply under our field
/// manager, so a label someone else also set stays when we let go of ours.
pub fn admin_access_namespace(namespace: &str, labelled: bool) -> Value {
    let labels = if labelled {
        json!({ ADMIN_ACCESS_LABEL: "true" })
    } else {
        json!({})
    };
    json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": namespace, "labels": labels } })
}
