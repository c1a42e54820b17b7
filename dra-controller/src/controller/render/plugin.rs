//! The kubelet-plugin DaemonSet running `dra-plugin run`, placed only on nodes the migration pool marked
//! ready (`nvidia.com/gpu.deploy.dra-driver=true`).
use gpu_dra_api::names::{COMPUTE_DOMAIN_DRIVER, DRA_DRIVER_LABEL, GPU_DRIVER};
use k8s_openapi::api::apps::v1::DaemonSet;
use serde_json::{Value, json};

use super::{Target, container_env, liveness, typed};
use crate::controller::crd::KubeletPluginSpec;
use crate::controller::error::Result;

/// Name of the DaemonSet, its ServiceAccount and its RBAC objects.
pub const PLUGIN: &str = "gpu-dra-kubelet-plugin";

/// Where the host's driver installation (`hostPaths.driverInstallDir`) appears inside the container. The
/// plugin loads `libnvidia-ml.so.1` below `NVIDIA_DRIVER_ROOT` in its own filesystem view, so this is
/// the value it gets: the host directory itself may be `/`, which cannot be mounted in place.
pub const CONTAINER_DRIVER_ROOT: &str = "/driver-root";
/// The plugin's `METRICS_PORT`; also the container's `metrics` port.
pub const METRICS_PORT: i32 = 8080;
/// Where per-claim CDI specs go, on the host and in the container alike (the runtime reads them there).
pub const CDI_ROOT: &str = "/var/run/cdi";

/// Host directories the plugin uses, all below `hostPaths.kubeletRootDir` and mounted at the same path
/// (the kubelet dials the sockets at the paths the plugin reports).
pub struct PluginPaths {
    /// `REGISTRAR_DIR`: `<kubeletRootDir>/plugins_registry`.
    pub registrar_dir: String,
    /// `PLUGIN_DIR`: `<kubeletRootDir>/plugins/<driver>`.
    pub plugin_dir: String,
}

impl PluginPaths {
    pub fn new(t: &Target<'_>, driver: &str) -> Self {
        let kubelet = t.spec.host_paths.kubelet_root().trim_end_matches('/');
        Self {
            registrar_dir: format!("{kubelet}/plugins_registry"),
            plugin_dir: format!("{kubelet}/plugins/{driver}"),
        }
    }
}

/// The environment of `dra-plugin run` (see `dra-plugin/src/cli.rs`); KUBECONFIG stays unset, so the
/// plugin uses its in-cluster ServiceAccount.
fn base_env(
    t: &Target<'_>,
    driver: &str,
    paths: &PluginPaths,
    health_port: i32,
    metrics_port: i32,
) -> Vec<Value> {
    let mut env = vec![
        json!({ "name": "NODE_NAME", "valueFrom": { "fieldRef": { "fieldPath": "spec.nodeName" } } }),
        // Sockets named per pod, so an old and a new plugin pod serve side by side (kubelet 1.33+).
        json!({ "name": "POD_UID", "valueFrom": { "fieldRef": { "fieldPath": "metadata.uid" } } }),
        json!({ "name": "DRIVER_NAME", "value": driver }),
        json!({ "name": "FEATURE_GATES", "value": t.feature_gates() }),
        json!({ "name": "DEVICE_BACKEND", "value": "nvml" }),
        json!({ "name": "NVIDIA_DRIVER_ROOT", "value": CONTAINER_DRIVER_ROOT }),
        json!({ "name": "REGISTRAR_DIR", "value": paths.registrar_dir }),
        json!({ "name": "PLUGIN_DIR", "value": paths.plugin_dir }),
        json!({ "name": "CDI_ROOT", "value": CDI_ROOT }),
        json!({ "name": "METRICS_PORT", "value": metrics_port.to_string() }),
        json!({ "name": "HEALTHCHECK_PORT", "value": health_port.to_string() }),
    ];
    // The compute-domain container has no MIG to shape.
    if driver == GPU_DRIVER && t.spec.dra_driver.gpus.on_demand_mig().is_some() {
        env.push(json!({ "name": "ON_DEMAND_MIG", "value": "true" }));
    }
    env.extend(t.log_env_entries());
    env
}

fn container(
    t: &Target<'_>,
    name: &str,
    driver: &str,
    spec: &KubeletPluginSpec,
    metrics_port: i32,
    plugin_volume: &str,
) -> Value {
    let paths = PluginPaths::new(t, driver);
    let default_health_port = if driver == GPU_DRIVER {
        KubeletPluginSpec::GPUS_HEALTH_PORT
    } else {
        KubeletPluginSpec::COMPUTE_DOMAINS_HEALTH_PORT
    };
    // 0 turns the plugin's health server off, matching a probe-less container.
    let health_port = spec.health_port(default_health_port).unwrap_or(0);
    let mut c = json!({
        "name": name,
        "image": t.image(),
        "imagePullPolicy": t.pull_policy(),
        "command": ["dra-plugin"],
        "args": ["run"],
        "env": container_env(base_env(t, driver, &paths, health_port, metrics_port), &spec.env),
        "ports": [{ "name": if metrics_port == METRICS_PORT { "metrics" } else { "cd-metrics" }, "containerPort": metrics_port }],
        "securityContext": { "privileged": true },
        "volumeMounts": [
            { "name": "plugins-registry", "mountPath": paths.registrar_dir },
            { "name": plugin_volume, "mountPath": paths.plugin_dir },
            { "name": "cdi", "mountPath": CDI_ROOT },
            { "name": "driver-root", "mountPath": CONTAINER_DRIVER_ROOT, "readOnly": true, "mountPropagation": "HostToContainer" },
        ],
    });
    if let Some(r) = &spec.resources {
        c["resources"] = json!(r);
    }
    if let Some(p) = liveness(spec, default_health_port) {
        c["livenessProbe"] = p;
    }
    c
}

