//! The ComputeDomain reconciler against a mock API server: the exact calls, in order, and their bodies.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dra_controller::controller::computedomain::{
    Ctx, DaemonImage, aggregate, error_policy, reconcile,
};
use dra_controller::controller::crd::{ComputeDomain, ComputeDomainNode, DomainStatus};
use dra_controller::controller::{Error, labels};
use gpu_dra_api::names;
use http::Method;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::Action;
use serde_json::{Value, json};

mod controller_mock;
use controller_mock::{Call, Handle, Reply, call, list, serve};

const UID: &str = "0b7c6f0e-3d1a-4c55-9a55-0c2f4f1d2e3a";
const CD: &str = "/apis/resource.nvidia.com/v1beta1/namespaces/team/computedomains/cd1";
const CD_STATUS: &str =
    "/apis/resource.nvidia.com/v1beta1/namespaces/team/computedomains/cd1/status";
const WORKLOAD_RCT: &str =
    "/apis/resource.k8s.io/v1/namespaces/team/resourceclaimtemplates/cd1-channel";
const DAEMON_RCT: &str = "/apis/resource.k8s.io/v1/namespaces/gpu-dra/resourceclaimtemplates/compute-domain-daemon-0b7c6f0e-3d1a-4c55-9a55-0c2f4f1d2e3a";
const DAEMON_DS: &str = "/apis/apps/v1/namespaces/gpu-dra/daemonsets/compute-domain-daemon-0b7c6f0e-3d1a-4c55-9a55-0c2f4f1d2e3a";
const DAEMON_PODS: &str = "/api/v1/namespaces/gpu-dra/pods";
const CLIQUES: &str = "/apis/resource.nvidia.com/v1beta1/namespaces/gpu-dra/computedomaincliques";
const CLIQUE: &str = "/apis/resource.nvidia.com/v1beta1/namespaces/gpu-dra/computedomaincliques/0b7c6f0e-3d1a-4c55-9a55-0c2f4f1d2e3a.cl.1";

fn ctx() -> (Arc<Ctx>, Handle) {
    let (client, handle, metrics) = controller_mock::client();
    (
        Arc::new(Ctx {
            client,
            namespace: "gpu-dra".into(),
            daemon: DaemonImage {
                image: "registry.example.com/imex:1".into(),
                command: ["dra-plugin", "imex-daemon", "run"]
                    .map(String::from)
                    .into(),
                check: ["dra-plugin", "imex-daemon", "check"]
                    .map(String::from)
                    .into(),
            },
            metrics,
            cliques: false,
        }),
        handle,
    )
}

fn domain(extra_meta: Value, status: Value) -> ComputeDomain {
    let mut meta =
        json!({ "name": "cd1", "namespace": "team", "uid": UID, "resourceVersion": "11" });
    meta.as_object_mut()
        .unwrap()
        .extend(extra_meta.as_object().unwrap().clone());
    let mut cd = json!({
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain", "metadata": meta,
        "spec": { "numNodes": 2, "channel": { "resourceClaimTemplate": { "name": "cd1-channel" }, "allocationMode": "All" } },
    });
    if !status.is_null() {
        cd["status"] = status;
    }
    serde_json::from_value(cd).unwrap()
}

fn finalized() -> ComputeDomain {
    domain(
        json!({ "finalizers": [names::COMPUTE_DOMAIN_FINALIZER] }),
        json!({ "status": "NotReady", "nodes": [
            { "name": "node-b", "ipAddress": "10.0.0.2", "cliqueID": "", "index": 1, "status": "NotReady" },
        ] }),
    )
}

fn deleting(finalizers: Value) -> ComputeDomain {
    domain(
        json!({ "finalizers": finalizers, "deletionTimestamp": "2026-01-01T00:00:00Z" }),
        Value::Null,
    )
}

