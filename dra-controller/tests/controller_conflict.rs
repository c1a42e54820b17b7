//! The GPUCluster reconciler next to the GPU Operator's GPUCluster controller, against a mock API
//! server: when the operator is active it writes only its `ControllerConflict` condition and a
//! Warning Event, never the finalizer, operands or the rest of status.
use std::sync::Arc;
use std::time::Duration;

use dra_controller::controller::crd::GPUCluster;
use dra_controller::controller::gpucluster::{Ctx, reconcile};
use gpu_dra_api::names;
use http::Method;
use kube::runtime::controller::Action;
use serde_json::{Value, json};

mod controller_mock;
use controller_mock::{Call, Reply, call, list, serve};

const OPERATORS: &str = "/apis/apps/v1/deployments";
const STATUS: &str = "/apis/nvidia.com/v1alpha1/gpuclusters/gpu-cluster/status";
const GC: &str = "/apis/nvidia.com/v1alpha1/gpuclusters/gpu-cluster";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";
const CRD: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gpuclusters.nvidia.com";

/// The installed GPUCluster CRD: ours, or one without `spec.migrationPool` as the operator's.
fn crd(ours: bool) -> Call {
    let mut crd = dra_controller::controller::crd::gpucluster_crd();
    if !ours {
        for v in &mut crd.spec.versions {
            let root = v
                .schema
                .as_mut()
                .unwrap()
                .open_api_v3_schema
                .as_mut()
                .unwrap();
            let spec = root.properties.as_mut().unwrap().get_mut("spec").unwrap();
            spec.properties.as_mut().unwrap().remove("migrationPool");
        }
    }
    call(
        Method::GET,
        CRD,
        Reply::Json(serde_json::to_value(crd).unwrap()),
    )
}

fn gpucluster(meta: Value, status: Value) -> GPUCluster {
    let mut m =
        json!({ "name": "gpu-cluster", "uid": "uid-1", "resourceVersion": "7", "generation": 2 });
    m.as_object_mut()
        .unwrap()
        .extend(meta.as_object().unwrap().clone());
    serde_json::from_value(json!({
        "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
        "metadata": m, "spec": { "draDriver": {} }, "status": status,
    }))
    .unwrap()
}

fn operator_deployment(image: &str) -> Value {
    json!({
        "metadata": { "name": "gpu-operator", "namespace": "gpu-operator" },
        "spec": { "selector": {}, "template": { "spec": { "containers": [ { "name": "gpu-operator", "image": image } ] } } },
    })
}

/// What the operator's controller leaves on the object in a cluster that still has a ClusterPolicy.
fn operator_status() -> Value {
    json!({ "state": "notReady", "namespace": "gpu-operator", "conditions": [
        { "type": "Error", "status": "True", "reason": "PrerequisiteNotMet", "message": "a ClusterPolicy exists",
          "lastTransitionTime": "2026-08-01T10:00:00Z" } ] })
}

async fn run(gc: GPUCluster, calls: Vec<Call>) -> (Action, Vec<(String, Value)>) {
    let (client, handle, metrics) = controller_mock::client();
    let ctx = Arc::new(Ctx {
        client,
        namespace: "gpu-dra".into(),
        metrics,
        log_env: Vec::new(),
    });
    let server = serve(handle, calls);
    let action = reconcile(Arc::new(gc), ctx)
        .await
        .expect("reconcile succeeds");
    (action, server.await.expect("mock server"))
}

#[tokio::test]
async fn a_running_operator_gets_a_condition_and_a_warning_and_nothing_else() {
    let gc = gpucluster(json!({}), operator_status());
    let echo = serde_json::to_value(&gc).unwrap();
    let operators = list(
        "Deployment",
        vec![operator_deployment("nvcr.io/nvidia/gpu-operator:v26.7.0")],
    );
    let (action, seen) = run(
        gc,
        vec![
            call(Method::GET, OPERATORS, operators),
            crd(true),
            call(Method::PATCH, STATUS, Reply::Json(echo)),
            call(Method::POST, EVENTS, Reply::Echo),
        ],
    )
    .await;
    assert_eq!(action, Action::requeue(Duration::from_secs(60)));
    let (uri, patch) = &seen[2];
    assert!(uri.contains("fieldManager=gpu-dra-controller"), "{uri}");
    assert_eq!(patch["metadata"]["resourceVersion"], "7");
    assert!(
        patch["status"].get("state").is_none(),
        "the operator's state stays"
    );
    let conditions = patch["status"]["conditions"].as_array().unwrap();
    assert_eq!(conditions[0]["reason"], "PrerequisiteNotMet", "theirs kept");
    let ours = &conditions[1];
    assert_eq!(
        (&ours["type"], &ours["status"], &ours["reason"]),
        (
            &json!("ControllerConflict"),
            &json!("True"),
            &json!("GPUOperatorRunning")
        )
    );
    let msg = ours["message"].as_str().unwrap();
    assert!(
        msg.contains("gpu-operator/gpu-operator")
            && msg.contains(names::GPUCLUSTER_CONTROLLER_ANNOTATION),
        "{msg}"
    );
    let event = &seen[3].1;
    assert_eq!(
        (
            &event["type"],
            &event["reason"],
            &event["regarding"]["name"]
        ),
        (
            &json!("Warning"),
            &json!("GPUOperatorRunning"),
            &json!("gpu-cluster")
        )
    );
}