/// Metrics port of the compute-domain driver's container (`dra-plugin run` with
/// `DRIVER_NAME=compute-domain.nvidia.com`), next to the GPU container's in the same pod.
pub const CD_METRICS_PORT: i32 = 8081;

/// The DaemonSet with the `gpus` container (driver `gpu.nvidia.com`) and, with
/// `computeDomains.enabled`, the `compute-domains` container (driver `compute-domain.nvidia.com`).
pub fn plugin_daemonset(t: &Target<'_>) -> Result<DaemonSet> {
    let ds = &t.spec.daemonsets;
    let paths = PluginPaths::new(t, GPU_DRIVER);
    let mut containers = vec![container(
        t,
        "gpus",
        GPU_DRIVER,
        &t.spec.dra_driver.gpus.kubelet_plugin,
        METRICS_PORT,
        "plugin-dir",
    )];
    let cd_paths = PluginPaths::new(t, COMPUTE_DOMAIN_DRIVER);
    let cd = &t.spec.dra_driver.compute_domains;
    let mut volumes = vec![
        json!({ "name": "plugins-registry", "hostPath": { "path": paths.registrar_dir, "type": "DirectoryOrCreate" } }),
        json!({ "name": "plugin-dir", "hostPath": { "path": paths.plugin_dir, "type": "DirectoryOrCreate" } }),
        json!({ "name": "cdi", "hostPath": { "path": CDI_ROOT, "type": "DirectoryOrCreate" } }),
        json!({ "name": "driver-root", "hostPath": { "path": t.spec.host_paths.driver_root(), "type": "Directory" } }),
    ];
    if cd.enabled {
        containers.push(container(
            t,
            "compute-domains",
            COMPUTE_DOMAIN_DRIVER,
            &cd.kubelet_plugin,
            CD_METRICS_PORT,
            "cd-plugin-dir",
        ));
        volumes.push(json!({ "name": "cd-plugin-dir", "hostPath": { "path": cd_paths.plugin_dir, "type": "DirectoryOrCreate" } }));
    }
    let selector = json!({ "app.kubernetes.io/name": PLUGIN });
    let mut pod_meta = json!({ "labels": t.labels(PLUGIN, true) });
    if !ds.annotations.is_empty() {
        pod_meta["annotations"] = json!(ds.annotations);
    }
    let strategy = update_strategy(ds, t.spec.dra_driver.gpus.on_demand_mig().is_some());
    let mut meta = t.metadata(PLUGIN, Some(t.namespace), PLUGIN);
    meta["labels"] = json!(t.labels(PLUGIN, true));
    if !ds.annotations.is_empty() {
        meta["annotations"] = json!(ds.annotations);
    }
    typed(json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta,
        "spec": {
            "selector": { "matchLabels": selector },
            "updateStrategy": strategy,
            "template": {
                "metadata": pod_meta,
                "spec": {
                    "serviceAccountName": PLUGIN,
                    "priorityClassName": ds.priority_class_name.as_deref().unwrap_or("system-node-critical"),
                    "nodeSelector": { DRA_DRIVER_LABEL: "true" },
                    "tolerations": ds.tolerations,
                    "securityContext": ds.pod_security_context,
                    "imagePullSecrets": t.pull_secrets(),
                    "containers": containers,
                    "volumes": volumes,
                },
            },
        },
    }))
}

/// The DaemonSet's update strategy. By default the new pod starts beside the old one (surge) and
/// the kubelet switches to it; with on-demand MIG two pods would both reconcile the node's
/// MigLayout, so the old pod goes first. A `maxUnavailable` the user sets keeps the old rule.
fn update_strategy(ds: &crate::controller::crd::DaemonsetsSpec, on_demand_mig: bool) -> Value {
    if ds.update_strategy == Some(crate::controller::crd::UpdateStrategy::OnDelete) {
        return json!({ "type": "OnDelete" });
    }
    let max = ds
        .rolling_update
        .as_ref()
        .and_then(|r| r.max_unavailable.clone());
    let rolling = match max {
        Some(m) => json!({ "maxUnavailable": m.parse::<i32>().map_or(json!(m), |n| json!(n)) }),
        None if on_demand_mig => json!({ "maxUnavailable": 1 }),
        None => json!({ "maxSurge": 1, "maxUnavailable": 0 }),
    };
    json!({ "type": "RollingUpdate", "rollingUpdate": rolling })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::crd::{DaemonsetsSpec, RollingUpdateSpec, UpdateStrategy};

    #[test]
    fn plugin_pods_surge_unless_on_demand_mig_or_the_user_says_otherwise() {
        let mut ds = DaemonsetsSpec::default();
        let rolling = |v: Value| v["rollingUpdate"].clone();
        assert_eq!(
            rolling(update_strategy(&ds, false)),
            json!({ "maxSurge": 1, "maxUnavailable": 0 })
        );
        assert_eq!(
            rolling(update_strategy(&ds, true)),
            json!({ "maxUnavailable": 1 })
        );
        ds.rolling_update = Some(RollingUpdateSpec {
            max_unavailable: Some("10%".into()),
        });
        assert_eq!(
            rolling(update_strategy(&ds, false)),
            json!({ "maxUnavailable": "10%" })
        );
        ds.update_strategy = Some(UpdateStrategy::OnDelete);
        assert_eq!(update_strategy(&ds, false), json!({ "type": "OnDelete" }));
    }
}
