//! How full each pool GPU would be after the planned pods are placed, and what is left: free
//! whole GPUs, free MIG devices by profile, free shares of time-sliced GPUs.
use super::nodes::{Mig, PoolNode};
use crate::workloads::PodOutcome;
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// One physical GPU of a pool node.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuUse {
    pub node: String,
    /// `gpu-<minor>`.
    pub gpu: String,
    /// `whole`, `shares N`, `MIG <layout>`, `dynamic MIG`.
    pub mode: String,
    /// What is taken, in words (`1 of 4 shares`, `2 of 7 MIG devices: 1g.10gb x2`).
    pub used: String,
    /// Taken, in percent: of the shares, of the compute slices, or 0 / 100 for a whole GPU.
    pub percent: u32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<String>,
}

/// What is left free.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Free {
    /// Per node, GPUs with nothing on them that a whole-GPU claim can take.
    pub whole_gpus: BTreeMap<String, u32>,
    /// Per node and profile, unallocated MIG devices of static layouts.
    pub mig_devices: BTreeMap<String, BTreeMap<String, u32>>,
    /// Per `node/gpu`, free shares of partly used time-sliced GPUs.
    pub shares: BTreeMap<String, String>,
}

/// One published device: its GPU, and its MIG profile.
struct Dev {
    name: String,
    minor: String,
    profile: Option<String>,
}

/// The claims (by "namespace/name") and pods on each (node, device).
#[derive(Default)]
struct Taken {
    claims: BTreeMap<(String, String), BTreeSet<String>>,
    pods: BTreeMap<(String, String), BTreeSet<String>>,
}

fn taken(pods: &[PodOutcome]) -> Taken {
    let mut t = Taken::default();
    for p in pods {
        for c in &p.claims {
            let results = c
                .allocation
                .devices
                .iter()
                .flat_map(|d| d.results.iter().flatten());
            for r in results {
                let key = (r.pool.clone(), r.device.clone());
                t.claims
                    .entry(key.clone())
                    .or_default()
                    .insert(c.claim.clone());
                t.pods.entry(key).or_default().insert(p.pod.clone());
            }
        }
    }
    t
}

/// The devices of `node`'s slices.
fn devices(node: &str, slices: &[ResourceSlice]) -> Vec<Dev> {
    let mine = slices
        .iter()
        .filter(|s| s.spec.node_name.as_deref() == Some(node));
    let mut out = Vec::new();
    for d in mine.flat_map(|s| s.spec.devices.iter().flatten()) {
        // `gpu-<minor>` and `gpu-<minor>-mig-...`; VFIO and other devices are not planned for
        let Some(rest) = d.name.strip_prefix("gpu-") else {
            continue;
        };
        let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if minor.is_empty() {
            continue;
        }
        let attr = |k: &str| {
            let a = d.attributes.as_ref()?.get(k)?;
            a.string.clone()
        };
        let profile = (attr("type").as_deref() == Some("mig"))
            .then(|| attr("profile"))
            .flatten();
        out.push(Dev {
            name: d.name.clone(),
            minor,
            profile,
        });
    }
    out
}

/// Every GPU of the pool and what is left free.
pub fn usage(
    pool: &[PoolNode],
    slices: &[ResourceSlice],
    pods: &[PodOutcome],
) -> (Vec<GpuUse>, Free) {
    let t = taken(pods);
    let mut gpus = Vec::new();
    let mut free = Free::default();
    for node in pool.iter().filter(|n| n.gpus > 0) {
        let devs = devices(&node.name, slices);
        let mut minors: Vec<&String> = devs.iter().map(|d| &d.minor).collect();
        minors.sort_by_key(|m| m.parse::<u32>().unwrap_or(u32::MAX));
        minors.dedup();
        for minor in minors {
            let mine: Vec<&Dev> = devs.iter().filter(|d| &d.minor == minor).collect();
            gpus.push(one_gpu(node, minor, &mine, &t, &mut free));
        }
    }
    (gpus, free)
}

