//! The pool's GPU nodes as the device plugin stack describes them (GPU feature discovery labels
//! and the Node's capacity), turned into the hardware our kubelet plugin would find there and
//! the ResourceSlices it would publish, built by the simulated backend's own code.
use crate::alloc::SimNode;
use crate::{Error, Result};
use gpu_dra_api::profiles::{GpuModel, catalog};
use gpu_dra_api::slices::{ConsumableShares, SimulatedNode};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde::Serialize;
use std::collections::BTreeMap;

pub const PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
pub const COUNT_LABEL: &str = "nvidia.com/gpu.count";
pub const MEMORY_LABEL: &str = "nvidia.com/gpu.memory";
pub const MIG_STRATEGY_LABEL: &str = "nvidia.com/mig.strategy";
pub const MIG_CONFIG_LABEL: &str = "nvidia.com/mig.config";
pub const REPLICAS_LABEL: &str = "nvidia.com/gpu.replicas";
pub const SHARING_LABEL: &str = "nvidia.com/gpu.sharing-strategy";

/// How the GPUs of a node are split into MIG devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mig {
    /// Whole GPUs.
    Off,
    /// A static layout as mig-parted made it (`all-1g.10gb`, `all-balanced`, `1g.10gb,2g.20gb`).
    Static(String),
    /// MIG mode on without instances (`all-enabled`): only dynamic MIG makes devices of it.
    Dynamic,
}

/// `off`, the layout, or `dynamic`: one string in `-o yaml|json`.
impl Serialize for Mig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Mig::Off => s.serialize_str("off"),
            Mig::Static(layout) => s.serialize_str(layout),
            Mig::Dynamic => s.serialize_str("dynamic"),
        }
    }
}

/// `{strategy, replicas}` in `-o yaml|json`.
fn serialize_sharing<S: serde::Serializer>(
    sharing: &Option<(Sharing, u32)>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Shown {
        strategy: Sharing,
        replicas: u32,
    }
    sharing
        .map(|(strategy, replicas)| Shown { strategy, replicas })
        .serialize(s)
}

/// The device plugin's GPU sharing on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Sharing {
    TimeSlicing,
    #[serde(rename = "MPS")]
    Mps,
}

impl Sharing {
    /// The strategy as GpuConfig spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Sharing::TimeSlicing => "TimeSlicing",
            Sharing::Mps => "MPS",
        }
    }
}

/// One pool node: what its labels and capacity say, and what our plugin would publish.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolNode {
    pub name: String,
    #[serde(skip)]
    pub labels: BTreeMap<String, String>,
    /// The catalog model (`None`: not a GPU node).
    #[serde(skip)]
    pub model: Option<&'static GpuModel>,
    pub product: Option<String>,
    pub gpus: u32,
    /// `none`, `single` or `mixed`.
    pub mig_strategy: String,
    pub mig: Mig,
    /// Sharing and its replicas per GPU (`nvidia.com/gpu.replicas` > 1).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_sharing"
    )]
    pub sharing: Option<(Sharing, u32)>,
    /// Things the labels leave open or that map inexactly, said once per node.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

fn bad(node: &str, label: &str, value: &str, why: impl std::fmt::Display) -> Error {
    Error::Invalid(format!(
        "Node {node}: field metadata.labels.{label}: {value:?}: {why}"
    ))
}

