//! Never fight another GPUCluster controller. NVIDIA's GPU Operator (v26.7 on) reconciles the same
//! `GPUCluster` (same group, kind, name and finalizer), so before touching the object the
//! controller decides, from what it can see, whether the object is its own. Pure: the reconciler
//! gathers the facts and acts on the decision.
use gpu_dra_api::names::{CONTROLLER_FIELD_MANAGER, GPUCLUSTER_CONTROLLER_ANNOTATION};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::crd::GPUCluster;

/// The operator's Deployment name, and its field manager on the objects it writes: it sets no
/// field owner, so the API server names it after its binary, `gpu-operator`.
pub const GPU_OPERATOR: &str = "gpu-operator";
/// The first operator release with a GPUCluster controller (`v26.7.0`), as (year, month).
pub const FIRST_OPERATOR_WITH_GPUCLUSTER: (u32, u32) = (26, 7);
/// The status condition that says whether this controller stands by, and why.
pub const CONTROLLER_CONFLICT: &str = "ControllerConflict";

/// A Deployment named `gpu-operator`, in any namespace.
#[derive(Clone, Debug, PartialEq)]
pub struct OperatorDeployment {
    pub namespace: String,
    /// The image of its `gpu-operator` container (or its first container).
    pub image: String,
    /// `spec.replicas` (1 when unset).
    pub replicas: i32,
}

/// What the reconciler observed.
#[derive(Debug, Default)]
pub struct Facts<'a> {
    /// The GPUCluster's `gpu.nvidia.com/gpucluster-controller` annotation.
    pub annotation: Option<&'a str>,
    /// Field managers in the GPUCluster's `metadata.managedFields`.
    pub managers: Vec<&'a str>,
    pub deployments: Vec<OperatorDeployment>,
    /// Whether the installed `gpuclusters.nvidia.com` schema has `spec.migrationPool`; `None` when
    /// the CRD could not be read (no RBAC for it), which is no reason to stop.
    pub crd_has_pool: Option<bool>,
}

#[derive(Debug, PartialEq)]
pub enum Decision {
    Reconcile,
    /// Leave the object alone; say so with this reason and message.
    StandBy {
        reason: &'static str,
        message: String,
    },
}

impl<'a> Facts<'a> {
    pub fn new(gc: &'a GPUCluster, deployments: &[Deployment]) -> Self {
        Self {
            annotation: gc
                .annotations()
                .get(GPUCLUSTER_CONTROLLER_ANNOTATION)
                .map(String::as_str),
            managers: gc
                .managed_fields()
                .iter()
                .filter_map(|m| m.manager.as_deref())
                .collect(),
            deployments: deployments.iter().map(operator_deployment).collect(),
            crd_has_pool: None,
        }
    }
}

/// Whether a GPUCluster CRD's served schema has `spec.migrationPool`, i.e. is ours and not the
/// GPU Operator's (under which the API server drops the pool).
pub fn crd_has_pool(crd: &CustomResourceDefinition) -> bool {
    crd.spec.versions.iter().any(|v| {
        v.schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|root| root.properties.as_ref()?.get("spec")?.properties.as_ref())
            .is_some_and(|spec| spec.contains_key("migrationPool"))
    })
}

