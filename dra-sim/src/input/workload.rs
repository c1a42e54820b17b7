//! Workload objects: the pod template each kind carries and how many pods it makes, with the
//! defaults the API server applies (`replicas` 1, `parallelism` 1).
use super::strict::typed;
use crate::Result;
use crate::workloads::{Replicas, Workload};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job, JobSpec};
use k8s_openapi::api::core::v1::{Pod, PodTemplate, PodTemplateSpec, ReplicationController};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The workload kinds, their apiVersion and where their pod template is; for errors and `--help`.
pub const WORKLOAD_KINDS: &[(&str, &str, &str)] = &[
    ("Pod", "v1", "the object itself"),
    ("PodTemplate", "v1", "template (one pod)"),
    (
        "ReplicationController",
        "v1",
        "spec.template (spec.replicas)",
    ),
    ("Deployment", "apps/v1", "spec.template (spec.replicas)"),
    ("ReplicaSet", "apps/v1", "spec.template (spec.replicas)"),
    ("StatefulSet", "apps/v1", "spec.template (spec.replicas)"),
    (
        "DaemonSet",
        "apps/v1",
        "spec.template (one per matching node)",
    ),
    (
        "Job",
        "batch/v1",
        "spec.template (spec.parallelism, at most spec.completions)",
    ),
    (
        "CronJob",
        "batch/v1",
        "spec.jobTemplate.spec.template (one Job's pods)",
    ),
];

/// The apiVersion a workload `kind` is served as, if it is one.
pub fn workload_api_version(kind: &str) -> Option<&'static str> {
    WORKLOAD_KINDS
        .iter()
        .find(|(k, _, _)| *k == kind)
        .map(|(_, v, _)| *v)
}

/// Decodes a workload of `kind` (already checked to be one) strictly.
pub fn parse(kind: &str, json: &serde_json::Value, origin: &str) -> Result<Workload> {
    let (meta, template, replicas) = match kind {
        "Pod" => {
            let pod: Pod = typed(json, origin)?;
            let template = PodTemplateSpec {
                metadata: Some(pod.metadata.clone()),
                spec: pod.spec,
            };
            (pod.metadata, Some(template), Replicas::Count(1))
        }
        "PodTemplate" => {
            let t: PodTemplate = typed(json, origin)?;
            (t.metadata, t.template, Replicas::Count(1))
        }
        "ReplicationController" => {
            let rc: ReplicationController = typed(json, origin)?;
            let spec = rc.spec.unwrap_or_default();
            (rc.metadata, spec.template, count(spec.replicas))
        }
        "Deployment" => {
            let d: Deployment = typed(json, origin)?;
            let spec = d.spec;
            (d.metadata, Some(spec.template), count(spec.replicas))
        }
        "ReplicaSet" => {
            let r: ReplicaSet = typed(json, origin)?;
            let spec = r.spec;
            (r.metadata, spec.template, count(spec.replicas))
        }
        "StatefulSet" => {
            let s: StatefulSet = typed(json, origin)?;
            let spec = s.spec;
            (s.metadata, Some(spec.template), count(spec.replicas))
        }
        "DaemonSet" => {
            let d: DaemonSet = typed(json, origin)?;
            let spec = d.spec;
            (d.metadata, Some(spec.template), Replicas::PerNode)
        }
        "Job" => {
            let j: Job = typed(json, origin)?;
            let spec = j.spec.unwrap_or_default();
            let replicas = job_pods(&spec);
            (j.metadata, Some(spec.template), replicas)
        }
        _ => {
            let c: CronJob = typed(json, origin)?;
            let job = c.spec.job_template.spec;
            let job = job.unwrap_or_default();
            let replicas = job_pods(&job);
            (c.metadata, Some(job.template), replicas)
        }
    };
    Ok(workload(
        kind,
        meta,
        template.unwrap_or_default(),
        replicas,
        origin,
        json,
    ))
}

fn workload(
    kind: &str,
    meta: ObjectMeta,
    template: PodTemplateSpec,
    replicas: Replicas,
    origin: &str,
    source: &serde_json::Value,
) -> Workload {
    // a Pod with only `generateName` gets a name from the API server; a stand-in suffix here
    let name = meta
        .name
        .clone()
        .or_else(|| meta.generate_name.as_ref().map(|g| format!("{g}sim0")))
        .unwrap_or_else(|| "unnamed".into());
    Workload {
        kind: kind.to_string(),
        namespace: meta.namespace.unwrap_or_else(|| "default".into()),
        name,
        origin: origin.to_string(),
        template,
        replicas,
        source: source.clone(),
    }
}

/// `replicas` with the API server's default of 1.
fn count(replicas: Option<i32>) -> Replicas {
    Replicas::Count(usize::try_from(replicas.unwrap_or(1)).unwrap_or(0))
}

/// The pods a Job runs at once: `parallelism` (default 1), never more than `completions`, none
/// while suspended.
fn job_pods(spec: &JobSpec) -> Replicas {
    if spec.suspend == Some(true) {
        return Replicas::Count(0);
    }
    let parallel = spec.parallelism.unwrap_or(1);
    let pods = match spec.completions {
        Some(c) => parallel.min(c),
        None => parallel,
    };
    Replicas::Count(usize::try_from(pods).unwrap_or(0))
}
