//! Pods scheduled one after another, in input order, each on the first node (by name) where all
//! its claims can be allocated; every allocation stays for the pods after it, and a claim that
//! several pods name is allocated once and binds them all to the nodes it reaches.
use super::claims::{ClaimSource, PodClaim, pod_claims};
use super::extended::extended_resource_claim;
use super::{SimPod, pod_may_run_on};
use crate::alloc::explain::StageCounts;
use crate::alloc::{AllocatedState, Allocator, DeviceCache, SimNode, node_matches};
use crate::input::Objects;
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim, ResourceClaimStatus};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// What one pod gets: its node and its claims' allocations, or why it stays Pending.
#[derive(Serialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct PodOutcome {
    pub pod: String,
    pub owner: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<PodClaimOutcome>,
    /// Why the pod cannot run anywhere, when that does not depend on the node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Per node tried, why the pod does not fit there.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<NodeRefusal>,
}

#[derive(Serialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct PodClaimOutcome {
    /// The pod's name for it (`spec.resourceClaims[].name`; empty for extended resources).
    pub entry: String,
    pub claim: String,
    /// `claim`, `template <name>` or `extended resources`.
    pub source: String,
    /// Allocated for an earlier pod that names the same ResourceClaim.
    pub shared: bool,
    pub allocation: AllocationResult,
}

#[derive(Serialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct NodeRefusal {
    pub node: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unsatisfiable: Vec<StageCounts>,
}

/// The cluster as pods see it while they are scheduled.
struct Cluster<'a> {
    objs: &'a Objects,
    nodes: &'a [SimNode],
    /// per node, the extended resources its own allocatable (a device plugin) has
    advertised: &'a BTreeMap<String, BTreeSet<String>>,
    cache: Arc<DeviceCache>,
    /// allocated claims by "namespace/name"
    allocated: BTreeMap<String, ResourceClaim>,
    state: AllocatedState,
}

/// Schedules `pods` in order over `nodes`; `allocated` are claims allocated before any of them.
pub fn schedule_pods(
    objs: &Objects,
    pods: &[SimPod],
    nodes: &[SimNode],
    advertised: &BTreeMap<String, BTreeSet<String>>,
    allocated: &[ResourceClaim],
) -> Vec<PodOutcome> {
    let mut cluster = Cluster {
        objs,
        nodes,
        advertised,
        cache: Arc::new(DeviceCache::new(&objs.slices)),
        allocated: allocated.iter().map(|c| (key(c), c.clone())).collect(),
        state: AllocatedState::default(),
    };
    // claims of the input that already carry an allocation count as allocated
    for c in objs.claims.iter().filter(|c| allocation(c).is_some()) {
        cluster.allocated.insert(key(c), c.clone());
    }
    cluster.refresh_state();
    pods.iter().map(|pod| cluster.schedule(pod)).collect()
}

fn key(c: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        c.metadata.namespace.as_deref().unwrap_or("default"),
        c.metadata.name.as_deref().unwrap_or_default()
    )
}

fn allocation(c: &ResourceClaim) -> Option<&AllocationResult> {
    c.status.as_ref().and_then(|s| s.allocation.as_ref())
}

fn source_text(s: &ClaimSource) -> String {
    match s {
        ClaimSource::Claim => "claim".into(),
        ClaimSource::Template(t) => format!("template {t}"),
        ClaimSource::ExtendedResources => "extended resources".into(),
    }
}

