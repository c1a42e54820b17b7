//! The GPUCluster reconciler against a mock API server: the exact calls, in order, and their bodies.
use std::sync::Arc;
use std::time::Duration;

use dra_controller::controller::Error;
use dra_controller::controller::crd::GPUCluster;
use dra_controller::controller::gpucluster::{Ctx, error_policy, reconcile};
use gpu_dra_api::names;
use http::Method;
use kube::runtime::controller::Action;
use serde_json::{Value, json};

mod controller_mock;
use controller_mock::{Call, Handle, Reply, call, list, serve};

fn ctx() -> (Arc<Ctx>, Handle) {
    let (client, handle, metrics) = controller_mock::client();
    (
        Arc::new(Ctx {
            client,
            namespace: "gpu-dra".into(),
            metrics,
            log_env: Vec::new(),
        }),
        handle,
    )
}

fn gpucluster(extra_meta: Value, spec: Value) -> GPUCluster {
    let mut meta =
        json!({ "name": "gpu-cluster", "uid": "uid-1", "resourceVersion": "7", "generation": 2 });
    meta.as_object_mut()
        .unwrap()
        .extend(extra_meta.as_object().unwrap().clone());
    serde_json::from_value(json!({ "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster", "metadata": meta, "spec": spec }))
        .unwrap()
}

fn finalized(spec: Value) -> GPUCluster {
    gpucluster(json!({ "finalizers": [names::GPUCLUSTER_FINALIZER] }), spec)
}

fn node(name: &str, labels: Value, gpus: Option<&str>) -> Value {
    let allocatable = gpus.map_or(
        json!({ "cpu": "8" }),
        |n| json!({ "cpu": "8", "nvidia.com/gpu": n }),
    );
    json!({ "metadata": { "name": name, "labels": labels }, "status": { "allocatable": allocatable } })
}

/// The first call of every reconcile: looking for the GPU Operator's Deployment.
const OPERATORS: &str = "/apis/apps/v1/deployments";

fn no_operator() -> Call {
    call(Method::GET, OPERATORS, list("Deployment", vec![]))
}

/// The GPUCluster CRD's schema check; unreadable (here: not found) does not stop the reconcile.
fn crd_unreadable() -> Call {
    call(
        Method::GET,
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gpuclusters.nvidia.com",
        Reply::Status(404),
    )
}

/// Reconcile with no GPU Operator around; the bodies seen after the operator and CRD lookups.
async fn run(gc: GPUCluster, calls: Vec<Call>) -> (Action, Vec<(String, Value)>) {
    let lookups = [no_operator(), crd_unreadable()];
    let (action, mut seen) = run_raw(gc, lookups.into_iter().chain(calls).collect()).await;
    let operator_lookup = seen.remove(0).0;
    assert!(operator_lookup.contains("fieldSelector=metadata.name%3Dgpu-operator"));
    seen.remove(0);
    (action, seen)
}

async fn run_raw(gc: GPUCluster, calls: Vec<Call>) -> (Action, Vec<(String, Value)>) {
    let (ctx, handle) = ctx();
    let server = serve(handle, calls);
    let action = reconcile(Arc::new(gc), ctx)
        .await
        .expect("reconcile succeeds");
    (action, server.await.expect("mock server"))
}

const GC: &str = "/apis/nvidia.com/v1alpha1/gpuclusters/gpu-cluster";
const DC: &str = "/apis/resource.k8s.io/v1/deviceclasses/";

#[tokio::test]
async fn first_reconcile_adds_the_finalizer_and_nothing_else() {
    let gc = gpucluster(json!({}), json!({ "draDriver": {} }));
    let echo = serde_json::to_value(&gc).unwrap();
    let (action, seen) = run(gc, vec![call(Method::PATCH, GC, Reply::Json(echo))]).await;
    assert_eq!(action, Action::await_change());
    assert_eq!(
        seen[0].1["metadata"]["finalizers"],
        json!([names::GPUCLUSTER_FINALIZER])
    );
    assert_eq!(
        seen[0].1["metadata"]["resourceVersion"], "7",
        "finalizer write must be optimistic"
    );
}