fn pod(node: &str, ready: bool, ip: &str, clique: Option<&str>) -> Value {
    let mut labels = json!({ names::COMPUTE_DOMAIN_NODE_LABEL: UID });
    if let Some(c) = clique {
        labels["resource.nvidia.com/computeDomain.cliqueID"] = json!(c);
    }
    json!({
        "metadata": { "name": format!("daemon-{node}"), "namespace": "gpu-dra", "labels": labels },
        "spec": { "nodeName": node, "containers": [{ "name": "imex-daemon" }] },
        "status": { "podIP": ip, "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }] },
    })
}

async fn run(cd: ComputeDomain, calls: Vec<Call>) -> (Action, Vec<(String, Value)>) {
    let (ctx, handle) = ctx();
    let server = serve(handle, calls);
    let action = reconcile(Arc::new(cd), ctx)
        .await
        .expect("reconcile succeeds");
    (action, server.await.expect("mock server"))
}

fn gone() -> Reply {
    Reply::Json(json!({ "kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200 }))
}

#[tokio::test]
async fn first_reconcile_adds_the_finalizer_and_nothing_else() {
    let cd = domain(json!({ "finalizers": ["other/keep"] }), Value::Null);
    let echo = serde_json::to_value(&cd).unwrap();
    let (action, seen) = run(cd, vec![call(Method::PATCH, CD, Reply::Json(echo))]).await;
    assert_eq!(action, Action::await_change());
    assert_eq!(
        seen[0].1["metadata"]["finalizers"],
        json!(["other/keep", names::COMPUTE_DOMAIN_FINALIZER])
    );
    assert_eq!(seen[0].1["metadata"]["resourceVersion"], "11");
}

#[tokio::test]
async fn converge_creates_templates_and_daemonset_then_aggregates_status() {
    let cd = finalized();
    let cd_json = serde_json::to_value(&cd).unwrap();
    let pods = vec![
        pod("node-b", true, "10.0.0.2", Some("cluster-uuid.1")),
        pod("node-a", false, "10.0.0.1", None),
    ];
    // node-a's daemon pod has no clique label: its node's `nvidia.com/gpu.clique` stands in.
    let clique_node = json!({ "metadata": { "name": "node-a", "labels": {
        names::COMPUTE_DOMAIN_NODE_LABEL: UID, names::GPU_CLIQUE_NODE_LABEL: "cluster-uuid.2" } } });
    let calls = vec![
        call(Method::PATCH, WORKLOAD_RCT, Reply::Echo),
        call(Method::PATCH, DAEMON_RCT, Reply::Echo),
        call(Method::PATCH, DAEMON_DS, Reply::Echo),
        call(Method::GET, DAEMON_PODS, list("Pod", pods)),
        call(
            Method::GET,
            "/api/v1/nodes",
            list("Node", vec![clique_node]),
        ),
        call(Method::PATCH, CD_STATUS, Reply::Json(cd_json)),
    ];
    let (action, seen) = run(cd, calls).await;
    assert_eq!(
        action,
        Action::requeue(Duration::from_secs(3600)),
        "daemon pods are watched: no polling while the domain is not ready"
    );
    let reads = |u: &str| u.starts_with(DAEMON_PODS) || u.starts_with("/api/v1/nodes");
    for (uri, _) in seen.iter().filter(|(u, _)| !reads(u)) {
        assert!(
            uri.contains("fieldManager=gpu-dra-controller") && uri.contains("force=true"),
            "every write is a forced apply under our field manager: {uri}"
        );
    }

    // The workload template: owned by the domain, one channel request, the channel config.
    let rct = &seen[0].1;
    let owner = &rct["metadata"]["ownerReferences"][0];
    assert_eq!(
        (
            owner["kind"].as_str(),
            owner["uid"].as_str(),
            owner["controller"].as_bool()
        ),
        (Some("ComputeDomain"), Some(UID), Some(true))
    );
    let devices = &rct["spec"]["spec"]["devices"];
    assert_eq!(
        devices["requests"],
        json!([{ "name": "channel", "exactly": { "deviceClassName": "compute-domain-default-channel.nvidia.com" } }])
    );
    assert_eq!(
        devices["config"],
        json!([{ "requests": ["channel"], "opaque": { "driver": "compute-domain.nvidia.com", "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig",
            "domainID": UID, "allocationMode": "All" } } }])
    );

    // The daemon template lives in the driver namespace, with no (cross-namespace) owner.
    let drct = &seen[1].1;
    assert!(drct["metadata"]["ownerReferences"].is_null());
    assert_eq!(
        drct["metadata"]["labels"][names::COMPUTE_DOMAIN_NODE_LABEL],
        UID
    );
    assert_eq!(
        drct["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"],
        "compute-domain-daemon.nvidia.com"
    );
    assert_eq!(
        drct["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"],
        json!({ "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainDaemonConfig", "domainID": UID })
    );

    // The DaemonSet follows the node label, claims the daemon device, and leads back to the domain.
    let ds = &seen[2].1;
    assert_eq!(
        ds["metadata"]["labels"][labels::COMPONENT],
        "compute-domain-daemon",
        "GPUCluster teardown finds daemons by this label"
    );
    let pod_spec = &ds["spec"]["template"]["spec"];
    assert_eq!(
        pod_spec["nodeSelector"],
        json!({ names::COMPUTE_DOMAIN_NODE_LABEL: UID })
    );
    assert_eq!(
        pod_spec["resourceClaims"],
        json!([{ "name": "daemon", "resourceClaimTemplateName": format!("compute-domain-daemon-{UID}") }])
    );
    assert_eq!(
        pod_spec["containers"][0]["resources"]["claims"],
        json!([{ "name": "daemon" }])
    );
    assert_eq!(
        pod_spec["containers"][0]["image"],
        "registry.example.com/imex:1"
    );
    // Our supervisor runs the IMEX daemon; its check gates the pod's readiness, as NVIDIA's.
    let daemon = &pod_spec["containers"][0];
    assert_eq!(
        daemon["command"],
        json!(["dra-plugin", "imex-daemon", "run"])
    );
    for (probe, period, failures) in [
        ("startupProbe", 1, 1200),
        ("readinessProbe", 10, 1),
        ("livenessProbe", 60, 20),
    ] {
        assert_eq!(
            daemon[probe],
            json!({ "exec": { "command": ["dra-plugin", "imex-daemon", "check"] },
                    "periodSeconds": period, "timeoutSeconds": 10, "failureThreshold": failures }),
            "{probe}"
        );
    }
    assert_eq!(pod_spec["tolerations"].as_array().map(Vec::len), Some(3));
    assert_eq!(daemon["securityContext"]["runAsUser"], 0);
    assert_eq!(
        ds["spec"]["template"]["metadata"]["annotations"],
        json!({ "resource.nvidia.com/computeDomain.namespace": "team", "resource.nvidia.com/computeDomain.name": "cd1" })
    );

    assert!(
        seen[3]
            .0
            .contains("labelSelector=resource.nvidia.com%2FcomputeDomain%3D"),
        "{}",
        seen[3].0
    );
    assert!(
        seen[4].0.starts_with("/api/v1/nodes?")
            && seen[4]
                .0
                .contains("labelSelector=resource.nvidia.com%2FcomputeDomain%3D"),
        "{}",
        seen[4].0
    );
    // node-b keeps index 1; node-a takes the free 0. One of two nodes ready: NotReady.
    assert_eq!(
        (&seen[5].1["apiVersion"], &seen[5].1["kind"]),
        (
            &json!("resource.nvidia.com/v1beta1"),
            &json!("ComputeDomain")
        )
    );
    assert_eq!(
        seen[5].1["status"],
        json!({ "status": "NotReady", "nodes": [
            { "name": "node-a", "ipAddress": "10.0.0.1", "cliqueID": "cluster-uuid.2", "index": 0, "status": "NotReady" },
            { "name": "node-b", "ipAddress": "10.0.0.2", "cliqueID": "cluster-uuid.1", "index": 1, "status": "Ready" },
        ] })
    );
}

/// A resync that finds nothing changed writes no status: an idle cluster stays quiet.
#[tokio::test]
async fn an_unchanged_status_is_not_written_again() {
    let mut cd = finalized();
    cd.status = serde_json::from_value(json!({ "status": "NotReady", "nodes": [
        { "name": "node-b", "ipAddress": "10.0.0.2", "cliqueID": "", "index": 1, "status": "NotReady" },
    ] }))
    .unwrap();
    let pods = vec![pod("node-b", false, "10.0.0.2", None)];
    let calls = vec![
        call(Method::PATCH, WORKLOAD_RCT, Reply::Echo),
        call(Method::PATCH, DAEMON_RCT, Reply::Echo),
        call(Method::PATCH, DAEMON_DS, Reply::Echo),
        call(Method::GET, DAEMON_PODS, list("Pod", pods)),
        call(Method::GET, "/api/v1/nodes", list("Node", vec![])),
    ];
    let (action, seen) = run(cd, calls).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(3600)));
    assert!(
        !seen.iter().any(|(uri, _)| uri.contains("/status")),
        "{seen:?}"
    );
}

#[tokio::test]
async fn teardown_waits_for_the_daemons_before_their_template() {
    let ds = json!({ "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": { "name": format!("compute-domain-daemon-{UID}"), "namespace": "gpu-dra", "deletionTimestamp": "2026-01-01T00:00:00Z" } });
    let calls = vec![
        call(Method::DELETE, WORKLOAD_RCT, gone()),
        call(Method::DELETE, DAEMON_DS, Reply::Json(ds)),
    ];
    let (action, seen) = run(deleting(json!([names::COMPUTE_DOMAIN_FINALIZER])), calls).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(5)));
    assert_eq!(seen[0].1["propagationPolicy"], "Background");
    assert_eq!(
        seen[1].1["propagationPolicy"], "Foreground",
        "the daemon pods (and their claims) go before the DaemonSet"
    );
}

