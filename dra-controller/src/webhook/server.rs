//! The HTTPS server: TLS from [`super::tls`], HTTP/1.1 from hyper, one task per connection.
//! `POST /validate` takes an AdmissionReview; `GET /healthz` answers `ok` for probes.
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tracing::{debug, warn};

use super::review::review;

/// The path the ValidatingWebhookConfiguration names.
pub const VALIDATE_PATH: &str = "/validate";
/// The API server sends at most 3 MiB of object; a review adds little to that.
const MAX_BODY: usize = 4 << 20;
/// A client that has not finished its handshake by then is dropped, so it holds no task.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts connections until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let acceptor = TlsAcceptor::from(tls);
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // e.g. out of file descriptors: the next accept may succeed, so keep serving
                Err(e) => {
                    warn!(error = %e, "webhook accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return debug!(%peer, error = %e, "webhook TLS handshake failed"),
                Err(_) => return debug!(%peer, "webhook TLS handshake timed out"),
            };
            let service = hyper::service::service_fn(handle);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                debug!(%peer, error = %e, "webhook connection ended with an error");
            }
        });
    }
}

fn respond(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    response
}

async fn handle(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let text = |status, msg: &str| respond(status, "text/plain", msg.as_bytes().to_vec());
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => Ok(text(StatusCode::OK, "ok")),
        (&Method::POST, VALIDATE_PATH) => {
            let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => return Ok(text(StatusCode::BAD_REQUEST, &e.to_string())),
            };
            let request: serde_json::Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => {
                    let msg = format!("not an AdmissionReview: {e}");
                    return Ok(text(StatusCode::BAD_REQUEST, &msg));
                }
            };
            let answer = review(&request);
            debug!(uid = %answer["response"]["uid"], allowed = %answer["response"]["allowed"], "reviewed");
            let bytes = serde_json::to_vec(&answer).unwrap_or_default();
            Ok(respond(StatusCode::OK, "application/json", bytes))
        }
        _ => Ok(text(StatusCode::NOT_FOUND, "not found")),
    }
}
