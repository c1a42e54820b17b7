//! Failed and refused calls on the kubelet's sockets. The kubelet logs only its own side of a
//! failure, so each one is logged here at WARN with the socket, the method path and a reason, and
//! counted in `gpu_dra_kubelet_socket_errors_total{socket, reason}`.
//!
//! Reasons (a fixed set, as they are metric labels): the gRPC status a handler answered with
//! (`unimplemented`, `internal`, `invalid_argument`, ... as in [`code_reason`]); `cancelled` when
//! the peer gave up on a call before it was answered; `http` for a non-2xx answer without a gRPC
//! status; and for a connection that broke: `protocol` (its HTTP/2 was refused here, with a
//! GOAWAY), `peer_error` (the peer closed it with an error code), `io`, `timeout`, `transport`.
use std::convert::Infallible;
use std::error::Error as StdError;
use std::sync::{Arc, Mutex};

use http::uri::PathAndQuery;
use hyper::body::Incoming;
use tonic::Code;
use tonic::codegen::BoxFuture;
use tracing::{debug, warn};

use crate::metrics::Metrics;

type Response = http::Response<tonic::body::Body>;

/// Which kubelet socket: the `socket` label and log field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Socket {
    Registration,
    Dra,
}

impl Socket {
    pub fn label(self) -> &'static str {
        match self {
            Socket::Registration => "registration",
            Socket::Dra => "dra",
        }
    }
}

/// The metric label for a gRPC status code.
pub fn code_reason(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

/// Logs and counts what goes wrong on one socket.
#[derive(Clone)]
pub struct Observer {
    socket: Socket,
    metrics: Arc<Metrics>,
}

impl Observer {
    pub fn new(socket: Socket, metrics: Arc<Metrics>) -> Self {
        Observer { socket, metrics }
    }

    pub fn socket(&self) -> Socket {
        self.socket
    }

    /// Wraps `service` for one accepted connection; the watch reports how that connection ended.
    pub fn connection<S>(&self, service: S) -> (Observed<S>, ConnectionWatch) {
        let last = Arc::new(Mutex::new(None));
        let observed = Observed {
            inner: service,
            observer: self.clone(),
            last: last.clone(),
        };
        let watch = ConnectionWatch {
            observer: self.clone(),
            last,
        };
        (observed, watch)
    }

    /// Plain `&str` fields: quoted in text (`key="value"`, as klog writes them), strings in JSON.
    fn call_failed(&self, method: &str, reason: &'static str, error: &str) {
        let socket = self.socket.label();
        self.metrics.socket_error(socket, reason);
        warn!(
            socket,
            method, reason, error, "call on a kubelet socket failed"
        );
    }
}

/// `service` with every call's outcome checked; one per connection.
pub struct Observed<S> {
    inner: S,
    observer: Observer,
    /// The path of the connection's latest call, for a connection that breaks.
    last: Arc<Mutex<Option<PathAndQuery>>>,
}

impl<S> hyper::service::Service<http::Request<Incoming>> for Observed<S>
where
    S: hyper::service::Service<http::Request<Incoming>, Response = Response, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<Response, Infallible>;

    fn call(&self, req: http::Request<Incoming>) -> Self::Future {
        let path = req.uri().path_and_query().cloned();
        *self.last.lock().expect("last call lock") = path.clone();
        let mut call = Call {
            observer: self.observer.clone(),
            path,
            answered: false,
        };
        let answer = self.inner.call(req);
        Box::pin(async move {
            let response = answer.await?;
            call.answered(&response);
            Ok(response)
        })
    }
}

/// One call in flight. Dropped unanswered, the peer gave up on it: hyper drops the handler's
/// future when the stream is reset (the kubelet's deadline passed) or the connection is gone.
struct Call {
    observer: Observer,
    path: Option<PathAndQuery>,
    answered: bool,
}

impl Call {
    fn method(&self) -> &str {
        self.path.as_ref().map_or("-", |p| p.path())
    }

    /// Unary answers carry a failed call's status in the headers (trailers-only); a successful
    /// one has no `grpc-status` header at all, so the common case is one failed lookup.
    fn answered(&mut self, response: &Response) {
        self.answered = true;
        let headers = response.headers();
        if headers.contains_key("grpc-status") {
            if let Some(status) = tonic::Status::from_header_map(headers)
                && status.code() != Code::Ok
            {
                let error = format!("{:?}: {}", status.code(), status.message());
                self.observer
                    .call_failed(self.method(), code_reason(status.code()), &error);
            }
        } else if !response.status().is_success() {
            let error = format!("HTTP {}", response.status());
            self.observer.call_failed(self.method(), "http", &error);
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if !self.answered {
            self.observer.call_failed(
                self.method(),
                "cancelled",
                "the peer gave up on the call before it was answered",
            );
        }
    }
}

/// How one connection ended.
pub struct ConnectionWatch {
    observer: Observer,
    last: Arc<Mutex<Option<PathAndQuery>>>,
}

impl ConnectionWatch {
    /// A connection that ended with `error`: WARN and counted, unless the peer simply went away
    /// (the kubelet closes idle connections, and the health check opens one per probe).
    pub fn ended(&self, error: &hyper::Error) {
        let socket = self.observer.socket.label();
        let last = self.last.lock().expect("last call lock").clone();
        let last_method = last.as_ref().map_or("-", |p| p.path());
        let text = chain(error);
        let error_text = text.as_str();
        match classify(error) {
            None => debug!(
                socket,
                last_method,
                error = error_text,
                "connection closed by the peer"
            ),
            Some(reason) => {
                self.observer.metrics.socket_error(socket, reason);
                warn!(
                    socket,
                    last_method,
                    reason,
                    error = error_text,
                    "connection on a kubelet socket failed"
                );
            }
        }
    }
}

/// `error` and its sources on one line: hyper's own message alone is only "http2 error".
fn chain(error: &(dyn StdError + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        out.push_str(": ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}

/// Whether an I/O error is the peer hanging up.
fn hung_up(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        UnexpectedEof | ConnectionReset | BrokenPipe | ConnectionAborted
    )
}

/// The reason label for a connection's error; `None` when the peer just went away. A clean
/// close (EOF between frames, or a GOAWAY without error) ends the connection without an error.
pub fn classify(error: &hyper::Error) -> Option<&'static str> {
    let mut source: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return (!hung_up(io)).then_some("io");
        }
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            if let Some(io) = h2.get_io() {
                return (!hung_up(io)).then_some("io");
            }
            return match (h2.is_remote(), h2.reason()) {
                (true, Some(h2::Reason::NO_ERROR | h2::Reason::CANCEL)) => None,
                (true, _) => Some("peer_error"),
                (false, _) => Some("protocol"),
            };
        }
        source = e.source();
    }
    Some(if error.is_timeout() {
        "timeout"
    } else {
        "transport"
    })
}

#[cfg(test)]
mod tests;