#[tokio::test]
async fn teardown_removes_template_and_node_labels_then_the_finalizer() {
    let cd = deleting(json!([names::COMPUTE_DOMAIN_FINALIZER, "other/keep"]));
    let cd_json = serde_json::to_value(&cd).unwrap();
    let node = json!({ "metadata": { "name": "node-a", "labels": { names::COMPUTE_DOMAIN_NODE_LABEL: UID } } });
    let clique = json!({ "metadata": { "name": format!("{UID}.cl.1"), "namespace": "gpu-dra" } });
    let calls = vec![
        call(Method::DELETE, WORKLOAD_RCT, Reply::Status(404)),
        call(Method::DELETE, DAEMON_DS, Reply::Status(404)),
        call(Method::DELETE, DAEMON_RCT, gone()),
        // Cliques go whatever the gate says now.
        call(
            Method::GET,
            CLIQUES,
            list("ComputeDomainClique", vec![clique]),
        ),
        call(Method::DELETE, CLIQUE, gone()),
        call(Method::GET, "/api/v1/nodes", list("Node", vec![node])),
        call(
            Method::PATCH,
            "/api/v1/nodes/node-a",
            Reply::Json(json!({ "metadata": { "name": "node-a" } })),
        ),
        call(Method::PATCH, CD, Reply::Json(cd_json)),
    ];
    let (action, seen) = run(cd, calls).await;
    assert_eq!(action, Action::await_change());
    for i in [3, 5] {
        assert!(
            seen[i].0.contains(&format!(
                "labelSelector=resource.nvidia.com%2FcomputeDomain%3D{UID}"
            )),
            "{}",
            seen[i].0
        );
    }
    assert_eq!(
        seen[6].1,
        json!({ "metadata": { "labels": { names::COMPUTE_DOMAIN_NODE_LABEL: null } } })
    );
    assert_eq!(seen[7].1["metadata"]["finalizers"], json!(["other/keep"]));
    assert_eq!(seen[7].1["metadata"]["resourceVersion"], "11");
}