impl PoolNode {
    /// Reads `node`'s GPU feature discovery labels and capacity.
    pub fn from_node(node: &Node) -> Result<PoolNode> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let mut n = PoolNode {
            name,
            model: None,
            product: None,
            gpus: 0,
            mig_strategy: "none".into(),
            mig: Mig::Off,
            sharing: None,
            notes: vec![],
            labels,
        };
        let Some(product) = n.labels.get(PRODUCT_LABEL).cloned() else {
            n.notes.push(format!(
                "no {PRODUCT_LABEL} label (not a GPU node to GPU feature discovery): publishes no GPUs"
            ));
            return Ok(n);
        };
        let model = model_of(&n.name, &product)?;
        n.model = Some(model);
        n.product = Some(model.product_name.clone());
        n.read_mig(&product, node)?;
        n.read_sharing()?;
        n.gpus = n.physical_gpus(node)?;
        n.check_memory(model);
        Ok(n)
    }

    fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }

    /// `nvidia.com/mig.strategy` and `nvidia.com/mig.config` (or, without a usable config, the
    /// MIG resources of the Node's capacity).
    fn read_mig(&mut self, product: &str, node: &Node) -> Result<()> {
        let strategy = self.label(MIG_STRATEGY_LABEL).unwrap_or("none").to_string();
        if !matches!(strategy.as_str(), "none" | "single" | "mixed") {
            return Err(bad(
                &self.name,
                MIG_STRATEGY_LABEL,
                &strategy,
                "expected none, single or mixed",
            ));
        }
        self.mig_strategy = strategy;
        let config = self.label(MIG_CONFIG_LABEL).map(str::to_string);
        self.mig = match config.as_deref() {
            None | Some("all-disabled") => self.mig_from_capacity(product, node)?,
            Some("all-enabled") => {
                self.notes.push(
                    "mig.config all-enabled (MIG mode, no instances): planned with DynamicMIG, \
                     which creates the instances per claim"
                        .into(),
                );
                Mig::Dynamic
            }
            Some(layout) if layout == "all-balanced" || layout.starts_with("all-") => {
                Mig::Static(layout.to_string())
            }
            Some(custom) => match self.mig_from_capacity(product, node)? {
                Mig::Off => {
                    return Err(bad(
                        &self.name,
                        MIG_CONFIG_LABEL,
                        custom,
                        "a custom mig-parted config, and the Node's capacity has no \
                         nvidia.com/mig-* resources to tell its layout from",
                    ));
                }
                m => m,
            },
        };
        if self.mig != Mig::Off && self.mig_strategy == "none" {
            self.notes.push(
                "MIG is on but mig.strategy is none: the device plugin served no MIG devices; \
                 our plugin publishes them"
                    .into(),
            );
        }
        Ok(())
    }

    /// Without a named layout: the per-GPU layout the capacity implies (`nvidia.com/mig-<p>: N`
    /// under the mixed strategy; the product label's `-MIG-<p>` under the single strategy).
    fn mig_from_capacity(&self, product: &str, node: &Node) -> Result<Mig> {
        let capacity = node_capacity(node);
        let gpus: u32 = match self.label(COUNT_LABEL).map(str::parse) {
            Some(Ok(n)) if n > 0 => n,
            _ => return Ok(Mig::Off),
        };
        let mut per_gpu = Vec::new();
        if self.mig_strategy == "single" {
            // GFD's product label names the one profile; mig-parted's `all-<p>` is the usual
            return Ok(match product.rsplit_once("-MIG-") {
                Some((_, p)) => Mig::Static(format!("all-{p}")),
                None => Mig::Off,
            });
        } else {
            for (res, n) in &capacity {
                let Some(p) = res.strip_prefix("nvidia.com/mig-") else {
                    continue;
                };
                if n % i64::from(gpus) != 0 {
                    return Err(Error::Invalid(format!(
                        "Node {}: field status.capacity.{res}: {n} does not divide over {gpus} GPUs \
                         ({COUNT_LABEL}); set {MIG_CONFIG_LABEL} to the mig-parted layout",
                        self.name
                    )));
                }
                let each = usize::try_from(n / i64::from(gpus)).unwrap_or(0);
                per_gpu.extend(std::iter::repeat_n(mig_profile_name(p), each));
            }
        }
        if per_gpu.is_empty() {
            return Ok(Mig::Off);
        }
        Ok(Mig::Static(per_gpu.join(",")))
    }

    /// `nvidia.com/gpu.replicas` and `nvidia.com/gpu.sharing-strategy`.
    fn read_sharing(&mut self) -> Result<()> {
        let replicas = match self.label(REPLICAS_LABEL) {
            None => 1,
            Some(v) => v
                .parse::<u32>()
                .ok()
                .filter(|r| *r > 0)
                .ok_or_else(|| bad(&self.name, REPLICAS_LABEL, v, "not a positive integer"))?,
        };
        let strategy = match self.label(SHARING_LABEL) {
            None | Some("none") if replicas > 1 => {
                self.notes.push(format!(
                    "{REPLICAS_LABEL}={replicas} without {SHARING_LABEL}: read as time-slicing"
                ));
                Sharing::TimeSlicing
            }
            None | Some("none") => return Ok(()),
            Some("time-slicing") => Sharing::TimeSlicing,
            Some("mps") => Sharing::Mps,
            Some(other) => {
                return Err(bad(
                    &self.name,
                    SHARING_LABEL,
                    other,
                    "expected time-slicing, mps or none",
                ));
            }
        };
        if replicas > 1 {
            self.sharing = Some((strategy, replicas));
        }
        Ok(())
    }

    /// The physical GPUs: `nvidia.com/gpu.count` (under `single`, MIG devices per GPU divided
    /// out), else the Node's `nvidia.com/gpu` capacity over its replicas.
    fn physical_gpus(&self, node: &Node) -> Result<u32> {
        let replicas = self.sharing.map_or(1, |(_, r)| r);
        let count = match self.label(COUNT_LABEL) {
            Some(v) => v
                .parse::<u32>()
                .map_err(|_| bad(&self.name, COUNT_LABEL, v, "not a whole number"))?,
            None => {
                let cap = node_capacity(node).get("nvidia.com/gpu").copied();
                let cap = cap.ok_or_else(|| {
                    Error::Invalid(format!(
                        "Node {}: no {COUNT_LABEL} label and no nvidia.com/gpu capacity: \
                         cannot tell how many GPUs it has",
                        self.name
                    ))
                })?;
                u32::try_from(cap).unwrap_or(0) / replicas
            }
        };
        if self.mig_strategy != "single" {
            return Ok(count);
        }
        let Mig::Static(layout) = &self.mig else {
            return Ok(count);
        };
        let Some(model) = self.model else {
            return Ok(count);
        };
        let per_gpu = gpu_dra_api::simulated::plan_layout(model, layout)
            .map_err(|e| bad(&self.name, MIG_CONFIG_LABEL, layout, e))?
            .len();
        let per_gpu = u32::try_from(per_gpu).unwrap_or(u32::MAX);
        if per_gpu == 0 || count % per_gpu != 0 {
            return Err(bad(
                &self.name,
                COUNT_LABEL,
                &count.to_string(),
                format!(
                    "under mig.strategy single it counts MIG devices, which is not a multiple \
                     of the {per_gpu} per GPU of {layout}"
                ),
            ));
        }
        Ok(count / per_gpu)
    }

    /// GFD's memory label against the catalog (whole GPUs only: under MIG it is a slice's).
    fn check_memory(&mut self, model: &GpuModel) {
        let Some(v) = self.label(MEMORY_LABEL) else {
            return;
        };
        let Ok(mib) = v.parse::<u64>() else {
            self.notes.push(format!(
                "{MEMORY_LABEL}={v:?} is not a number of MiB; ignored"
            ));
            return;
        };
        if self.mig == Mig::Off && mib.abs_diff(model.memory_mib) * 50 > model.memory_mib {
            self.notes.push(format!(
                "{MEMORY_LABEL}={mib} MiB, but the catalog's {} has {} MiB; planned with the catalog's",
                model.product_name, model.memory_mib
            ));
        }
    }

    /// The MIG profile every device-plugin `nvidia.com/gpu` was on a `single`-strategy node.
    pub fn single_profile(&self) -> Option<String> {
        let Mig::Static(layout) = &self.mig else {
            return None;
        };
        if self.mig_strategy != "single" {
            return None;
        }
        let model = self.model?;
        let placed = gpu_dra_api::simulated::plan_layout(model, layout).ok()?;
        let first = placed.first()?.0.name.clone();
        placed.iter().all(|(p, _)| p.name == first).then_some(first)
    }

    pub fn time_sliced(&self) -> bool {
        matches!(self.sharing, Some((Sharing::TimeSlicing, _)))
    }

    pub fn mps(&self) -> Option<u32> {
        match self.sharing {
            Some((Sharing::Mps, r)) => Some(r),
            _ => None,
        }
    }

    /// Consumable shares stand in for time-slicing replicas; MPS is served per claim instead
    /// (our plugin refuses MPS on a device allocated as a share).
    pub fn consumable_shares(&self) -> ConsumableShares {
        match self.sharing {
            Some((Sharing::TimeSlicing, r)) => ConsumableShares::Shares(i64::from(r)),
            _ => ConsumableShares::Disabled,
        }
    }

    /// The slices our plugin would publish, from the simulated backend's own builder.
    pub fn slices(&self) -> Result<Vec<ResourceSlice>> {
        let Some(model) = self.model.filter(|_| self.gpus > 0) else {
            return Ok(vec![]);
        };
        let profile = format!("{}:{}", model.key, self.gpus);
        let layout = match &self.mig {
            Mig::Static(l) => Some(l.as_str()),
            _ => None,
        };
        let sim = SimulatedNode {
            name: &self.name,
            profiles: &[profile.as_str()],
            mig_layout: layout,
            dynamic_mig: self.mig == Mig::Dynamic,
            passthrough: false,
            consumable_shares: self.consumable_shares(),
        };
        sim.slices().map_err(|e| match layout {
            Some(l) => bad(&self.name, MIG_CONFIG_LABEL, l, e),
            None => Error::Invalid(format!("Node {}: {e}", self.name)),
        })
    }

    /// The kubelet plugin's settings this node needs for the plan to hold.
    pub fn plugin_settings(&self) -> String {
        let mut gates = Vec::new();
        let mut flags = Vec::new();
        match &self.mig {
            Mig::Dynamic => gates.push("DynamicMIG=true"),
            Mig::Static(l) => flags.push(format!("MIG layout {l} kept (mig-parted)")),
            Mig::Off => {}
        }
        match self.sharing {
            Some((Sharing::TimeSlicing, r)) => {
                gates.push("TimeSlicingSettings=true");
                gates.push("ConsumableShares=true");
                flags.push(format!("--consumable-shares {r}"));
            }
            Some((Sharing::Mps, _)) => gates.push("MPSSupport=true"),
            None => {}
        }
        if !gates.is_empty() {
            flags.insert(0, format!("--feature-gates {}", gates.join(",")));
        }
        if flags.is_empty() {
            "defaults".into()
        } else {
            flags.join(" ")
        }
    }

    pub fn sim_node(&self) -> SimNode {
        let mut labels = self.labels.clone();
        labels
            .entry("kubernetes.io/hostname".into())
            .or_insert_with(|| self.name.clone());
        SimNode {
            name: self.name.clone(),
            labels,
        }
    }
}