fn one_gpu(node: &PoolNode, minor: &str, devs: &[&Dev], t: &Taken, free: &mut Free) -> GpuUse {
    let key = |d: &Dev| (node.name.clone(), d.name.clone());
    let whole_name = format!("gpu-{minor}");
    let whole = devs.iter().find(|d| d.name == whole_name);
    let claims_on = |d: &Dev| t.claims.get(&key(d)).map_or(0, BTreeSet::len);
    let pods: BTreeSet<String> = devs
        .iter()
        .flat_map(|d| t.pods.get(&key(d)).into_iter().flatten().cloned())
        .collect();
    let mig_taken: Vec<&str> = devs
        .iter()
        .filter(|d| claims_on(d) > 0)
        .filter_map(|d| d.profile.as_deref())
        .collect();
    let mut u = GpuUse {
        node: node.name.clone(),
        gpu: whole_name.clone(),
        mode: mode(node),
        used: String::new(),
        percent: 0,
        pods: pods.into_iter().collect(),
    };
    let shares = node.sharing.filter(|_| node.time_sliced()).map(|(_, r)| r);
    if let (Some(d), None) = (whole, shares) {
        let used = claims_on(d) > 0;
        if used {
            u.used = "whole GPU".into();
            u.percent = 100;
        } else if mig_taken.is_empty() {
            u.used = "free".into();
            *free.whole_gpus.entry(node.name.clone()).or_default() += 1;
        }
    }
    if let (Some(d), Some(n)) = (whole, shares) {
        let used = u32::try_from(claims_on(d)).unwrap_or(u32::MAX);
        u.used = format!("{used} of {n} shares");
        u.percent = used * 100 / n.max(1);
        match used {
            0 => *free.whole_gpus.entry(node.name.clone()).or_default() += 1,
            k if k < n => {
                free.shares.insert(
                    format!("{}/{whole_name}", node.name),
                    format!("{} of {n}", n - k),
                );
            }
            _ => {}
        }
    }
    if !mig_taken.is_empty() || (whole.is_none() && devs.iter().any(|d| d.profile.is_some())) {
        mig_use(node, devs, &mig_taken, whole.is_some(), &mut u, free);
    }
    u
}

/// MIG devices: taken of published (static) and compute slices in percent.
fn mig_use(
    node: &PoolNode,
    devs: &[&Dev],
    taken: &[&str],
    dynamic: bool,
    u: &mut GpuUse,
    free: &mut Free,
) {
    let slices_of = |p: &str| {
        node.model
            .and_then(|m| m.profile(p))
            .map_or(0, |p| p.compute_slices)
    };
    let total = node.model.map_or(1, |m| m.compute_slices.max(1));
    let used: u32 = taken.iter().map(|p| slices_of(p)).sum();
    u.percent = used * 100 / total;
    let mut by_profile: BTreeMap<&str, u32> = BTreeMap::new();
    for p in taken {
        *by_profile.entry(p).or_default() += 1;
    }
    let list = by_profile
        .iter()
        .map(|(p, n)| format!("{p} x{n}"))
        .collect::<Vec<_>>()
        .join(", ");
    if dynamic {
        u.used = format!("MIG {list} ({used} of {total} compute slices)");
        return;
    }
    let published = devs.iter().filter(|d| d.profile.is_some()).count();
    u.used = if taken.is_empty() {
        format!("0 of {published} MIG devices")
    } else {
        format!("{} of {published} MIG devices: {list}", taken.len())
    };
    let mut left = BTreeMap::new();
    for d in devs.iter().filter_map(|d| d.profile.as_deref()) {
        *left.entry(d.to_string()).or_insert(0u32) += 1;
    }
    for p in taken {
        if let Some(n) = left.get_mut(*p) {
            *n -= 1;
        }
    }
    let node_free = free.mig_devices.entry(node.name.clone()).or_default();
    for (p, n) in left.into_iter().filter(|(_, n)| *n > 0) {
        *node_free.entry(p).or_default() += n;
    }
}

fn mode(node: &PoolNode) -> String {
    let base = match &node.mig {
        Mig::Off => "whole".to_string(),
        Mig::Static(l) => format!("MIG {l}"),
        Mig::Dynamic => "dynamic MIG".into(),
    };
    match node.sharing {
        Some((s, r)) => format!("{base}, {} x{r}", s.as_str()),
        None => base,
    }
}
