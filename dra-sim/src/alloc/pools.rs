//! Pool gathering (`pools_incubating.go`): node filtering, highest generation, completeness,
//! validity, ordering by (driver, pool) and slices by name.
use super::allocator::Allocator;
use super::types::{Counters, SharedCounters, SimNode};
use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};

pub struct Pool<'a> {
    pub driver: &'a str,
    pub name: &'a str,
    pub incomplete: bool,
    pub invalid: Option<String>,
    /// (global slice index, generation) of the device slices targeting the node, sorted by name.
    pub slices: Vec<(usize, i64)>,
    pub not_targeting: Vec<(usize, i64)>,
    /// Borrowed from the device cache when one slice holds them all (the usual case).
    pub counter_sets: SharedCounters<'a>,
    /// a slice of the pool (for its driver and pool name)
    pub(super) rep: usize,
    pub(super) all: &'a [ResourceSlice],
}

impl<'a> Pool<'a> {
    pub fn devices(&self, si: usize) -> &'a [Device] {
        self.all[self.slices[si].0]
            .spec
            .devices
            .as_deref()
            .unwrap_or(&[])
    }
    pub fn id_string(&self) -> String {
        format!("{}/{}", self.driver, self.name)
    }
}

/// `NodeMatches`: nodeName, allNodes, or a node selector (terms ORed, requirements ANDed).
pub fn node_matches(
    node: &SimNode,
    node_name: &str,
    all_nodes: bool,
    selector: Option<&NodeSelector>,
) -> Result<bool, String> {
    if !node_name.is_empty() {
        return Ok(node.name == node_name);
    }
    if all_nodes {
        return Ok(true);
    }
    let Some(sel) = selector else {
        return Ok(false);
    };
    for term in &sel.node_selector_terms {
        let exprs = term.match_expressions.as_deref().unwrap_or(&[]);
        let fields = term.match_fields.as_deref().unwrap_or(&[]);
        if exprs.is_empty() && fields.is_empty() {
            continue;
        }
        let mut ok = true;
        for r in exprs {
            if !requirement(r, node.labels.get(&r.key).map(|s| s.as_str()))? {
                ok = false;
                break;
            }
        }
        if ok {
            for r in fields {
                if r.key != "metadata.name" {
                    return Err(format!(
                        "failed to parse node selector: not a valid field selector key {:?}",
                        r.key
                    ));
                }
                if !requirement(r, Some(&node.name))? {
                    ok = false;
                    break;
                }
            }
        }
        if ok {
            return Ok(true);
        }
    }
    Ok(false)
}

fn requirement(
    r: &k8s_openapi::api::core::v1::NodeSelectorRequirement,
    v: Option<&str>,
) -> Result<bool, String> {
    let vals = r.values.as_deref().unwrap_or(&[]);
    Ok(match r.operator.as_str() {
        "In" => v.is_some_and(|v| vals.iter().any(|x| x == v)),
        "NotIn" => !v.is_some_and(|v| vals.iter().any(|x| x == v)),
        "Exists" => v.is_some(),
        "DoesNotExist" => v.is_none(),
        "Gt" | "Lt" => {
            let Some(v) = v.and_then(|v| v.parse::<i64>().ok()) else {
                return Ok(false);
            };
            let Some(x) = vals.first().and_then(|x| x.parse::<i64>().ok()) else {
                return Err(format!(
                    "failed to parse node selector: invalid value for {}",
                    r.operator
                ));
            };
            if r.operator == "Gt" { v > x } else { v < x }
        }
        op => {
            return Err(format!(
                "failed to parse node selector: {op:?} is not a valid operator"
            ));
        }
    })
}

