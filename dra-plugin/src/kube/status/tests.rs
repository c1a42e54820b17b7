use super::*;

fn claim() -> ClaimRef {
    ClaimRef {
        uid: "u1".into(),
        namespace: "ns".into(),
        name: "c".into(),
    }
}

fn device(name: &str, uuid: Option<&str>, share: Option<&str>) -> PreparedDevice {
    PreparedDevice {
        request_names: vec!["gpu".into()],
        pool_name: "n1".into(),
        device_name: name.into(),
        cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim=u1-{name}")],
        share_id: share.map(str::to_string),
        uuid: uuid.map(str::to_string),
    }
}

#[test]
fn prepared_devices_become_entries_with_uuid_share_and_ready() {
    let devices = [
        device("gpu-0", Some("GPU-a"), None),
        device("gpu-1-mig-1g10gb-19-3", Some("MIG-b"), Some("5f1c")),
        device("gpu-2", None, None),
    ];
    let doc = status_patch(
        "gpu.nvidia.com",
        "n1",
        &claim(),
        &devices,
        "2026-01-02T03:04:05Z",
    );
    assert_eq!(
        doc,
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
            "status": {"devices": [
                {
                    "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0",
                    "data": {"uuid": "GPU-a"},
                    "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared",
                        "message": "prepared on node n1", "lastTransitionTime": "2026-01-02T03:04:05Z"}],
                },
                {
                    "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-1-mig-1g10gb-19-3",
                    "shareID": "5f1c",
                    "data": {"uuid": "MIG-b"},
                    "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared",
                        "message": "prepared on node n1", "lastTransitionTime": "2026-01-02T03:04:05Z"}],
                },
                {
                    "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-2",
                    "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared",
                        "message": "prepared on node n1", "lastTransitionTime": "2026-01-02T03:04:05Z"}],
                },
            ]},
        })
    );
    // The entries are valid AllocatedDeviceStatus objects.
    let typed: ResourceClaim = serde_json::from_value(doc).unwrap();
    let entries = typed.status.unwrap().devices.unwrap();
    assert_eq!(entries[1].share_id.as_deref(), Some("5f1c"));
    assert_eq!(entries[0].data.as_ref().unwrap().0["uuid"], "GPU-a");
}

#[test]
fn clearing_names_no_status_so_only_our_entries_go() {
    let doc = status_patch("gpu.nvidia.com", "n1", &claim(), &[], "t");
    assert!(doc.get("status").is_none(), "{doc}");
    assert_eq!(doc["metadata"]["uid"], "u1");
}

#[test]
fn backoff_doubles_to_a_minute() {
    let secs: Vec<u64> = (1..=9).map(|a| backoff(a).as_secs()).collect();
    assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
}

#[test]
fn gone_replaced_and_refused_claims_are_not_retried() {
    let api = |code: u16| {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            ..Default::default()
        }))
    };
    for code in [404, 409, 422] {
        assert!(matches!(classify(api(code)), Outcome::Dropped(_)), "{code}");
    }
    for code in [403, 429, 500, 503] {
        assert!(matches!(classify(api(code)), Outcome::Retry(_)), "{code}");
    }
}

/// The worker's first turn comes at the test's first await (current-thread runtime), so both
/// states are queued by then: only the newest, the clear, may reach the API server.
#[tokio::test(flavor = "current_thread")]
async fn a_claim_unprepared_before_its_apply_went_out_gets_only_the_clear() {
    use http_body_util::BodyExt;
    let (svc, mut api) = tower_test::mock::pair::<
        http::Request<kube::client::Body>,
        http::Response<kube::client::Body>,
    >();
    let client = kube::Client::new(svc, "default");
    let status = ApiClaimStatus::spawn(
        client,
        "gpu.nvidia.com",
        "n1",
        Arc::new(Metrics::new()),
        None,
    );
    status.prepared(&claim(), &[device("gpu-0", Some("GPU-a"), None)]);
    status.unprepared(&claim());
    let (req, reply) = api.next_request().await.expect("one write");
    assert_eq!(
        req.uri().path(),
        "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status"
    );
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let doc: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(doc["metadata"]["uid"], "u1");
    assert!(doc.get("status").is_none(), "not the clear: {doc}");
    reply.send_response(http::Response::new(kube::client::Body::from(
        b"{}".to_vec(),
    )));
    let more = tokio::time::timeout(Duration::from_millis(300), api.next_request()).await;
    assert!(more.is_err(), "a second write went out");
}
