//! `spec.dcgmExporter`: the admin-access claim template, the exporter DaemonSet and its Service.
use dra_controller::controller::crd::GPUClusterSpec;
use dra_controller::controller::render::{self, DCGM_EXPORTER, Target};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{Value, json};

fn spec(v: Value) -> GPUClusterSpec {
    serde_json::from_value(v).expect("spec parses")
}

fn target(spec: &GPUClusterSpec) -> Target<'_> {
    Target {
        namespace: "gpu-dra",
        owner: OwnerReference {
            api_version: "nvidia.com/v1alpha1".into(),
            kind: "GPUCluster".into(),
            name: "gpu-cluster".into(),
            uid: "uid-1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        },
        spec,
        log_env: &[],
    }
}

#[test]
fn the_exporter_runs_when_present_unless_disabled() {
    for (v, on) in [
        (json!({ "draDriver": {} }), false),
        (json!({ "draDriver": {}, "dcgmExporter": {} }), true),
        (
            json!({ "draDriver": {}, "dcgmExporter": { "enabled": true } }),
            true,
        ),
        (
            json!({ "draDriver": {}, "dcgmExporter": { "enabled": false } }),
            false,
        ),
    ] {
        let s = spec(v.clone());
        assert_eq!(render::enabled_exporter(&target(&s)).is_some(), on, "{v}");
    }
}

#[test]
fn the_template_asks_for_every_gpu_with_admin_access() {
    let s = spec(json!({ "draDriver": {}, "dcgmExporter": {} }));
    let rct = render::dcgm_claim_template(&target(&s)).unwrap();
    assert_eq!(rct.metadata.name.as_deref(), Some(DCGM_EXPORTER));
    assert_eq!(rct.metadata.namespace.as_deref(), Some("gpu-dra"));
    assert_eq!(
        rct.metadata.owner_references.as_ref().unwrap()[0].uid,
        "uid-1"
    );
    let reqs = rct
        .spec
        .unwrap()
        .spec
        .unwrap()
        .devices
        .unwrap()
        .requests
        .unwrap();
    assert_eq!(reqs.len(), 1);
    let ex = reqs[0].exactly.as_ref().unwrap();
    assert_eq!(ex.device_class_name, "gpu.nvidia.com");
    assert_eq!(ex.allocation_mode.as_deref(), Some("All"));
    assert_eq!(ex.admin_access, Some(true));
}

#[test]
fn the_daemonset_uses_the_template_on_plugin_nodes_with_the_spec_image() {
    let s = spec(json!({
        "draDriver": {},
        "dcgmExporter": {
            "repository": "registry.example/nv/", "image": "dcgm-exporter", "version": "4.0.0",
            "env": [{ "name": "DCGM_EXPORTER_COLLECTORS", "value": "/etc/custom.csv" }],
            "imagePullSecrets": ["pull"],
            "serviceMonitor": { "enabled": false },
        },
        "daemonsets": { "tolerations": [{ "key": "gpu", "operator": "Exists" }] },
    }));
    let t = target(&s);
    let ds = render::dcgm_exporter_daemonset(&t, render::enabled_exporter(&t).unwrap()).unwrap();
    let pod = ds.spec.template.spec.unwrap();
    let plugin = render::plugin_daemonset(&t).unwrap();
    let plugin_pod = plugin.spec.template.spec.unwrap();
    assert_eq!(pod.node_selector, plugin_pod.node_selector);
    assert_eq!(pod.tolerations, plugin_pod.tolerations);
    let claims = pod.resource_claims.unwrap();
    assert_eq!(
        claims[0].resource_claim_template_name.as_deref(),
        Some(DCGM_EXPORTER)
    );
    let c = &pod.containers[0];
    assert_eq!(
        c.image.as_deref(),
        Some("registry.example/nv/dcgm-exporter:4.0.0")
    );
    let res_claims = c.resources.as_ref().unwrap().claims.as_ref().unwrap();
    assert_eq!(res_claims[0].name, claims[0].name);
    assert_eq!(c.ports.as_ref().unwrap()[0].container_port, 9400);
    let env = c.env.as_ref().unwrap();
    let collectors: Vec<_> = env
        .iter()
        .filter(|e| e.name == "DCGM_EXPORTER_COLLECTORS")
        .collect();
    assert_eq!(collectors.len(), 1);
    assert_eq!(collectors[0].value.as_deref(), Some("/etc/custom.csv"));
    assert!(env.iter().any(|e| e.name == "DCGM_EXPORTER_LISTEN"));
    assert_eq!(pod.image_pull_secrets.unwrap()[0].name, "pull");
    let privileged = c.security_context.as_ref().and_then(|s| s.privileged);
    assert_ne!(privileged, Some(true), "privileged would bypass the claim");
}

#[test]
fn the_defaults_are_nvidias_image_and_the_service_serves_9400() {
    let s = spec(json!({ "draDriver": {}, "dcgmExporter": { "enabled": true } }));
    let t = target(&s);
    let ds = render::dcgm_exporter_daemonset(&t, render::enabled_exporter(&t).unwrap()).unwrap();
    let image = ds.spec.template.spec.unwrap().containers[0]
        .image
        .clone()
        .unwrap();
    assert!(
        image.starts_with("nvcr.io/nvidia/k8s/dcgm-exporter:"),
        "{image}"
    );
    let svc = render::dcgm_exporter_service(&t).unwrap();
    let spec = svc.spec.unwrap();
    assert_eq!(spec.ports.unwrap()[0].port, 9400);
    assert_eq!(
        spec.selector
            .unwrap()
            .get("app.kubernetes.io/name")
            .map(String::as_str),
        Some(DCGM_EXPORTER)
    );
}

#[test]
fn the_namespace_apply_sets_or_drops_only_our_label() {
    let on = render::admin_access_namespace("gpu-dra", true);
    assert_eq!(on["metadata"]["labels"][render::ADMIN_ACCESS_LABEL], "true");
    let off = render::admin_access_namespace("gpu-dra", false);
    assert_eq!(off["metadata"]["labels"], json!({}));
}
