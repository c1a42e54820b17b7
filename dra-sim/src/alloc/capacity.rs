//! Consumable capacity (`consumable_capacity.go`): rounding requests by the request policy and
//! checking the sum of shares against the device's capacity.
use crate::cel::value::quantity::Quantity;
use k8s_openapi::api::resource::v1::{CapacityRequirements, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as KQuantity;
use std::collections::BTreeMap;

fn q(k: &KQuantity) -> Result<Quantity, String> {
    Quantity::parse(&k.0)
}

fn use_milli(r: &k8s_openapi::api::resource::v1::CapacityRequestPolicyRange) -> bool {
    for (i, x) in [Some(&r.min), r.max.as_ref(), r.step.as_ref()]
        .into_iter()
        .enumerate()
    {
        let Some(x) = x else { continue };
        let Ok(v) = q(x) else { return false };
        if Quantity::from_milli(v.milli()).cmp_q(&v) != std::cmp::Ordering::Equal {
            return false;
        }
        if i == 2 && v.milli() < 1 {
            return false;
        }
    }
    true
}

fn consumed_for(req: Option<&KQuantity>, cap: &DeviceCapacity) -> Result<Quantity, String> {
    let Some(req) = req else {
        if let Some(d) = cap.request_policy.as_ref().and_then(|p| p.default.as_ref()) {
            return q(d);
        }
        return q(&cap.value);
    };
    let rq = q(req)?;
    let Some(p) = &cap.request_policy else {
        return Ok(rq);
    };
    if let Some(r) = &p.valid_range {
        let min = q(&r.min)?;
        if rq.cmp_q(&min) == std::cmp::Ordering::Less {
            return Ok(min);
        }
        let Some(step) = &r.step else { return Ok(rq) };
        let step = q(step)?;
        if use_milli(r) {
            let rm = rq.milli();
            let (sm, mm) = (step.milli(), min.milli());
            let added = rm - mm;
            let mut n = added / sm;
            if added % sm != 0 {
                n += 1;
            }
            return Ok(Quantity::from_milli(mm + sm * n).with_format(step.format()));
        }
        let (ri, si, mi) = (rq.value_ceil(), step.value_ceil(), min.value_ceil());
        let added = ri - mi;
        let mut n = added / si;
        if added % si != 0 {
            n += 1;
        }
        return Ok(Quantity::from_milli((mi + si * n) * 1000).with_format(step.format()));
    }
    if let Some(vals) = &p.valid_values {
        for v in vals {
            let v = q(v)?;
            if rq.cmp_q(&v) != std::cmp::Ordering::Greater {
                return Ok(v);
            }
        }
    }
    Ok(rq)
}

fn violates(v: &Quantity, cap: &DeviceCapacity) -> Result<bool, String> {
    let Some(p) = &cap.request_policy else {
        return Ok(false);
    };
    if let Some(d) = &p.default
        && q(d)? == *v
    {
        return Ok(false);
    }
    if let Some(r) = &p.valid_range {
        if let Some(max) = &r.max
            && v.cmp_q(&q(max)?) == std::cmp::Ordering::Greater
        {
            return Ok(true);
        }
        if let Some(step) = &r.step {
            let step = q(step)?;
            let min = q(&r.min)?;
            let (a, s, m) = if use_milli(r) {
                (v.milli(), step.milli(), min.milli())
            } else {
                (v.value_ceil(), step.value_ceil(), min.value_ceil())
            };
            if s != 0 && (a - m) % s != 0 {
                return Ok(true);
            }
        }
        return Ok(false);
    }
    if let Some(vals) = &p.valid_values
        && !vals.is_empty()
    {
        for x in vals {
            if v.cmp_q(&q(x)?) == std::cmp::Ordering::Equal {
                return Ok(false);
            }
        }
        return Ok(true);
    }
    Ok(false)
}

pub fn cmp_request_over_capacity(
    current: &BTreeMap<String, Quantity>,
    request: Option<&CapacityRequirements>,
    caps: Option<&BTreeMap<String, DeviceCapacity>>,
    allocating: Option<&BTreeMap<String, Quantity>>,
) -> Result<bool, String> {
    let empty = BTreeMap::new();
    let caps = caps.unwrap_or(&empty);
    let reqs = request.and_then(|r| r.requests.as_ref());
    if let Some(reqs) = reqs
        && reqs.keys().any(|k| !caps.contains_key(k))
    {
        return Ok(false);
    }
    let mut consumed = BTreeMap::new();
    for (name, cap) in caps {
        let c = consumed_for(reqs.and_then(|r| r.get(name)), cap)
            .map_err(|e| format!("capacity {name:?}: {e}"))?;
        if c.sign() < 0 {
            return Err(format!("capacity {name:?}: capacity value is negative"));
        }
        consumed.insert(name, c);
    }
    for (name, cap) in caps {
        let c = consumed[name];
        if violates(&c, cap)? {
            return Ok(false);
        }
        let mut total = current
            .get(name)
            .copied()
            .unwrap_or(Quantity::ZERO)
            .add(&c)?;
        if let Some(a) = allocating.and_then(|m| m.get(name)) {
            total = total.add(a)?;
        }
        if total.cmp_q(&q(&cap.value)?) == std::cmp::Ordering::Greater {
            return Ok(false);
        }
    }
    Ok(true)
}

pub fn consumed_from_request(
    request: Option<&CapacityRequirements>,
    caps: Option<&BTreeMap<String, DeviceCapacity>>,
) -> Result<BTreeMap<String, Quantity>, String> {
    let reqs = request.and_then(|r| r.requests.as_ref());
    let mut out = BTreeMap::new();
    for (name, cap) in caps.into_iter().flatten() {
        out.insert(
            name.clone(),
            consumed_for(reqs.and_then(|r| r.get(name)), cap)?,
        );
    }
    Ok(out)
}
