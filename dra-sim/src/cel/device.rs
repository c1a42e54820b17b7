//! The `device` variable: a ResourceSlice device as selectors see it, read in place
//! ([`RawDevice`]), the conversion checks the whole value would raise ([`device_check`]), one
//! attribute or capacity read straight from the device (`raw_field`), and the whole value
//! ([`device_value`]) for other uses of `device`.
use super::value::{DeviceVal, MapVal, Value, quantity, semver};
use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A ResourceSlice device as selectors see it, read in place.
#[derive(Clone, Copy, Debug)]
pub struct RawDevice<'a> {
    pub driver: &'a str,
    pub attributes: Option<&'a BTreeMap<String, DeviceAttribute>>,
    pub capacity: Option<&'a BTreeMap<String, DeviceCapacity>>,
    pub allow_multiple_allocations: bool,
}

impl<'a> RawDevice<'a> {
    /// Device `d` of a slice of `driver`.
    pub fn of(driver: &'a str, d: &'a k8s_openapi::api::resource::v1::Device) -> Self {
        RawDevice {
            driver,
            attributes: d.attributes.as_ref(),
            capacity: d.capacity.as_ref(),
            allow_multiple_allocations: d.allow_multiple_allocations.unwrap_or(false),
        }
    }
}

/// The error [`device_value`] would give for this device, without building anything.
pub fn device_check(d: &RawDevice<'_>) -> Result<(), String> {
    for (name, a) in d.attributes.into_iter().flatten() {
        if a.int.is_none() && a.bool.is_none() && a.string.is_none() {
            if a.version.as_deref().is_some_and(semver::is_plain) {
                continue;
            }
            attribute_value(name, a)?;
        }
    }
    for (name, c) in d.capacity.into_iter().flatten() {
        capacity_value(name, c)?;
    }
    Ok(())
}

/// One attribute or capacity of a device as the whole `device` value would hold it under
/// `domain`/`id`: when a qualified and an unqualified name land on the same key, the first
/// in name order, as in [`device_value`].
pub(crate) fn raw_field(
    d: &RawDevice<'_>,
    capacity: bool,
    domain: &str,
    id: &str,
) -> Result<Option<Value>, String> {
    fn find<'m, V>(
        map: Option<&'m BTreeMap<String, V>>,
        driver: &str,
        domain: &str,
        id: &str,
    ) -> Option<(&'m String, &'m V)> {
        let map = map?;
        // The only names that can land on (domain, id): `id` itself, and the names that start
        // with `domain` (they sort together, right after it). `split_qualified` decides, as
        // for the whole value; the first in name order wins.
        let same_domain = map
            .range::<str, _>((
                std::ops::Bound::Excluded(domain),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(k, _)| k.starts_with(domain));
        map.get_key_value(id)
            .into_iter()
            .chain(same_domain)
            .filter(|(k, _)| split_qualified(k, driver) == (domain, id))
            .min_by_key(|(k, _)| *k)
    }
    if capacity {
        find(d.capacity, d.driver, domain, id)
            .map(|(name, c)| capacity_value(name, c))
            .transpose()
    } else {
        find(d.attributes, d.driver, domain, id)
            .map(|(name, a)| attribute_value(name, a))
            .transpose()
    }
}

fn attribute_value(name: &str, a: &DeviceAttribute) -> Result<Value, String> {
    Ok(if let Some(i) = a.int {
        Value::Int(i)
    } else if let Some(b) = a.bool {
        Value::Bool(b)
    } else if let Some(s) = &a.string {
        Value::str(s)
    } else if let Some(v) = &a.version {
        Value::Semver(Arc::new(semver::Semver::parse(v).map_err(|e| {
            format!("attribute {name}: parse semantic version: {e}")
        })?))
    } else {
        return Err(format!("attribute {name}: unsupported attribute value"));
    })
}

fn capacity_value(name: &str, c: &DeviceCapacity) -> Result<Value, String> {
    quantity::Quantity::parse(&c.value.0)
        .map(Value::Quantity)
        .map_err(|e| format!("capacity {name}: {e}"))
}

fn split_qualified<'a>(name: &'a str, driver: &'a str) -> (&'a str, &'a str) {
    match name.find('/') {
        Some(i) => (&name[..i], &name[i + 1..]),
        None => (driver, name),
    }
}

/// Builds the `device` variable: unqualified names under the driver's domain, versions as semver.
pub fn device_value(
    driver: &str,
    attributes: Option<&BTreeMap<String, DeviceAttribute>>,
    capacity: Option<&BTreeMap<String, DeviceCapacity>>,
    allow_multiple_allocations: bool,
) -> Result<Value, String> {
    let mut attrs: Vec<(String, MapVal)> = Vec::new();
    fn domain_entry<'m>(v: &'m mut Vec<(String, MapVal)>, d: &str) -> &'m mut MapVal {
        if let Some(i) = v.iter().position(|(k, _)| k == d) {
            return &mut v[i].1;
        }
        v.push((d.to_string(), MapVal::native(Vec::new())));
        &mut v.last_mut().expect("pushed").1
    }
    for (name, a) in attributes.into_iter().flatten() {
        let (dom, id) = split_qualified(name, driver);
        let val = attribute_value(name, a)?;
        domain_entry(&mut attrs, dom)
            .entries
            .push((Value::str(id), val));
    }
    let mut caps: Vec<(String, MapVal)> = Vec::new();
    for (name, c) in capacity.into_iter().flatten() {
        let (dom, id) = split_qualified(name, driver);
        let q = capacity_value(name, c)?;
        domain_entry(&mut caps, dom)
            .entries
            .push((Value::str(id), q));
    }
    let outer = |v: Vec<(String, MapVal)>| {
        Value::Map(Arc::new(MapVal {
            entries: v
                .into_iter()
                .map(|(k, m)| (Value::str(&k), Value::Map(Arc::new(m))))
                .collect(),
            default_empty: true,
            native: true,
        }))
    };
    Ok(Value::Device(Arc::new(DeviceVal {
        driver: Value::str(driver),
        attributes: outer(attrs),
        capacity: outer(caps),
        allow_multiple_allocations,
    })))
}
