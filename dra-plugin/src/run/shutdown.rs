//! Shutdown: a signal turns a watch channel true, and every task waits on it.
use tokio::sync::watch;
use tracing::info;

/// A channel that turns true on SIGTERM or Ctrl-C.
pub(super) fn shutdown_signal() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => info!("SIGTERM: shutting down"),
            _ = tokio::signal::ctrl_c() => info!("interrupt: shutting down"),
        }
        let _ = tx.send(true);
    });
    rx
}

/// Returns once `rx` is true (or its sender is gone).
pub(super) async fn wait(mut rx: watch::Receiver<bool>) {
    while !*rx.borrow() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}