#[tokio::test]
async fn api_errors_surface_and_the_error_policy_backs_off() {
    let cd = finalized();
    let (ctx, handle) = ctx();
    let server = serve(
        handle,
        vec![call(Method::PATCH, WORKLOAD_RCT, Reply::Status(500))],
    );
    let err = reconcile(Arc::new(cd.clone()), ctx.clone())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Kube(_)), "{err}");
    assert_eq!(
        error_policy(Arc::new(cd.clone()), &err, ctx.clone()),
        Action::requeue(Duration::from_secs(15))
    );
    assert_eq!(
        error_policy(
            Arc::new(cd),
            &Error::MissingField("metadata.uid"),
            ctx.clone()
        ),
        Action::requeue(Duration::from_secs(300))
    );
    drop(ctx);
    server.await.unwrap();
}

fn pods(v: Vec<Value>) -> Vec<Pod> {
    v.into_iter()
        .map(|p| serde_json::from_value(p).unwrap())
        .collect()
}

#[test]
fn aggregate_counts_ready_nodes_against_num_nodes() {
    let none = BTreeMap::new();
    let two_ready = pods(vec![
        pod("a", true, "10.0.0.1", None),
        pod("b", true, "10.0.0.2", None),
    ]);
    assert_eq!(
        aggregate(&[], &two_ready, &none, 2).status,
        DomainStatus::Ready
    );
    assert_eq!(
        aggregate(&[], &two_ready, &none, 3).status,
        DomainStatus::NotReady
    );
    // numNodes 0: ready when every daemon that exists is ready, including none yet.
    assert_eq!(aggregate(&[], &[], &none, 0).status, DomainStatus::Ready);
    let one_starting = pods(vec![
        pod("a", true, "10.0.0.1", None),
        pod("b", false, "10.0.0.2", None),
    ]);
    assert_eq!(
        aggregate(&[], &one_starting, &none, 0).status,
        DomainStatus::NotReady
    );
}

#[test]
fn aggregate_keeps_indices_and_skips_terminating_and_unscheduled_pods() {
    let prev = vec![ComputeDomainNode {
        name: "c".into(),
        ip_address: String::new(),
        clique_id: String::new(),
        index: 0,
        status: DomainStatus::Ready,
    }];
    let mut terminating = pod("d", true, "10.0.0.4", None);
    terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let mut unscheduled = pod("e", false, "", None);
    unscheduled["spec"] = json!({ "containers": [{ "name": "imex-daemon" }] });
    let st = aggregate(
        &prev,
        &pods(vec![
            pod("a", true, "10.0.0.1", None),
            pod("c", true, "10.0.0.3", None),
            terminating,
            unscheduled,
        ]),
        &BTreeMap::new(),
        0,
    );
    let got: Vec<_> = st
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.index))
        .collect();
    assert_eq!(got, [("c", 0), ("a", 1)]);
}
