//! The claims of one pod: `spec.resourceClaims` entries naming a ResourceClaim (shared by every
//! pod that names it) or a ResourceClaimTemplate (one claim per pod, as the resourceclaim
//! controller creates it).
use super::SimPod;
use crate::input::{Objects, claim_named};
use k8s_openapi::api::resource::v1::ResourceClaim;

/// Where a pod's claim comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimSource {
    /// `resourceClaimName`: the ResourceClaim itself, shared with other pods naming it.
    Claim,
    /// `resourceClaimTemplateName`: a claim of this pod's own, made from the template.
    Template(String),
    /// The scheduler's claim for extended resources backed by DeviceClasses (KEP-5004).
    ExtendedResources,
}

/// One claim of a pod: the pod's entry name (`spec.resourceClaims[].name`) and the claim.
#[derive(Clone, Debug)]
pub struct PodClaim {
    pub entry: String,
    pub source: ClaimSource,
    pub claim: ResourceClaim,
}

/// The claims `pod` names, or why it cannot have them (the pod would stay Pending).
pub fn pod_claims(pod: &SimPod, objs: &Objects) -> Result<Vec<PodClaim>, String> {
    let entries = pod.spec.resource_claims.as_deref().unwrap_or(&[]);
    check_container_references(pod)?;
    let mut out = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let field = format!("spec.resourceClaims[{i}]");
        let claim = match (
            entry.resource_claim_name.as_deref(),
            entry.resource_claim_template_name.as_deref(),
        ) {
            (Some(name), None) => PodClaim {
                entry: entry.name.clone(),
                source: ClaimSource::Claim,
                claim: find_claim(objs, &pod.namespace, name).ok_or_else(|| {
                    format!(
                        "{field}: ResourceClaim {}/{name} is not in the input",
                        pod.namespace
                    )
                })?,
            },
            (None, Some(template)) => {
                let t = objs
                    .templates
                    .iter()
                    .find(|t| {
                        t.metadata.name.as_deref() == Some(template)
                            && t.metadata.namespace.as_deref() == Some(pod.namespace.as_str())
                    })
                    .ok_or_else(|| {
                        format!(
                            "{field}: ResourceClaimTemplate {}/{template} is not in the input",
                            pod.namespace
                        )
                    })?;
                // the controller's generateName `<pod>-<entry>-`, without the random suffix
                let name = format!("{}-{}", pod.name, entry.name);
                PodClaim {
                    entry: entry.name.clone(),
                    source: ClaimSource::Template(template.to_string()),
                    claim: claim_named(t, name, &pod.namespace),
                }
            }
            _ => {
                return Err(format!(
                    "{field}: exactly one of resourceClaimName and resourceClaimTemplateName is required"
                ));
            }
        };
        out.push(claim);
    }
    Ok(out)
}

fn find_claim(objs: &Objects, namespace: &str, name: &str) -> Option<ResourceClaim> {
    objs.claims
        .iter()
        .find(|c| {
            c.metadata.name.as_deref() == Some(name)
                && c.metadata.namespace.as_deref() == Some(namespace)
        })
        .cloned()
}

/// The API server refuses a pod whose container names a claim the pod does not list.
fn check_container_references(pod: &SimPod) -> Result<(), String> {
    let entries: Vec<&str> = pod
        .spec
        .resource_claims
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    let init = pod.spec.init_containers.iter().flatten();
    for (list, c) in init
        .map(|c| ("initContainers", c))
        .chain(pod.spec.containers.iter().map(|c| ("containers", c)))
    {
        let claims = c.resources.as_ref().and_then(|r| r.claims.as_ref());
        for claim in claims.into_iter().flatten() {
            if !entries.contains(&claim.name.as_str()) {
                return Err(format!(
                    "spec.{list}[{}].resources.claims: {:?} is not one of spec.resourceClaims",
                    c.name, claim.name
                ));
            }
        }
    }
    Ok(())
}
