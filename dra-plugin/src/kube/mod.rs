//! The Kubernetes side: ResourceClaims in; ResourceSlices (with health taints) and Events out.
pub mod claims;
pub mod events;
pub mod publisher;
pub mod taints;
