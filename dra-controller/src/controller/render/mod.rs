//! Pure builders: GPUCluster spec in, the objects the controller applies out.
mod cdctl;
mod dcgm;
mod plugin;
mod rbac;
mod vap;

pub use cdctl::{CD_CONTROLLER, cd_controller_deployment};
pub use dcgm::{
    ADMIN_ACCESS_LABEL, DCGM_EXPORTER, DCGM_METRICS_PORT, admin_access_namespace,
    dcgm_claim_template, dcgm_exporter_daemonset, dcgm_exporter_service, enabled_exporter,
};
pub use plugin::{
    CDI_ROOT, CONTAINER_DRIVER_ROOT, METRICS_PORT, PLUGIN, PluginPaths, plugin_daemonset,
};
pub use rbac::{cd_controller_rbac, plugin_rbac};
pub use vap::{VAP_NAME, slice_policy, slice_policy_binding};

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::crd::{GPUClusterSpec, KubeletPluginSpec};
use super::error::{Error, Result};
use super::labels::{COMPONENT, MANAGED_BY, PART_OF};

pub const DEFAULT_REPOSITORY: &str = "ghcr.io/gpu-dra";
pub const DEFAULT_IMAGE: &str = "gpu-dra-driver";
pub const DEFAULT_VERSION: &str = concat!("v", env!("CARGO_PKG_VERSION"));

/// Everything a builder needs besides the spec.
pub struct Target<'a> {
    pub namespace: &'a str,
    pub owner: OwnerReference,
    pub spec: &'a GPUClusterSpec,
    /// Logging variables (`LOG_VERBOSITY`, `LOGGING_FORMAT`) every rendered container gets; a
    /// component's own `env` in the spec overrides them.
    pub log_env: &'a [(&'static str, String)],
}

impl Target<'_> {
    /// [`Target::log_env`] as container env entries.
    fn log_env_entries(&self) -> impl Iterator<Item = Value> + '_ {
        self.log_env
            .iter()
            .map(|(name, value)| json!({ "name": name, "value": value }))
    }

    pub fn image(&self) -> String {
        let d = &self.spec.dra_driver;
        format!(
            "{}/{}:{}",
            d.repository
                .as_deref()
                .unwrap_or(DEFAULT_REPOSITORY)
                .trim_end_matches('/'),
            d.image.as_deref().unwrap_or(DEFAULT_IMAGE),
            d.version.as_deref().unwrap_or(DEFAULT_VERSION)
        )
    }

    pub fn pull_policy(&self) -> &str {
        self.spec
            .dra_driver
            .image_pull_policy
            .as_deref()
            .unwrap_or("IfNotPresent")
    }

    /// `Name=true,Other=false`, in name order.
    pub fn feature_gates(&self) -> String {
        let gates = &self.spec.dra_driver.feature_gates;
        gates
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn pull_secrets(&self) -> Value {
        json!(
            self.spec
                .dra_driver
                .image_pull_secrets
                .iter()
                .map(|n| json!({ "name": n }))
                .collect::<Vec<_>>()
        )
    }

    /// Standard labels for a component, plus the spec's extra DaemonSet labels when `extra`.
    pub fn labels(&self, component: &str, extra: bool) -> BTreeMap<String, String> {
        let mut l = BTreeMap::new();
        if extra {
            l.extend(self.spec.daemonsets.labels.clone());
        }
        l.insert("app.kubernetes.io/name".into(), component.into());
        l.insert(COMPONENT.into(), component.into());
        l.insert(PART_OF.0.into(), PART_OF.1.into());
        l.insert(MANAGED_BY.0.into(), MANAGED_BY.1.into());
        l
    }

    pub fn metadata(&self, name: &str, namespace: Option<&str>, component: &str) -> Value {
        let mut m = json!({
            "name": name,
            "labels": self.labels(component, false),
            "ownerReferences": [self.owner],
        });
        if let Some(ns) = namespace {
            m["namespace"] = json!(ns);
        }
        m
    }
}

/// Env and resources of one container, from a spec block; `base` env goes first, the user's may override.
fn container_env(base: Vec<Value>, plugin: &[k8s_openapi::api::core::v1::EnvVar]) -> Value {
    let mut env = base;
    for e in plugin {
        env.retain(|b| b["name"] != json!(e.name));
        env.push(json!(e));
    }
    json!(env)
}

fn liveness(spec: &KubeletPluginSpec, default_port: i32) -> Option<Value> {
    spec.health_port(default_port).map(|port| {
        json!({
            "grpc": { "port": port, "service": "liveness" },
            "initialDelaySeconds": 30,
            "periodSeconds": 10,
            "failureThreshold": 3,
        })
    })
}

fn typed<T: DeserializeOwned>(v: Value) -> Result<T> {
    serde_json::from_value(v).map_err(Error::Serialize)
}
