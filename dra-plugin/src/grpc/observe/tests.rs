use std::time::Duration;

use kubelet_proto::registration::{self as reg, registration_client::RegistrationClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::grpc::client::unix_channel;
use crate::metrics::SocketErrorLabels;

/// A registration socket whose GetInfo answers Unimplemented and whose other calls never
/// answer; stops when the returned sender is dropped.
async fn serve(dir: &std::path::Path, metrics: &Arc<Metrics>) -> tokio::sync::oneshot::Sender<()> {
    let (listener, guard) = crate::grpc::server::bind(&dir.join("reg.sock")).unwrap();
    let service = hyper::service::service_fn(|req: http::Request<Incoming>| async move {
        if req.uri().path().ends_with("/GetInfo") {
            return Ok::<_, Infallible>(tonic::Status::unimplemented("not here").into_http());
        }
        std::future::pending().await
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let observer = Observer::new(Socket::Registration, metrics.clone());
    tokio::spawn(async move {
        crate::grpc::server::serve(listener, service, observer, async move {
            let _ = stopped.await;
        })
        .await;
        drop(guard);
    });
    stop
}

fn count(metrics: &Metrics, reason: &'static str) -> u64 {
    metrics
        .socket_errors
        .get_or_create(&SocketErrorLabels {
            socket: "registration",
            reason,
        })
        .get()
}

/// Waits up to two seconds for `reason`'s count to reach `n`.
async fn counted(metrics: &Metrics, reason: &'static str, n: u64) {
    for _ in 0..200 {
        if count(metrics, reason) >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(count(metrics, reason), n, "{reason}\n{}", metrics.encode());
}

#[tokio::test]
async fn refused_http2_is_a_protocol_error_and_a_peer_hanging_up_is_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let _stop = serve(dir.path(), &metrics).await;
    let sock = dir.path().join("reg.sock");

    // Connected and gone without a word, as a health probe or an idle kubelet connection.
    drop(tokio::net::UnixStream::connect(&sock).await.unwrap());
    // HTTP/1.1 where HTTP/2 is expected: refused with a GOAWAY.
    let mut s = tokio::net::UnixStream::connect(&sock).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer).await;
    counted(&metrics, "protocol", 1).await;
    for reason in ["io", "transport", "peer_error", "cancelled"] {
        assert_eq!(count(&metrics, reason), 0, "{reason}");
    }
}

#[tokio::test]
async fn failed_and_abandoned_calls_are_counted_by_reason() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let _stop = serve(dir.path(), &metrics).await;
    let channel = unix_channel(&dir.path().join("reg.sock")).await.unwrap();
    let mut client = RegistrationClient::new(channel);

    let err = client.get_info(reg::InfoRequest {}).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    counted(&metrics, "unimplemented", 1).await;

    // The client's deadline passes: it resets the stream and the handler's future is dropped.
    let call = client.notify_registration_status(reg::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(100), call)
            .await
            .is_err()
    );
    counted(&metrics, "cancelled", 1).await;
    assert_eq!(count(&metrics, "protocol"), 0);
}

#[test]
fn every_status_code_has_its_own_label() {
    let labels: std::collections::HashSet<_> =
        (0..=16).map(|c| code_reason(Code::from_i32(c))).collect();
    assert_eq!(labels.len(), 17);
}