pub(super) fn gather_pools<'a>(
    a: &'a Allocator<'a>,
    slices_for_node: &[usize],
    node: &SimNode,
) -> Result<Vec<Pool<'a>>, String> {
    let all = a.slices;
    let (pools, order) = pools_on_node(all, slices_for_node, node)?;
    let mut result = Vec::new();
    let mut with_binding = Vec::new();
    for id in order {
        let sl = &pools[&id];
        let Some(pool) = complete_pool(a, id, sl) else {
            continue;
        };
        let binding = pool.slices.iter().any(|(si, _)| {
            all[*si]
                .spec
                .devices
                .iter()
                .flatten()
                .any(|d| d.binding_conditions.is_some())
        });
        if binding {
            with_binding.push(pool);
        } else {
            result.push(pool);
        }
    }
    let key = |p: &Pool| (p.driver.to_string(), p.name.to_string());
    result.sort_by_key(key);
    with_binding.sort_by_key(key);
    result.extend(with_binding);
    Ok(result)
}

/// The slices for `node` that select it, grouped by pool (pools in order of first appearance),
/// only those of each pool's highest generation among them.
fn pools_on_node<'a>(
    all: &'a [ResourceSlice],
    slices_for_node: &[usize],
    node: &SimNode,
) -> Result<PoolsOnNode<'a>, String> {
    let mut pools: HashMap<PoolId<'a>, Vec<usize>> = HashMap::new();
    let mut order: Vec<PoolId<'a>> = Vec::new();
    for &i in slices_for_node {
        let s = &all[i];
        let nn = s.spec.node_name.as_deref().unwrap_or("");
        let an = s.spec.all_nodes.unwrap_or(false);
        let relevant = if !nn.is_empty() || an || s.spec.node_selector.is_some() {
            node_matches(node, nn, an, s.spec.node_selector.as_ref()).map_err(|e| {
                format!(
                    "failed to perform node selection for slice {}: {e}",
                    name(s)
                )
            })?
        } else if s.spec.per_device_node_selection == Some(true) {
            let mut m = false;
            for d in s.spec.devices.iter().flatten() {
                if node_matches(
                    node,
                    d.node_name.as_deref().unwrap_or(""),
                    d.all_nodes.unwrap_or(false),
                    d.node_selector.as_ref(),
                )? {
                    m = true;
                    break;
                }
            }
            m
        } else {
            continue;
        };
        if !relevant {
            continue;
        }
        let id = (s.spec.driver.as_str(), s.spec.pool.name.as_str());
        let g = s.spec.pool.generation;
        match pools.get_mut(&id) {
            None => {
                pools.insert(id, vec![i]);
                order.push(id);
            }
            Some(v) => {
                let cur = all[v[0]].spec.pool.generation;
                if g < cur {
                    continue;
                }
                if g > cur {
                    *v = vec![i];
                } else {
                    v.push(i);
                }
            }
        }
    }
    Ok((pools, order))
}

/// The pool `id` from its slices `sl` on the node: complete when they are all of the pool's slices
/// or, with the pool's other slices, make up its count; `None` when a newer generation exists.
fn complete_pool<'a>(a: &'a Allocator<'a>, id: PoolId<'a>, sl: &[usize]) -> Option<Pool<'a>> {
    let all = a.slices;
    let first = &all[sl[0]].spec.pool;
    let pool = if i64::try_from(sl.len()) == Ok(first.resource_slice_count) {
        build_pool(a, id, sl.to_vec(), None)
    } else {
        // obsolete if a newer generation exists anywhere; complete when counting all slices
        let mut obsolete = false;
        let mut all_for_pool = Vec::new();
        for (j, s) in all.iter().enumerate() {
            if s.spec.driver != id.0 || s.spec.pool.name != id.1 {
                continue;
            }
            if s.spec.pool.generation == first.generation {
                all_for_pool.push(j);
            } else if s.spec.pool.generation > first.generation {
                obsolete = true;
                break;
            }
        }
        if obsolete {
            return None;
        }
        if i64::try_from(all_for_pool.len()) != Ok(first.resource_slice_count) {
            Pool {
                driver: id.0,
                name: id.1,
                incomplete: true,
                invalid: None,
                slices: vec![],
                not_targeting: vec![],
                counter_sets: SharedCounters::Owned(BTreeMap::new()),
                rep: sl[0],
                all,
            }
        } else {
            build_pool(a, id, sl.to_vec(), Some(all_for_pool))
        }
    };
    Some(pool)
}