#[tokio::test]
async fn converge_applies_everything_and_keeps_conflicting_nodes_off_the_plugin() {
    let gc = finalized(json!({ "draDriver": { "computeDomains": { "enabled": false } } }));
    let gc_json = serde_json::to_value(&gc).unwrap();
    let nodes = vec![
        node("g1", json!({ "nvidia.com/gpu.present": "true" }), Some("0")),
        node("g2", json!({ "nvidia.com/gpu.present": "true" }), Some("4")),
        node("cpu", json!({}), None),
    ];
    let ds_reply = json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": { "name": "gpu-dra-kubelet-plugin", "namespace": "gpu-dra" },
        "status": { "desiredNumberScheduled": 1, "numberReady": 1, "currentNumberScheduled": 1, "numberMisscheduled": 0 },
    });
    let mut calls = vec![
        call(Method::GET, "/api/v1/nodes", list("Node", nodes)),
        call(
            Method::GET,
            "/apis/resource.k8s.io/v1/resourceclaims",
            list("ResourceClaim", vec![]),
        ),
        call(
            Method::GET,
            "/api/v1/namespaces/gpu-dra/pods",
            list("Pod", vec![]),
        ),
    ];
    for class in [
        "gpu.nvidia.com",
        "mig.nvidia.com",
        "vfio.gpu.nvidia.com",
        "compute-domain-daemon.nvidia.com",
        "compute-domain-default-channel.nvidia.com",
    ] {
        calls.push(call(
            Method::PATCH,
            format!("{DC}{class}").leak(),
            Reply::Echo,
        ));
    }
    // The mapping lives on gpu.nvidia.com, so the optional migration class must be gone.
    calls.push(call(
        Method::DELETE,
        format!("{DC}migration.gpu.nvidia.com").leak(),
        Reply::Status(404),
    ));
    calls.extend([
        call(Method::PATCH, "/api/v1/namespaces/gpu-dra/serviceaccounts/gpu-dra-kubelet-plugin", Reply::Echo),
        call(Method::PATCH, "/apis/rbac.authorization.k8s.io/v1/clusterroles/gpu-dra-kubelet-plugin", Reply::Echo),
        call(Method::PATCH, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/gpu-dra-kubelet-plugin", Reply::Echo),
        call(
            Method::PATCH,
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/gpu-dra-resourceslices-own-node",
            Reply::Echo,
        ),
        call(
            Method::PATCH,
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/gpu-dra-resourceslices-own-node",
            Reply::Echo,
        ),
        call(Method::PATCH, "/apis/apps/v1/namespaces/gpu-dra/daemonsets/gpu-dra-kubelet-plugin", Reply::Json(ds_reply)),
        call(Method::DELETE, "/apis/apps/v1/namespaces/gpu-dra/deployments/compute-domain-controller", Reply::Status(404)),
        // spec.dcgmExporter is unset and its template absent: nothing to prune.
        call(Method::GET, "/apis/resource.k8s.io/v1/namespaces/gpu-dra/resourceclaimtemplates/nvidia-dcgm-exporter", Reply::Status(404)),
        call(Method::PATCH, "/api/v1/nodes/g1", Reply::Echo),
        call(Method::PATCH, "/api/v1/nodes/g2", Reply::Echo),
        call(Method::PATCH, "/apis/nvidia.com/v1alpha1/gpuclusters/gpu-cluster/status", Reply::Json(gc_json)),
    ]);
    let (action, seen) = run(gc, calls).await;
    assert_eq!(
        action,
        Action::requeue(Duration::from_secs(5)),
        "a conflicting node is re-checked soon"
    );

    let body = |suffix: &str| {
        &seen
            .iter()
            .find(|(u, _)| u.split('?').next().unwrap().ends_with(suffix))
            .unwrap()
            .1
    };
    // Every write is a forced server-side apply under our field manager.
    for (uri, _) in seen
        .iter()
        .filter(|(u, _)| !u.contains("/pods") && !u.starts_with("/api/v1/nodes?"))
    {
        if uri.contains("fieldManager") {
            assert!(
                uri.contains("fieldManager=gpu-dra-controller") && uri.contains("force=true"),
                "{uri}"
            );
        }
    }
    assert!(
        seen[2]
            .0
            .contains("labelSelector=app.kubernetes.io%2Fname%3Dgpu-dra-kubelet-plugin"),
        "{}",
        seen[2].0
    );
    // Owned by the GPUCluster, so the garbage collector cleans up what teardown leaves.
    let owner = &body("deviceclasses/gpu.nvidia.com")["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["uid"].as_str(), owner["controller"].as_bool()),
        (Some("uid-1"), Some(true))
    );
    // NVIDIA's placement of the `nvidia.com/gpu` mapping by default.
    assert_eq!(
        body("deviceclasses/gpu.nvidia.com")["spec"]["extendedResourceName"],
        "nvidia.com/gpu"
    );
    // The plugin runs only where the pool marked the node ready; no compute-domains container.
    let ds = body("daemonsets/gpu-dra-kubelet-plugin");
    assert_eq!(
        ds["spec"]["template"]["spec"]["nodeSelector"],
        json!({ names::DRA_DRIVER_LABEL: "true" })
    );
    let containers = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(
        containers
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["gpus"]
    );
    assert_eq!(containers[0]["livenessProbe"]["grpc"]["port"], 51516);
    let vap = body("validatingadmissionpolicies/gpu-dra-resourceslices-own-node");
    assert!(
        vap["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap()
            .contains("system:serviceaccount:gpu-dra:gpu-dra-kubelet-plugin")
    );
    // Node labels: ready node gets both, conflicting node only loses the device plugin, the CPU node is untouched.
    assert_eq!(
        body("/nodes/g1")["metadata"]["labels"],
        json!({ names::DEVICE_PLUGIN_LABEL: "false", names::DRA_DRIVER_LABEL: "true" })
    );
    assert_eq!(
        body("/nodes/g2")["metadata"]["labels"],
        json!({ names::DEVICE_PLUGIN_LABEL: "false" })
    );
    assert_eq!(
        (
            &body("gpu-cluster/status")["apiVersion"],
            &body("gpu-cluster/status")["kind"]
        ),
        (&json!("nvidia.com/v1alpha1"), &json!("GPUCluster"))
    );
    let status = &body("gpu-cluster/status")["status"];
    assert_eq!(status["state"], "notReady");
    assert_eq!(
        (status["poolNodes"].as_i64(), status["readyNodes"].as_i64()),
        (Some(2), Some(1))
    );
    assert_eq!(status["conflictingNodes"], json!(["g2"]));
    assert_eq!(status["namespace"], "gpu-dra");
    let conflict = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "PoolConflict")
        .unwrap();
    assert_eq!(conflict["status"], "True");
}

