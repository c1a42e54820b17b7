//! The Kubernetes side: ResourceClaims in, ResourceSlices and Events out.
pub mod claims;
pub mod events;
pub mod publisher;