impl Cluster<'_> {
    fn refresh_state(&mut self) {
        self.state = AllocatedState::from_claims(self.allocated.values());
    }

    fn schedule(&mut self, pod: &SimPod) -> PodOutcome {
        let mut outcome = PodOutcome {
            pod: pod.full_name(),
            owner: pod.owner.clone(),
            node: None,
            claims: vec![],
            error: None,
            refused: vec![],
        };
        let claims = match pod_claims(pod, self.objs) {
            Ok(c) => c,
            Err(e) => {
                outcome.error = Some(e);
                return outcome;
            }
        };
        for node in self.nodes {
            if !pod_may_run_on(&pod.spec, node) {
                continue;
            }
            match self.try_node(pod, &claims, node) {
                Ok(done) => {
                    outcome.node = Some(node.name.clone());
                    outcome.claims = done;
                    return outcome;
                }
                Err(refusal) => outcome.refused.push(refusal),
            }
        }
        if outcome.refused.is_empty() {
            outcome.error =
                Some("no node matches the pod's nodeName, nodeSelector or node affinity".into());
        }
        outcome
    }

    /// Allocates the pod's pending claims on `node` and records them, or says why not.
    fn try_node(
        &mut self,
        pod: &SimPod,
        claims: &[PodClaim],
        node: &SimNode,
    ) -> Result<Vec<PodClaimOutcome>, NodeRefusal> {
        let refuse = |error: Option<String>, unsatisfiable| NodeRefusal {
            node: node.name.clone(),
            error,
            unsatisfiable,
        };
        let mut all: Vec<PodClaim> = claims.to_vec();
        let advertised = self.advertised.get(&node.name);
        let advertises = |r: &str| advertised.is_some_and(|s| s.contains(r));
        match extended_resource_claim(pod, &self.objs.classes, &advertises) {
            Err(e) => return Err(refuse(Some(e), vec![])),
            Ok(Some(claim)) => all.push(PodClaim {
                entry: String::new(),
                source: ClaimSource::ExtendedResources,
                claim,
            }),
            Ok(None) => {}
        }
        // claims allocated before bind the pod to the nodes their allocation reaches
        for c in &all {
            let Some(done) = self.allocated.get(&key(&c.claim)) else {
                continue;
            };
            let selector = allocation(done).and_then(|a| a.node_selector.as_ref());
            if selector.is_some() && !node_matches(node, "", false, selector).unwrap_or(false) {
                let why = format!("claim {} is allocated on another node", key(&c.claim));
                return Err(refuse(Some(why), vec![]));
            }
        }
        let (pending, results) = self
            .allocate_pending(&all, node)
            .map_err(|(e, why)| refuse(e, why))?;
        Ok(self.record(all, pending, results))
    }

    /// Indices into `all` of the claims not yet allocated, and their allocations on `node`.
    #[allow(clippy::type_complexity)]
    fn allocate_pending(
        &self,
        all: &[PodClaim],
        node: &SimNode,
    ) -> Result<(Vec<usize>, Vec<AllocationResult>), (Option<String>, Vec<StageCounts>)> {
        let pending: Vec<usize> = (0..all.len())
            .filter(|&i| !self.allocated.contains_key(&key(&all[i].claim)))
            .collect();
        if pending.is_empty() {
            return Ok((pending, vec![]));
        }
        let claims: Vec<ResourceClaim> = pending.iter().map(|&i| all[i].claim.clone()).collect();
        let alloc = Allocator::with_cache(
            &self.objs.classes,
            &self.objs.slices,
            self.state.clone(),
            self.cache.clone(),
        );
        match alloc.allocate(node, &claims) {
            Ok(Some(results)) => Ok((pending, results)),
            Ok(None) => Err((None, alloc.explain(node, &claims))),
            Err(e) => Err((Some(e), alloc.explain(node, &claims))),
        }
    }

    fn record(
        &mut self,
        all: Vec<PodClaim>,
        pending: Vec<usize>,
        results: Vec<AllocationResult>,
    ) -> Vec<PodClaimOutcome> {
        let mut fresh: BTreeMap<usize, AllocationResult> =
            pending.into_iter().zip(results).collect();
        let mut out = Vec::new();
        for (i, mut c) in all.into_iter().enumerate() {
            let k = key(&c.claim);
            let (shared, allocation) = match fresh.remove(&i) {
                Some(a) => {
                    c.claim.status = Some(ResourceClaimStatus {
                        allocation: Some(a.clone()),
                        ..Default::default()
                    });
                    self.allocated.insert(k.clone(), c.claim);
                    (false, a)
                }
                None => (
                    true,
                    allocation(&self.allocated[&k]).cloned().unwrap_or_default(),
                ),
            };
            out.push(PodClaimOutcome {
                entry: c.entry,
                claim: k,
                source: source_text(&c.source),
                shared,
                allocation,
            });
        }
        self.refresh_state();
        out
    }
}