/// (driver, pool name)
type PoolId<'a> = (&'a str, &'a str);

/// The slices of each pool, and the pools in order of first appearance.
type PoolsOnNode<'a> = (HashMap<PoolId<'a>, Vec<usize>>, Vec<PoolId<'a>>);

fn name(s: &ResourceSlice) -> &str {
    s.metadata.name.as_deref().unwrap_or("")
}

fn build_pool<'a>(
    a: &'a Allocator<'a>,
    id: PoolId<'a>,
    mut slices: Vec<usize>,
    all_for_pool: Option<Vec<usize>>,
) -> Pool<'a> {
    let all = a.slices;
    slices.sort_by(|x, y| name(&all[*x]).cmp(name(&all[*y])));
    let has_counters = |i: usize| {
        all[i]
            .spec
            .shared_counters
            .as_ref()
            .is_some_and(|c| !c.is_empty())
    };
    let mut device_slices = Vec::new();
    let mut counter_slices = Vec::new();
    let mut not_targeting = Vec::new();
    for &i in &slices {
        if has_counters(i) {
            counter_slices.push(i);
        } else {
            device_slices.push(i);
        }
    }
    if let Some(afp) = &all_for_pool
        && slices.len() < afp.len()
    {
        let names: HashSet<&str> = slices.iter().map(|i| name(&all[*i])).collect();
        for &j in afp {
            if names.contains(name(&all[j])) {
                continue;
            }
            if has_counters(j) {
                counter_slices.push(j);
            } else {
                not_targeting.push(j);
            }
        }
    }
    let rep = slices[0];
    let mk = |invalid: Option<String>, counter_sets: Cow<'a, Counters>| Pool {
        driver: id.0,
        name: id.1,
        incomplete: false,
        invalid,
        slices: device_slices
            .iter()
            .map(|i| (*i, all[*i].spec.pool.generation))
            .collect(),
        not_targeting: not_targeting
            .iter()
            .map(|i| (*i, all[*i].spec.pool.generation))
            .collect(),
        counter_sets: match counter_sets {
            Cow::Borrowed(c) => SharedCounters::Borrowed(c),
            Cow::Owned(c) => SharedCounters::Owned(c),
        },
        rep,
        all,
    };
    match counter_sets(a, &device_slices, &counter_slices, &not_targeting) {
        Ok(sets) => mk(None, sets),
        Err(why) => mk(Some(why), Cow::Owned(BTreeMap::new())),
    }
}

/// The pool's counter sets, or why the pool is invalid: a device name twice, a counter set name
/// twice, or a device consuming from a counter set or counter that does not exist.
fn counter_sets<'a>(
    a: &'a Allocator<'a>,
    device_slices: &[usize],
    counter_slices: &[usize],
    not_targeting: &[usize],
) -> Result<Cow<'a, Counters>, String> {
    if device_slices.len() == 1 {
        if let Some(n) = a.cache_dup_name(device_slices[0]) {
            return Err(format!("duplicate device name {n}"));
        }
    } else if let Some(n) = a.cache_dup_name_across(device_slices) {
        return Err(format!("duplicate device name {n}"));
    }
    let mut sets: Cow<'a, Counters> = Cow::Owned(BTreeMap::new());
    for &i in counter_slices {
        // set names are unique within a slice (validation); across slices they must differ too
        let parsed = a.cache_counters(i);
        if sets.is_empty() {
            sets = Cow::Borrowed(parsed);
            continue;
        }
        for (name, m) in parsed {
            if sets.contains_key(name) {
                return Err(format!("duplicate counter set name {name}"));
            }
            sets.to_mut().insert(name.clone(), m.clone());
        }
    }
    for &i in device_slices.iter().chain(not_targeting.iter()) {
        for (set_name, counters) in a.cache_counter_refs(i) {
            let Some(set) = sets.get(set_name) else {
                return Err(format!("counter set {set_name} not found"));
            };
            for n in counters {
                if !set.contains_key(n) {
                    return Err(format!("counter {n} not found in counter set {set_name}"));
                }
            }
        }
    }
    Ok(sets)
}