/// The catalog model of a `nvidia.com/gpu.product` value such as `NVIDIA-H100-80GB-HBM3`:
/// GFD writes the NVML product name with `-` for spaces, and appends `-SHARED` (sharing without
/// renaming) or `-MIG-<profile>` (MIG strategy single). Catalog keys and aliases work too.
pub fn model_of(node: &str, value: &str) -> Result<&'static GpuModel> {
    let mut base = value.trim();
    base = base.strip_suffix("-SHARED").unwrap_or(base);
    if let Some((b, _)) = base.rsplit_once("-MIG-") {
        base = b;
    }
    let norm = |s: &str| s.replace(' ', "-").to_ascii_lowercase();
    let wanted = norm(base);
    let found = catalog().iter().find(|m| {
        let name = norm(&m.product_name);
        // older GFD releases leave out the `NVIDIA-` prefix
        name == wanted || name.strip_prefix("nvidia-") == Some(wanted.as_str())
    });
    if let Some(m) = found {
        return Ok(m);
    }
    gpu_dra_api::profiles::lookup(base).map_err(|_| {
        let known: Vec<String> = catalog().iter().map(|m| norm(&m.product_name)).collect();
        bad(
            node,
            PRODUCT_LABEL,
            value,
            format!(
                "not a GPU model of the hardware catalog (gpu-dra-api/data/gpus.yaml); known \
                 (case-insensitive): {}",
                known.join(", ")
            ),
        )
    })
}

