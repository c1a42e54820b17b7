//! The recommended labels on everything the controller creates. The driver's own names (driver
//! names, node labels, finalizers, field managers) are in [`gpu_dra_api::names`].
use gpu_dra_api::names::CONTROLLER_FIELD_MANAGER;

/// Recommended labels on everything the controller creates.
pub const PART_OF: (&str, &str) = ("app.kubernetes.io/part-of", "gpu-dra-driver");
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", CONTROLLER_FIELD_MANAGER);
pub const COMPONENT: &str = "app.kubernetes.io/component";
