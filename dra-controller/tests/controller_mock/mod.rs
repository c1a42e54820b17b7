//! A tower-test mock API server for reconciler tests: expected calls in order, with canned replies.
#![allow(dead_code)]
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

pub type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// A client whose requests go to the returned handle, and fresh metrics, for a reconciler's Ctx.
pub fn client() -> (
    kube::Client,
    Handle,
    std::sync::Arc<dra_controller::controller::metrics::Metrics>,
) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(svc, "default");
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = std::sync::Arc::new(dra_controller::controller::metrics::Metrics::new(
        &mut registry,
    ));
    (client, handle, metrics)
}

/// One expected request and the answer to give.
pub struct Call {
    pub method: Method,
    pub path: &'static str,
    pub reply: Reply,
}

pub enum Reply {
    Json(Value),
    /// Send the request body back, as an apply of a fresh object would.
    Echo,
    Status(u16),
}

pub fn call(method: Method, path: &'static str, reply: Reply) -> Call {
    Call {
        method,
        path,
        reply,
    }
}

/// Serves `calls` in order, then fails if any further request arrives. Returns the request bodies.
pub fn serve(mut handle: Handle, calls: Vec<Call>) -> JoinHandle<Vec<(String, Value)>> {
    tokio::spawn(async move {
        let mut seen = Vec::new();
        for (i, c) in calls.into_iter().enumerate() {
            let (req, send) = handle
                .next_request()
                .await
                .unwrap_or_else(|| panic!("call {i} ({}) never came", c.path));
            let uri = req.uri().to_string();
            assert_eq!(
                (req.method(), req.uri().path()),
                (&c.method, c.path),
                "call {i}: {uri}"
            );
            let bytes = req.into_body().collect_bytes().await.unwrap();
            let body: Value = if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes).unwrap()
            };
            let (code, reply) = match c.reply {
                Reply::Json(v) => (200, v),
                Reply::Echo => (200, body.clone()),
                Reply::Status(code) => (
                    code,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": "NotFound", "message": "gone"}),
                ),
            };
            seen.push((uri, body));
            let resp = Response::builder().status(StatusCode::from_u16(code).unwrap());
            send.send_response(
                resp.body(Body::from(serde_json::to_vec(&reply).unwrap()))
                    .unwrap(),
            );
        }
        assert!(
            handle.next_request().await.is_none(),
            "unexpected extra request"
        );
        seen
    })
}

pub fn list(kind: &str, items: Vec<Value>) -> Reply {
    Reply::Json(
        json!({ "apiVersion": "v1", "kind": format!("{kind}List"), "metadata": {}, "items": items }),
    )
}