#[tokio::test]
async fn teardown_waits_for_claim_consumers_before_touching_the_plugin() {
    let gc = gpucluster(
        json!({ "finalizers": [names::GPUCLUSTER_FINALIZER], "deletionTimestamp": "2026-01-01T00:00:00Z" }),
        json!({ "draDriver": {} }),
    );
    let deploy = json!({ "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": "compute-domain-controller", "namespace": "gpu-dra", "deletionTimestamp": "2026-01-01T00:00:00Z" } });
    let calls = vec![
        call(
            Method::DELETE,
            "/apis/apps/v1/namespaces/gpu-dra/deployments/compute-domain-controller",
            Reply::Json(deploy),
        ),
        call(
            Method::GET,
            "/apis/apps/v1/namespaces/gpu-dra/daemonsets",
            list("DaemonSet", vec![]),
        ),
        call(
            Method::GET,
            "/apis/resource.k8s.io/v1/namespaces/gpu-dra/resourceclaimtemplates/nvidia-dcgm-exporter",
            Reply::Status(404),
        ),
    ];
    let (action, seen) = run(gc, calls).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(5)));
    assert!(
        seen[0].1["propagationPolicy"] == "Foreground",
        "{:?}",
        seen[0].1
    );
    assert!(seen[1].0.contains("compute-domain-daemon"), "{}", seen[1].0);
}

