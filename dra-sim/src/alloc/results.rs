//! After the search: the claims' `AllocationResult`s (device results, configuration from class
//! and claim, node selector).
use super::run::Run;
use super::types::{ReqData, ReqKey, claim_devices, class_spec, requests_of};
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult, DeviceRequest,
    DeviceRequestAllocationResult, ResourceClaim,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as KQuantity;
use std::collections::{HashMap, HashSet};

impl<'a> Run<'a> {
    pub(super) fn build_results(&self) -> Vec<AllocationResult> {
        let mut out = Vec::new();
        for (ci, claim) in self.claims.iter().enumerate() {
            let mut results = Vec::new();
            for rdv in &self.results[ci] {
                let id = self.device_id(rdv.dev);
                let request = match rdv.parent {
                    Some(p) => format!("{p}/{}", rdv.req_name),
                    None => rdv.req_name.to_string(),
                };
                let tolerations = self
                    .req_data
                    .iter()
                    .find(|(k, rd)| k.claim == ci && rd.req.full_name() == request)
                    .map(|(_, rd)| rd.req.tolerations.to_vec())
                    .filter(|t| !t.is_empty());
                let dev = self.device(rdv.dev);
                results.push(DeviceRequestAllocationResult {
                    request,
                    driver: id.0,
                    pool: id.1,
                    device: id.2,
                    admin_access: if rdv.admin { Some(true) } else { None },
                    tolerations,
                    share_id: rdv.share_id.clone(),
                    consumed_capacity: rdv.consumed.as_ref().map(|c| {
                        c.iter()
                            .map(|(k, v)| (k.clone(), KQuantity(v.canonical())))
                            .collect()
                    }),
                    binding_conditions: dev.binding_conditions.clone(),
                    binding_failure_conditions: dev.binding_failure_conditions.clone(),
                    skip_node_operations: None,
                });
            }
            let config = self.build_config(ci, claim);
            let node_selector = self.node_selector(ci);
            out.push(AllocationResult {
                allocation_timestamp: None,
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config: if config.is_empty() {
                        None
                    } else {
                        Some(config)
                    },
                }),
                node_selector,
            });
        }
        out
    }

    fn build_config(&self, ci: usize, claim: &ResourceClaim) -> Vec<DeviceAllocationConfiguration> {
        let reqs = requests_of(claim);
        let mut config = self.config_from_classes(ci, reqs.len());
        self.config_from_claim(ci, claim, &mut config);
        self.drop_requests_naming_all(ci, reqs, &mut config);
        config
    }

    /// The request as allocated: the request itself, or its selected subrequest.
    fn selected(&self, ci: usize, ri: usize) -> &ReqData<'a> {
        let k = ReqKey {
            claim: ci,
            request: ri,
            sub: 0,
        };
        let rd = &self.req_data[&k];
        if rd.req.parent.is_some() {
            &self.req_data[&ReqKey {
                sub: rd.selected_sub,
                ..k
            }]
        } else {
            rd
        }
    }

    /// The classes' configuration, once per class, naming every request allocated from it.
    fn config_from_classes(&self, ci: usize, n_reqs: usize) -> Vec<DeviceAllocationConfiguration> {
        let mut config: Vec<DeviceAllocationConfiguration> = Vec::new();
        let mut by_class: HashMap<String, (usize, usize)> = HashMap::new();
        for ri in 0..n_reqs {
            let rd = self.selected(ci, ri);
            let Some(class) = rd.class else { continue };
            let cname = class.metadata.name.clone().unwrap_or_default();
            if let Some((s, e)) = by_class.get(&cname) {
                for c in config.iter_mut().take(*e).skip(*s) {
                    c.requests
                        .get_or_insert_with(Vec::new)
                        .push(rd.req.full_name());
                }
                continue;
            }
            let start = config.len();
            for c in class_spec(class).config.iter().flatten() {
                config.push(DeviceAllocationConfiguration {
                    source: "FromClass".into(),
                    requests: Some(vec![rd.req.full_name()]),
                    opaque: c.opaque.clone(),
                });
            }
            by_class.insert(cname, (start, config.len()));
        }
        config
    }

    /// The claim's own configuration, each entry kept when it names a request of the claim or an
    /// allocated subrequest.
    fn config_from_claim(
        &self,
        ci: usize,
        claim: &ResourceClaim,
        config: &mut Vec<DeviceAllocationConfiguration>,
    ) {
        let reqs = requests_of(claim);
        for c in claim_devices(claim)
            .and_then(|d| d.config.as_ref())
            .into_iter()
            .flatten()
        {
            let creqs = c.requests.clone().unwrap_or_default();
            if creqs.is_empty() {
                config.push(DeviceAllocationConfiguration {
                    source: "FromClaim".into(),
                    requests: None,
                    opaque: c.opaque.clone(),
                });
                continue;
            }
            for (ri, req) in reqs.iter().enumerate() {
                if creqs.contains(&req.name) {
                    config.push(DeviceAllocationConfiguration {
                        source: "FromClaim".into(),
                        requests: Some(creqs.clone()),
                        opaque: c.opaque.clone(),
                    });
                    break;
                }
                let rd = self.selected(ci, ri);
                if rd.req.parent.is_none() {
                    continue;
                }
                if creqs.contains(&rd.req.full_name()) {
                    config.push(DeviceAllocationConfiguration {
                        source: "FromClaim".into(),
                        requests: Some(creqs.clone()),
                        opaque: c.opaque.clone(),
                    });
                    break;
                }
            }
        }
    }

    /// An entry that names every request of the claim applies to all of them: its list is dropped.
    fn drop_requests_naming_all(
        &self,
        ci: usize,
        reqs: &[DeviceRequest],
        config: &mut [DeviceAllocationConfiguration],
    ) {
        for c in config.iter_mut() {
            let Some(requests) = &c.requests else {
                continue;
            };
            if requests.is_empty() {
                continue;
            }
            let applies_to_all = reqs.iter().enumerate().all(|(ri, req)| {
                if requests.contains(&req.name) {
                    return true;
                }
                let rd = self.selected(ci, ri);
                rd.req.parent.is_some() && requests.contains(&rd.req.full_name())
            });
            if applies_to_all {
                c.requests = None;
            }
        }
    }

    fn node_selector(&self, ci: usize) -> Option<NodeSelector> {
        let mut term = NodeSelectorTerm::default();
        for rdv in &self.results[ci] {
            let pool = &self.pools[rdv.dev.pool];
            let slice = &self.a.slices[pool.slices[rdv.dev.slice].0];
            let dev = self.device(rdv.dev);
            let (node_name, ns) = if slice.spec.per_device_node_selection == Some(true) {
                (dev.node_name.as_ref(), dev.node_selector.as_ref())
            } else {
                (
                    slice.spec.node_name.as_ref(),
                    slice.spec.node_selector.as_ref(),
                )
            };
            if node_name.is_some() || dev.binds_to_node == Some(true) {
                return Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_fields: Some(vec![NodeSelectorRequirement {
                            key: "metadata.name".into(),
                            operator: "In".into(),
                            values: Some(vec![self.node.name.clone()]),
                        }]),
                        match_expressions: None,
                    }],
                });
            }
            if let Some(ns) = ns
                && let Some(t) = ns.node_selector_terms.first()
            {
                add_reqs(t.match_fields.as_deref(), &mut term.match_fields);
                add_reqs(t.match_expressions.as_deref(), &mut term.match_expressions);
            }
        }
        if term.match_fields.as_ref().is_some_and(|v| !v.is_empty())
            || term
                .match_expressions
                .as_ref()
                .is_some_and(|v| !v.is_empty())
        {
            return Some(NodeSelector {
                node_selector_terms: vec![term],
            });
        }
        None
    }
}

fn add_reqs(
    from: Option<&[NodeSelectorRequirement]>,
    to: &mut Option<Vec<NodeSelectorRequirement>>,
) {
    for r in from.into_iter().flatten() {
        let to = to.get_or_insert_with(Vec::new);
        let vals: HashSet<&String> = r.values.iter().flatten().collect();
        let exists = to.iter().any(|e| {
            e.key == r.key
                && e.operator == r.operator
                && e.values.iter().flatten().collect::<HashSet<_>>() == vals
        });
        if !exists {
            to.push(r.clone());
        }
    }
}