#[tokio::test]
async fn an_unchanged_conflict_is_not_written_again() {
    let mut status = operator_status();
    status["conditions"].as_array_mut().unwrap().push(json!({
        "type": "ControllerConflict", "status": "True", "reason": "GPUOperatorManaged",
        "message": "", "lastTransitionTime": "2026-08-01T10:00:00Z" }));
    let managed = json!({ "managedFields": [ { "manager": "gpu-operator", "operation": "Update", "subresource": "status" } ] });
    let gc = gpucluster(managed, status);
    // the same reason, but the message is recomputed: make it match what decide() says
    let facts = dra_controller::controller::conflict::Facts::new(&gc, &[]);
    let dra_controller::controller::conflict::Decision::StandBy { message, .. } =
        dra_controller::controller::conflict::decide(&facts)
    else {
        panic!("stands by")
    };
    let mut gc = gc;
    gc.status.as_mut().unwrap().conditions[1].message = message;
    let (action, seen) = run(
        gc,
        vec![
            call(Method::GET, OPERATORS, list("Deployment", vec![])),
            crd(true),
        ],
    )
    .await;
    assert_eq!(action, Action::requeue(Duration::from_secs(60)));
    assert_eq!(seen.len(), 2, "no write");
}

#[tokio::test]
async fn a_deletion_the_operator_handles_is_not_torn_down_here() {
    let meta = json!({
        "deletionTimestamp": "2026-08-01T10:00:00Z",
        "finalizers": [names::GPUCLUSTER_FINALIZER],
        "annotations": { names::GPUCLUSTER_CONTROLLER_ANNOTATION: "gpu-operator" },
    });
    let gc = gpucluster(meta, operator_status());
    let echo = serde_json::to_value(&gc).unwrap();
    let (_, seen) = run(
        gc,
        vec![
            call(Method::GET, OPERATORS, list("Deployment", vec![])),
            crd(true),
            call(Method::PATCH, STATUS, Reply::Json(echo)),
            call(Method::POST, EVENTS, Reply::Echo),
        ],
    )
    .await;
    let reason = &seen[2].1["status"]["conditions"][1]["reason"];
    assert_eq!(reason, "HandedToGPUOperator");
}

#[tokio::test]
async fn the_annotation_lets_this_controller_reconcile_beside_the_operator() {
    let meta =
        json!({ "annotations": { names::GPUCLUSTER_CONTROLLER_ANNOTATION: "gpu-dra-controller" } });
    let gc = gpucluster(meta, operator_status());
    let echo = serde_json::to_value(&gc).unwrap();
    let operators = list(
        "Deployment",
        vec![operator_deployment("nvcr.io/nvidia/gpu-operator:v26.7.0")],
    );
    let (action, seen) = run(
        gc,
        vec![
            call(Method::GET, OPERATORS, operators),
            crd(true),
            call(Method::PATCH, GC, Reply::Json(echo)),
        ],
    )
    .await;
    assert_eq!(action, Action::await_change());
    assert_eq!(
        seen[2].1["metadata"]["finalizers"],
        json!([names::GPUCLUSTER_FINALIZER]),
        "the first step of a normal reconcile"
    );
}

#[tokio::test]
async fn the_operators_crd_stops_the_controller_before_it_relabels_every_gpu_node() {
    let meta =
        json!({ "annotations": { names::GPUCLUSTER_CONTROLLER_ANNOTATION: "gpu-dra-controller" } });
    let gc = gpucluster(meta, json!({}));
    let echo = serde_json::to_value(&gc).unwrap();
    let (_, seen) = run(
        gc,
        vec![
            call(Method::GET, OPERATORS, list("Deployment", vec![])),
            crd(false),
            call(Method::PATCH, STATUS, Reply::Json(echo)),
            call(Method::POST, EVENTS, Reply::Echo),
        ],
    )
    .await;
    let status = &seen[2].1["status"];
    assert_eq!(
        status["state"], "notReady",
        "the operator's CRD requires a state"
    );
    let ours = &status["conditions"][0];
    assert_eq!(ours["reason"], "ForeignCRD");
    assert!(
        ours["message"]
            .as_str()
            .unwrap()
            .contains("deploy/crds/crds.yaml")
    );
}
