//! Claim constraints (`matchAttribute`, `distinctAttribute`): built from the claim, then devices
//! added and removed as the search moves.
use super::types::{claim_devices, claim_name};
use k8s_openapi::api::resource::v1::{DeviceAttribute, ResourceClaim};
use std::collections::HashSet;

pub(crate) enum Constraint<'a> {
    Match {
        requests: HashSet<&'a str>,
        attr: &'a str,
        value: Option<&'a DeviceAttribute>,
        n: usize,
    },
    Distinct {
        requests: HashSet<&'a str>,
        attr: &'a str,
        values: Vec<&'a DeviceAttribute>,
    },
}

/// The claim's constraints, in order, none of them holding a device yet.
pub(super) fn claim_constraints(claim: &ResourceClaim) -> Result<Vec<Constraint<'_>>, String> {
    let mut cons = Vec::new();
    for (i, c) in claim_devices(claim)
        .and_then(|d| d.constraints.as_deref())
        .unwrap_or(&[])
        .iter()
        .enumerate()
    {
        let requests: HashSet<&str> = c.requests.iter().flatten().map(|s| s.as_str()).collect();
        if let Some(m) = &c.match_attribute {
            cons.push(Constraint::Match {
                requests,
                attr: m,
                value: None,
                n: 0,
            });
        } else if let Some(d) = &c.distinct_attribute {
            cons.push(Constraint::Distinct {
                requests,
                attr: d,
                values: Vec::new(),
            });
        } else {
            return Err(format!(
                "claim {}, constraint #{i}: empty constraint (unsupported constraint type?)",
                claim_name(claim)
            ));
        }
    }
    Ok(cons)
}

fn applies(requests: &HashSet<&str>, base: &str, sub: Option<&str>) -> bool {
    if requests.is_empty() {
        return true;
    }
    match sub {
        None => requests.contains(base),
        Some(s) => requests.contains(base) || requests.contains(format!("{base}/{s}").as_str()),
    }
}

fn lookup_attr<'d>(
    dev: &'d k8s_openapi::api::resource::v1::Device,
    driver: &str,
    name: &str,
) -> Option<&'d DeviceAttribute> {
    let attrs = dev.attributes.as_ref()?;
    if let Some(a) = attrs.get(name) {
        return Some(a);
    }
    let i = name.find('/')?;
    if &name[..i] != driver {
        return None;
    }
    attrs.get(&name[i + 1..])
}

fn same_attr(a: &DeviceAttribute, b: &DeviceAttribute) -> Option<bool> {
    if let Some(x) = &a.string {
        return Some(b.string.as_ref() == Some(x));
    }
    if let Some(x) = a.int {
        return Some(b.int == Some(x));
    }
    if let Some(x) = a.bool {
        return Some(b.bool == Some(x));
    }
    if let Some(x) = &a.version {
        return Some(b.version.as_ref() == Some(x));
    }
    None
}

pub(super) fn constraint_add<'a>(
    c: &mut Constraint<'a>,
    base: &str,
    sub: Option<&str>,
    dev: &'a k8s_openapi::api::resource::v1::Device,
    driver: &str,
) -> bool {
    match c {
        Constraint::Match {
            requests,
            attr,
            value,
            n,
        } => {
            if !requests.is_empty() && !applies(requests, base, sub) {
                return true;
            }
            let Some(a) = lookup_attr(dev, driver, attr) else {
                return false;
            };
            if *n == 0 {
                *value = Some(a);
                *n = 1;
                return true;
            }
            match same_attr(a, value.expect("first value")) {
                Some(true) => {
                    *n += 1;
                    true
                }
                _ => false,
            }
        }
        Constraint::Distinct {
            requests,
            attr,
            values,
        } => {
            if !requests.is_empty() && !applies(requests, base, sub) {
                return true;
            }
            let Some(a) = lookup_attr(dev, driver, attr) else {
                return false;
            };
            for v in values.iter() {
                if same_attr(a, v) == Some(true) {
                    return false;
                }
            }
            values.push(a);
            true
        }
    }
}

pub(super) fn constraint_remove(c: &mut Constraint<'_>, base: &str, sub: Option<&str>) {
    match c {
        Constraint::Match { requests, n, .. } => {
            if !requests.is_empty() && !applies(requests, base, sub) {
                return;
            }
            *n -= 1;
        }
        Constraint::Distinct {
            requests, values, ..
        } => {
            if !requests.is_empty() && !applies(requests, base, sub) {
                return;
            }
            values.pop();
        }
    }
}
