//! The kubelet's gRPC protocols: registration, DRA v1/v1beta1, and serving them on Unix sockets.
pub mod authority;
pub mod client;
pub mod dra;
pub mod health;
pub mod observe;
pub mod registration;
pub mod routes;
pub mod server;
