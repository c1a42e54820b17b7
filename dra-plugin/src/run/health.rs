//! The health tasks: the gRPC liveness service, and the monitor that feeds hardware health events
//! into the tracker, republishing taints and waking the kubelet's health streams.
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dra_plugin_core::backend::{DeviceBackend, HealthEvent};
use dra_plugin_core::health::HealthTracker;
use tokio::sync::watch;
use tracing::warn;

use super::shutdown::wait;

/// gRPC health (`liveness`): serving only while our own registration socket answers GetInfo.
pub(super) async fn spawn_health(
    port: u16,
    reg_path: std::path::PathBuf,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let (reporter, service) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port))).await?;
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, wait(shutdown.clone())),
    );
    tokio::spawn(async move {
        loop {
            let ok = crate::grpc::client::get_info(&reg_path).await.is_ok();
            let status = if ok {
                tonic_health::ServingStatus::Serving
            } else {
                tonic_health::ServingStatus::NotServing
            };
            reporter.set_service_status("liveness", status).await;
            tokio::time::sleep(Duration::from_secs(10)).await;
            if *shutdown.borrow() {
                break;
            }
        }
    });
    Ok(())
}

/// Feeds the backend's health events into the tracker; on every change republishes the slices
/// with taints and wakes the kubelet health streams. Faults are also expired once a second.
pub(super) fn spawn_health_monitor(
    backend: Arc<dyn DeviceBackend>,
    tracker: Arc<Mutex<HealthTracker>>,
    changed: watch::Sender<u64>,
    publish: impl Fn(&HealthTracker) + Send + 'static,
    shutdown: watch::Receiver<bool>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<HealthEvent>>(16);
    let stop = shutdown.clone();
    std::thread::Builder::new()
        .name("health-events".into())
        .spawn(move || {
            while !*stop.borrow() {
                match backend.health_events(Duration::from_secs(1)) {
                    Ok(events) if events.is_empty() => {}
                    Ok(events) => {
                        if tx.blocking_send(events).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        warn!(error = %e, "reading health events failed");
                        std::thread::sleep(Duration::from_secs(5));
                    }
                }
            }
        })
        .expect("spawning the health thread");
    tokio::spawn(async move {
        let mut shutdown = shutdown;
        loop {
            let events = tokio::select! {
                e = rx.recv() => match e { Some(e) => e, None => return },
                _ = tokio::time::sleep(Duration::from_secs(1)) => Vec::new(),
                _ = shutdown.changed() => return,
            };
            let now = std::time::SystemTime::now();
            let mut t = tracker.lock().expect("health lock");
            let mut dirty = t.expire(now);
            for ev in &events {
                warn!(gpu = ev.minor, uuid = %ev.uuid, kind = ?ev.kind, "GPU health event");
                dirty |= t.apply(ev, now);
            }
            if dirty {
                publish(&t);
                drop(t);
                changed.send_modify(|n| *n += 1);
            }
        }
    });
}
