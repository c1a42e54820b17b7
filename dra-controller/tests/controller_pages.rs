//! Paged lists against a mock API server: every page is requested with the continue token of the
//! one before, and every object reaches the callback.
use dra_controller::controller::pages;
use http::Method;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::json;

mod controller_mock;
use controller_mock::{Reply, call, serve};

fn page(names: &[&str], next: &str) -> Reply {
    let items: Vec<_> = names
        .iter()
        .map(|n| json!({ "metadata": { "name": n } }))
        .collect();
    Reply::Json(
        json!({ "apiVersion": "v1", "kind": "NodeList", "metadata": { "continue": next }, "items": items }),
    )
}

#[tokio::test]
async fn every_page_is_read_in_turn() {
    let (client, handle, _) = controller_mock::client();
    let server = serve(
        handle,
        vec![
            call(Method::GET, "/api/v1/nodes", page(&["a", "b"], "t1")),
            call(Method::GET, "/api/v1/nodes", page(&["c"], "")),
        ],
    );
    let mut names = Vec::new();
    pages::for_each(
        &Api::<Node>::all(client),
        ListParams::default().labels("x=y"),
        |n| names.push(n.name_any()),
    )
    .await
    .unwrap();
    assert_eq!(names, ["a", "b", "c"]);
    let seen = server.await.unwrap();
    let limit = format!("limit={}", pages::PAGE);
    assert!(
        seen[0].0.contains(&limit) && seen[0].0.contains("labelSelector=x%3Dy"),
        "{}",
        seen[0].0
    );
    assert!(!seen[0].0.contains("continue="), "{}", seen[0].0);
    assert!(
        seen[1].0.contains("continue=t1") && seen[1].0.contains(&limit),
        "{}",
        seen[1].0
    );
}
