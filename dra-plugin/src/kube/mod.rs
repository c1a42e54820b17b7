//! The Kubernetes side: ResourceClaims in; ResourceSlices (with health taints), claim status and
//! Events out.
pub mod claims;
pub mod events;
pub mod publisher;
pub mod status;
pub mod taints;
