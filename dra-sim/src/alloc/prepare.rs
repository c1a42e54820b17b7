//! Before the search: every request and subrequest normalized and validated (class, selectors,
//! count mode, the devices of an `All` request), and each claim's constraints built.
use super::constraints::claim_constraints;
use super::run::Run;
use super::types::{
    ALLOCATION_RESULTS_MAX_SIZE, DevRef, Req, ReqData, ReqKey, claim_name, requests_of,
};
use k8s_openapi::api::resource::v1::{DeviceRequest, ResourceClaim};

impl<'a> Run<'a> {
    pub(super) fn prepare(&mut self) -> Result<(), String> {
        let mut min_total = 0;
        for (ci, claim) in self.claims.iter().enumerate() {
            let mut min_per_claim = 0usize;
            for (ri, request) in requests_of(claim).iter().enumerate() {
                let min_per_request = self.prepare_request(ci, ri, claim, request)?;
                if min_per_request
                    > ALLOCATION_RESULTS_MAX_SIZE - min_per_claim.min(ALLOCATION_RESULTS_MAX_SIZE)
                {
                    return Err(format!(
                        "claim {}, request {}: adding {} devices exceeds the claim limit of {}, with {} already accounted for",
                        claim_name(claim),
                        request.name,
                        min_per_request,
                        ALLOCATION_RESULTS_MAX_SIZE,
                        min_per_claim
                    ));
                }
                min_per_claim += min_per_request;
            }
            self.constraints.push(claim_constraints(claim)?);
            min_total += min_per_claim;
        }
        let _ = min_total;
        Ok(())
    }

    /// Normalizes and validates a request, or each of its `firstAvailable` subrequests, and
    /// returns the fewest devices it can take.
    fn prepare_request(
        &mut self,
        ci: usize,
        ri: usize,
        claim: &ResourceClaim,
        request: &'a DeviceRequest,
    ) -> Result<usize, String> {
        let subs = request.first_available.as_deref().unwrap_or(&[]);
        let min_per_request;
        if !subs.is_empty() {
            let mut m = usize::MAX;
            for (si, sub) in subs.iter().enumerate() {
                let req = Req {
                    name: &sub.name,
                    parent: Some(&request.name),
                    class_name: &sub.device_class_name,
                    selectors: sub.selectors.as_deref().unwrap_or(&[]),
                    mode: sub.allocation_mode.as_deref().unwrap_or("ExactCount"),
                    all: sub.allocation_mode.as_deref() == Some("All"),
                    count: sub.count.unwrap_or(1),
                    admin_access: false,
                    tolerations: sub.tolerations.as_deref().unwrap_or(&[]),
                    capacity: sub.capacity.as_ref(),
                };
                let key = ReqKey {
                    claim: ci,
                    request: ri,
                    sub: si,
                };
                let rd = self.validate_request(req, key)?;
                m = m.min(rd.num_devices);
                self.req_data.insert(key, rd);
            }
            min_per_request = m;
        } else {
            let Some(ex) = request.exactly.as_ref() else {
                return Err(format!(
                    "claim {}, request {}: missing device class name (unsupported request type?)",
                    claim_name(claim),
                    request.name
                ));
            };
            let req = Req {
                name: &request.name,
                parent: None,
                class_name: &ex.device_class_name,
                selectors: ex.selectors.as_deref().unwrap_or(&[]),
                mode: ex.allocation_mode.as_deref().unwrap_or("ExactCount"),
                all: ex.allocation_mode.as_deref() == Some("All"),
                count: ex.count.unwrap_or(1),
                admin_access: ex.admin_access.unwrap_or(false),
                tolerations: ex.tolerations.as_deref().unwrap_or(&[]),
                capacity: ex.capacity.as_ref(),
            };
            let key = ReqKey {
                claim: ci,
                request: ri,
                sub: 0,
            };
            let rd = self.validate_request(req, key)?;
            min_per_request = rd.num_devices;
            self.req_data.insert(key, rd);
        }
        Ok(min_per_request)
    }

    fn validate_request(&mut self, req: Req<'a>, key: ReqKey) -> Result<ReqData<'a>, String> {
        let claim = &self.claims[key.claim];
        for (i, s) in req.selectors.iter().enumerate() {
            if s.cel.is_none() {
                return Err(format!(
                    "claim {}, request {}, selector #{i}: CEL expression empty (unsupported selector type?)",
                    claim_name(claim),
                    req.name
                ));
            }
        }
        if req.class_name.is_empty() {
            return Err(format!(
                "claim {}, request {}: missing device class name (unsupported request type?)",
                claim_name(claim),
                req.name
            ));
        }
        let class = *self.a.classes.get(req.class_name).ok_or_else(|| {
            format!(
                "claim {}, request {}: could not retrieve device class {}: deviceclass.resource.k8s.io \"{}\" not found",
                claim_name(claim),
                req.name,
                req.class_name,
                req.class_name
            )
        })?;
        let mut rd = ReqData {
            req,
            class: Some(class),
            num_devices: 0,
            all_devices: Vec::new(),
            selected_sub: 0,
        };
        match rd.req.mode {
            "ExactCount" => {
                rd.num_devices = usize::try_from(rd.req.count.max(0)).unwrap_or(usize::MAX);
            }
            "All" => self.collect_all_devices(key, &mut rd)?,
            other => {
                return Err(format!(
                    "claim {}, request {}: unsupported count mode {other}",
                    claim_name(claim),
                    rd.req.name
                ));
            }
        }
        Ok(rd)
    }

    /// The devices an `All` request takes: every selectable device of every pool on the node
    /// that has the capacity asked for; an error when a pool is incomplete or invalid.
    fn collect_all_devices(&mut self, key: ReqKey, rd: &mut ReqData<'a>) -> Result<(), String> {
        let claim = &self.claims[key.claim];
        for pi in 0..self.pools.len() {
            let pid = self.pools[pi].id_string();
            if self.pools[pi].incomplete {
                return Err(format!(
                    "claim {}, request {}: asks for all devices, but resource pool {} is currently being updated",
                    claim_name(claim),
                    rd.req.name,
                    pid
                ));
            }
            if self.pools[pi].invalid.is_some() {
                return Err(format!(
                    "claim {}, request {}: asks for all devices, but resource pool {} is currently invalid",
                    claim_name(claim),
                    rd.req.name,
                    pid
                ));
            }
            for si in 0..self.pools[pi].slices.len() {
                let nd = self.pools[pi].devices(si).len();
                for di in 0..nd {
                    let d = DevRef {
                        pool: pi,
                        slice: si,
                        device: di,
                    };
                    if self.is_selectable(key, rd, d)? {
                        let ok = self.capacity_fits(&rd.req, d, true)?;
                        if !ok {
                            continue;
                        }
                        rd.all_devices.push(d);
                    }
                }
            }
        }
        rd.num_devices = rd.all_devices.len();
        Ok(())
    }
}