#[tokio::test]
async fn teardown_removes_the_plugin_last_then_labels_then_the_finalizer() {
    let gc = gpucluster(
        json!({ "finalizers": [names::GPUCLUSTER_FINALIZER, "other/keep"], "deletionTimestamp": "2026-01-01T00:00:00Z" }),
        json!({ "draDriver": {} }),
    );
    let gc_json = serde_json::to_value(&gc).unwrap();
    let ours = json!([{ "manager": "gpu-dra-controller", "operation": "Apply", "apiVersion": "v1", "fieldsType": "FieldsV1",
        "fieldsV1": { "f:metadata": { "f:labels": { format!("f:{}", names::DEVICE_PLUGIN_LABEL): {} } } } }]);
    let mut managed = node("g1", json!({ names::DEVICE_PLUGIN_LABEL: "false" }), None);
    managed["metadata"]["managedFields"] = ours;
    let untouched = node("g2", json!({ names::DEVICE_PLUGIN_LABEL: "false" }), None);
    let gone = json!({ "kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200 });
    let calls = vec![
        call(
            Method::DELETE,
            "/apis/apps/v1/namespaces/gpu-dra/deployments/compute-domain-controller",
            Reply::Status(404),
        ),
        call(
            Method::GET,
            "/apis/apps/v1/namespaces/gpu-dra/daemonsets",
            list("DaemonSet", vec![]),
        ),
        call(
            Method::GET,
            "/apis/resource.k8s.io/v1/namespaces/gpu-dra/resourceclaimtemplates/nvidia-dcgm-exporter",
            Reply::Status(404),
        ),
        call(
            Method::DELETE,
            "/apis/apps/v1/namespaces/gpu-dra/daemonsets/gpu-dra-kubelet-plugin",
            Reply::Json(gone),
        ),
        call(
            Method::GET,
            "/api/v1/nodes",
            list("Node", vec![managed, untouched]),
        ),
        call(Method::PATCH, "/api/v1/nodes/g1", Reply::Echo),
        call(Method::PATCH, GC, Reply::Json(gc_json)),
    ];
    let (action, seen) = run(gc, calls).await;
    assert_eq!(action, Action::await_change());
    assert_eq!(
        seen[5].1["metadata"]["labels"],
        json!({}),
        "releases every label we own"
    );
    assert_eq!(seen[6].1["metadata"]["finalizers"], json!(["other/keep"]));
}

#[tokio::test]
async fn api_errors_surface_and_the_error_policy_backs_off() {
    let gc = finalized(json!({ "draDriver": {} }));
    let (ctx, handle) = ctx();
    let server = serve(
        handle,
        vec![
            no_operator(),
            crd_unreadable(),
            call(Method::GET, "/api/v1/nodes", Reply::Status(500)),
        ],
    );
    let err = reconcile(Arc::new(gc.clone()), ctx.clone())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Kube(_)), "{err}");
    assert_eq!(
        error_policy(Arc::new(gc.clone()), &err, ctx.clone()),
        Action::requeue(Duration::from_secs(15))
    );
    let bad = Error::Selector("x".into());
    assert_eq!(
        error_policy(Arc::new(gc), &bad, ctx.clone()),
        Action::requeue(Duration::from_secs(300))
    );
    drop(ctx);
    server.await.unwrap();
}