fn operator_deployment(d: &Deployment) -> OperatorDeployment {
    let containers = d
        .spec
        .template
        .spec
        .as_ref()
        .map_or(&[][..], |p| p.containers.as_slice());
    let image = containers
        .iter()
        .find(|c| c.name == GPU_OPERATOR)
        .or(containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    OperatorDeployment {
        namespace: d.namespace().unwrap_or_default(),
        image,
        replicas: d.spec.replicas.unwrap_or(1),
    }
}

/// An explicit annotation wins; otherwise a running operator Deployment, or the operator's own
/// writes on the object, make this controller stand by.
pub fn decide(f: &Facts<'_>) -> Decision {
    // Not even the annotation overrides this: the pool would silently become every GPU node.
    if f.crd_has_pool == Some(false) {
        return stand_by(
            "ForeignCRD",
            "the installed CRD gpuclusters.nvidia.com has no spec.migrationPool (it is not gpu-dra-driver's; the \
             GPU Operator installs one of that name), so the API server drops the pool and every GPU node would \
             join it; this controller leaves the GPUCluster alone. Apply deploy/crds/crds.yaml (a superset of the \
             operator's) with kubectl apply --server-side --force-conflicts"
                .into(),
        );
    }
    match f.annotation {
        Some(CONTROLLER_FIELD_MANAGER) => return Decision::Reconcile,
        Some(GPU_OPERATOR) => {
            return stand_by(
                "HandedToGPUOperator",
                format!(
                    "annotation {GPUCLUSTER_CONTROLLER_ANNOTATION}={GPU_OPERATOR} hands this GPUCluster to the GPU Operator"
                ),
            );
        }
        Some(other) => {
            return stand_by(
                "UnknownController",
                format!(
                    "annotation {GPUCLUSTER_CONTROLLER_ANNOTATION}={other:?} names no known controller; \
                     use {CONTROLLER_FIELD_MANAGER} or {GPU_OPERATOR}"
                ),
            );
        }
        None => {}
    }
    if let Some(d) = f.deployments.iter().find(|d| runs_gpucluster_controller(d)) {
        return stand_by(
            "GPUOperatorRunning",
            format!(
                "Deployment {}/{GPU_OPERATOR} (image {}) runs the GPU Operator's GPUCluster controller, which reconciles \
                 this same object{}",
                d.namespace,
                d.image,
                how_to_choose()
            ),
        );
    }
    if f.managers.contains(&GPU_OPERATOR) {
        return stand_by(
            "GPUOperatorManaged",
            format!(
                "the GPU Operator (field manager {GPU_OPERATOR}) has written this GPUCluster{}",
                how_to_choose()
            ),
        );
    }
    Decision::Reconcile
}

fn how_to_choose() -> String {
    format!(
        "; this controller leaves it alone. To have {CONTROLLER_FIELD_MANAGER} reconcile it, annotate it \
         {GPUCLUSTER_CONTROLLER_ANNOTATION}={CONTROLLER_FIELD_MANAGER} (see docs/gpu-operator.md for what the \
         operator still does then); to leave it to the operator, annotate it {GPUCLUSTER_CONTROLLER_ANNOTATION}={GPU_OPERATOR}"
    )
}

fn stand_by(reason: &'static str, message: String) -> Decision {
    Decision::StandBy { reason, message }
}

/// Pure: `previous` with our `ControllerConflict=True` condition set, or `None` when it is
/// already there with the same reason and message.
pub fn conditions(
    previous: &[Condition],
    generation: Option<i64>,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Option<Vec<Condition>> {
    let old = previous.iter().find(|c| c.type_ == CONTROLLER_CONFLICT);
    if old.is_some_and(|c| c.status == "True" && c.reason == reason && c.message == message) {
        return None;
    }
    let since = old
        .filter(|c| c.status == "True")
        .map_or(Time(now), |c| c.last_transition_time.clone());
    let mut out: Vec<Condition> = previous
        .iter()
        .filter(|c| c.type_ != CONTROLLER_CONFLICT)
        .cloned()
        .collect();
    out.push(Condition {
        type_: CONTROLLER_CONFLICT.into(),
        status: "True".into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: since,
    });
    Some(out)
}

/// Scaled to zero, or a release older than the GPUCluster controller, is no competitor. A tag
/// that is no `vYY.MM…` version (a digest, `latest`) is assumed to have the controller.
pub fn runs_gpucluster_controller(d: &OperatorDeployment) -> bool {
    d.replicas > 0 && image_version(&d.image).is_none_or(|v| v >= FIRST_OPERATOR_WITH_GPUCLUSTER)
}

/// `(year, month)` of an operator image tag such as `nvcr.io/nvidia/gpu-operator:v26.7.0`.
fn image_version(image: &str) -> Option<(u32, u32)> {
    if image.contains('@') {
        return None;
    }
    let (_, tag) = image.rsplit_once(':')?;
    let mut parts = tag.strip_prefix('v').unwrap_or(tag).split('.');
    let year = parts.next()?.parse().ok()?;
    let month = parts.next()?.split('-').next()?.parse().ok()?;
    Some((year, month))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operator(image: &str, replicas: i32) -> OperatorDeployment {
        OperatorDeployment {
            namespace: "gpu-operator".into(),
            image: image.into(),
            replicas,
        }
    }

    fn reason(d: &Decision) -> &'static str {
        match d {
            Decision::Reconcile => "Reconcile",
            Decision::StandBy { reason, .. } => reason,
        }
    }

    #[test]
    fn facts_come_from_the_object_and_the_deployments() {
        let gc: GPUCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
            "metadata": { "name": "gpu-cluster",
                "annotations": { GPUCLUSTER_CONTROLLER_ANNOTATION: "gpu-operator" },
                "managedFields": [ { "manager": "gpu-operator", "operation": "Update" } ] },
            "spec": { "draDriver": {} },
        }))
        .unwrap();
        let dep: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "gpu-operator", "namespace": "ops" },
            "spec": { "selector": {}, "template": { "spec": { "containers": [
                { "name": "sidecar", "image": "busybox" },
                { "name": "gpu-operator", "image": "nvcr.io/nvidia/gpu-operator:v26.7.0" } ] } } },
        }))
        .unwrap();
        let f = Facts::new(&gc, &[dep]);
        assert_eq!(f.annotation, Some("gpu-operator"));
        assert_eq!(f.managers, ["gpu-operator"]);
        assert_eq!(
            f.deployments,
            [OperatorDeployment {
                namespace: "ops".into(),
                image: "nvcr.io/nvidia/gpu-operator:v26.7.0".into(),
                replicas: 1,
            }]
        );
    }

    #[test]
    fn the_condition_is_added_next_to_others_and_only_rewritten_on_change() {
        let t = |s| Timestamp::from_second(s).unwrap();
        let theirs = Condition {
            type_: "Error".into(),
            status: "True".into(),
            reason: "PrerequisiteNotMet".into(),
            message: "a ClusterPolicy exists".into(),
            observed_generation: None,
            last_transition_time: Time(t(1)),
        };
        let first = conditions(
            std::slice::from_ref(&theirs),
            Some(2),
            "GPUOperatorRunning",
            "m",
            t(10),
        )
        .unwrap();
        assert_eq!(first[0], theirs);
        assert_eq!(
            (first[1].type_.as_str(), first[1].status.as_str()),
            (CONTROLLER_CONFLICT, "True")
        );
        assert_eq!(
            conditions(&first, Some(2), "GPUOperatorRunning", "m", t(20)),
            None
        );
        let changed = conditions(&first, Some(2), "GPUOperatorManaged", "n", t(30)).unwrap();
        assert_eq!(changed.len(), 2);
        assert_eq!(changed[1].reason, "GPUOperatorManaged");
        assert_eq!(
            changed[1].last_transition_time,
            Time(t(10)),
            "still True since 10"
        );
    }

    #[test]
    fn nothing_else_around_means_reconcile() {
        assert_eq!(decide(&Facts::default()), Decision::Reconcile);
        let ours = Facts {
            managers: vec!["gpu-dra-controller", "kubectl-client-side-apply"],
            ..Facts::default()
        };
        assert_eq!(decide(&ours), Decision::Reconcile);
    }

    #[test]
    fn a_running_operator_with_the_controller_means_stand_by_with_what_to_do() {
        let f = Facts {
            deployments: vec![operator("nvcr.io/nvidia/gpu-operator:v26.7.0", 1)],
            ..Facts::default()
        };
        let d = decide(&f);
        assert_eq!(reason(&d), "GPUOperatorRunning");
        let Decision::StandBy { message, .. } = d else {
            unreachable!()
        };
        assert!(message.contains("gpu-operator/gpu-operator"), "{message}");
        assert!(
            message.contains("gpu.nvidia.com/gpucluster-controller=gpu-dra-controller"),
            "{message}"
        );
    }

    #[test]
    fn old_or_stopped_operators_do_not_compete() {
        for d in [
            operator("nvcr.io/nvidia/gpu-operator:v26.3.1", 1),
            operator("nvcr.io/nvidia/gpu-operator:v25.10.0", 1),
            operator("nvcr.io/nvidia/gpu-operator:v26.7.0", 0),
        ] {
            let f = Facts {
                deployments: vec![d.clone()],
                ..Facts::default()
            };
            assert_eq!(decide(&f), Decision::Reconcile, "{d:?}");
        }
    }

    #[test]
    fn unknown_operator_versions_are_assumed_to_have_the_controller() {
        for image in [
            "nvcr.io/nvidia/gpu-operator@sha256:0123",
            "registry.local/gpu-operator:latest",
            "registry.local/gpu-operator",
            "nvcr.io/nvidia/gpu-operator:v27.1.0-rc.1",
        ] {
            assert!(runs_gpucluster_controller(&operator(image, 1)), "{image}");
        }
    }

    #[test]
    fn the_operators_field_manager_on_the_object_means_stand_by() {
        let f = Facts {
            managers: vec!["gpu-dra-controller", GPU_OPERATOR],
            ..Facts::default()
        };
        assert_eq!(reason(&decide(&f)), "GPUOperatorManaged");
    }

    #[test]
    fn a_crd_without_the_pool_stops_even_an_annotated_object() {
        let f = Facts {
            annotation: Some("gpu-dra-controller"),
            crd_has_pool: Some(false),
            ..Facts::default()
        };
        assert_eq!(reason(&decide(&f)), "ForeignCRD");
        let unknown = Facts {
            crd_has_pool: None,
            ..Facts::default()
        };
        assert_eq!(decide(&unknown), Decision::Reconcile);
    }

    #[test]
    fn our_crd_has_the_pool() {
        assert!(crd_has_pool(&crate::controller::crd::gpucluster_crd()));
        let mut foreign = crate::controller::crd::gpucluster_crd();
        for v in &mut foreign.spec.versions {
            let root = v
                .schema
                .as_mut()
                .unwrap()
                .open_api_v3_schema
                .as_mut()
                .unwrap();
            let spec = root.properties.as_mut().unwrap().get_mut("spec").unwrap();
            spec.properties.as_mut().unwrap().remove("migrationPool");
        }
        assert!(!crd_has_pool(&foreign));
    }

    #[test]
    fn the_annotation_decides_over_everything_else() {
        let busy = || Facts {
            managers: vec![GPU_OPERATOR],
            deployments: vec![operator("gpu-operator:v26.7.0", 1)],
            ..Facts::default()
        };
        let ours = Facts {
            annotation: Some("gpu-dra-controller"),
            ..busy()
        };
        assert_eq!(decide(&ours), Decision::Reconcile);
        let theirs = Facts {
            annotation: Some("gpu-operator"),
            ..Facts::default()
        };
        assert_eq!(reason(&decide(&theirs)), "HandedToGPUOperator");
        let typo = Facts {
            annotation: Some("gpu-dra"),
            ..Facts::default()
        };
        assert_eq!(reason(&decide(&typo)), "UnknownController");
    }
}