/// A device-plugin MIG resource suffix (`1g.10gb`, `1g.10gb.me`) as a MIG profile name.
pub fn mig_profile_name(resource_suffix: &str) -> String {
    match resource_suffix.strip_suffix(".me") {
        Some(p) => format!("{p}+me"),
        None => resource_suffix.to_string(),
    }
}

/// The Node's `status.capacity` extended resources that parse as whole numbers.
fn node_capacity(node: &Node) -> BTreeMap<String, i64> {
    let capacity = node.status.as_ref().and_then(|s| s.capacity.as_ref());
    capacity
        .into_iter()
        .flatten()
        .filter_map(|(k, q)| Some((k.clone(), q.0.parse::<i64>().ok()?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn product_labels_map_to_the_catalog() {
        for (label, key) in [
            ("NVIDIA-H100-80GB-HBM3", "H100-SXM5-80GB"),
            ("NVIDIA-A100-SXM4-40GB", "A100-SXM4-40GB"),
            ("A100-SXM4-40GB-MIG-1g.5gb", "A100-SXM4-40GB"),
            ("NVIDIA-L4-SHARED", "L4"),
            ("h100-80gb", "H100-SXM5-80GB"),
        ] {
            assert_eq!(model_of("n", label).unwrap().key, key, "{label}");
        }
        let err = model_of("gpu-7", "NVIDIA-GeForce-RTX-4090").unwrap_err();
        let err = err.to_string();
        assert!(
            err.contains("Node gpu-7")
                && err.contains(PRODUCT_LABEL)
                && err.contains("NVIDIA-GeForce-RTX-4090"),
            "{err}"
        );
    }

    #[test]
    fn mig_resource_suffixes_are_profile_names() {
        assert_eq!(mig_profile_name("1g.10gb"), "1g.10gb");
        assert_eq!(mig_profile_name("1g.10gb.me"), "1g.10gb+me");
    }
}
