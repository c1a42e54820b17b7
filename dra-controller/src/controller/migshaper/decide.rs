//! The decision core: from the pool's MigLayouts, what is allocated and what is pending, the MIG
//! geometry each node should have next. Pure: no API calls, time passed in.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dra_sim::alloc::{AllocatedState, Allocator, DeviceCache, SimNode};
use gpu_dra_api::inventory::{gpu_device_name, mig_device_name};
use gpu_dra_api::miglayout::{GpuLayout, MigPlacement};
use gpu_dra_api::names::GPU_DRIVER;
use gpu_dra_api::profiles::{GpuModel, MigProfile};
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim, ResourceSlice};

use super::model::{GpuState, NodeState, free_starts, node_slices, used_slices};
use super::{Policy, unmet::UnmetReason};
use crate::controller::crd::MigPolicy;

/// A claim of a pending pod that has no allocation yet.
#[derive(Clone, Debug)]
pub struct PendingClaim {
    /// `namespace/name` of the claim.
    pub key: String,
    /// `namespace/name` of the pod waiting for it.
    pub pod: String,
    pub claim: ResourceClaim,
    /// The pod's `nodeSelector`: only nodes with these labels are considered.
    pub node_selector: BTreeMap<String, String>,
}

/// Everything one pass looks at.
pub struct State<'a> {
    pub nodes: Vec<NodeState>,
    /// The published slices, as the scheduler sees them.
    pub slices: &'a [ResourceSlice],
    pub classes: &'a [DeviceClass],
    /// Claims with an allocation.
    pub allocated: &'a [ResourceClaim],
    pub pending: Vec<PendingClaim>,
    /// Labels of the nodes, by name, for the pods' node selectors.
    pub node_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// Since when each GPU (by UUID) has had MIG devices and none of them in use, from the last pass.
    pub idle_since: BTreeMap<String, Instant>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ChangeKind {
    /// A new MIG device for a pending claim.
    Carve,
    /// A new idle MIG device that `preCarve` asks for.
    PreCarve,
    /// An idle GPU back to whole after the hold-down.
    Merge,
    /// An allocated device the spec had dropped, put back.
    Restore,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Carve => "carve",
            Self::PreCarve => "precarve",
            Self::Merge => "merge",
            Self::Restore => "restore",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub node: String,
    pub gpu: String,
    pub kind: ChangeKind,
    pub placement: Option<MigPlacement>,
    /// The pending claim a carve is for.
    pub claim: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Unmet {
    pub pod: String,
    pub claim: String,
    pub reason: UnmetReason,
}

#[derive(Debug, Default)]
pub struct Decision {
    /// The whole new `spec.gpus` of each node whose spec changes.
    pub layouts: BTreeMap<String, Vec<GpuLayout>>,
    pub changes: Vec<Change>,
    pub unmet: Vec<Unmet>,
    pub idle_since: BTreeMap<String, Instant>,
    /// When the next hold-down runs out, if any GPU is counting down.
    pub next_check: Option<Duration>,
}

/// Bounds the allocator runs spent on one claim's hypotheses.
const MAX_TRIES: usize = 256;

/// One pass over the pool: restore, place pending claims, merge idle GPUs, pre-carve.
pub fn decide(state: State<'_>, policy: &Policy, now: Instant) -> Decision {
    let original = state.nodes.clone();
    let mut w = Work {
        policy,
        classes: state.classes,
        nodes: state.nodes,
        allocated: AllocatedState::from_claims(state.allocated),
        node_labels: state.node_labels,
        touched: BTreeSet::new(),
        changes: Vec::new(),
    };
    w.restore_allocated();
    w.restore_whole();
    let mut pending = state.pending;
    pending.sort_by(|a, b| a.key.cmp(&b.key));
    // The published slices' device facts and class outcomes, worked out once for all claims.
    let published = Published {
        slices: state.slices,
        cache: Arc::new(DeviceCache::new(state.slices)),
    };
    let unmet = pending
        .iter()
        .filter_map(|p| w.place(p, &published))
        .collect();
    let kept = w.pre_carve_kept();
    let mut idle_since = state.idle_since;
    let next_check = w.hold_down(&mut idle_since, &kept, now);
    w.pre_carve_fill();
    Decision {
        layouts: w.specs(&original),
        changes: w.changes,
        unmet,
        idle_since,
        next_check,
    }
}

pub(super) struct Work<'a> {
    pub policy: &'a Policy,
    pub classes: &'a [DeviceClass],
    pub nodes: Vec<NodeState>,
    /// Allocated devices, plus those this pass plans pending claims onto.
    pub allocated: AllocatedState,
    pub node_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// (node, gpu) indices whose layout this pass changed.
    pub touched: BTreeSet<(usize, usize)>,
    pub changes: Vec<Change>,
}

/// What the scheduler sees now, with the allocator's per-device cache.
struct Published<'a> {
    slices: &'a [ResourceSlice],
    cache: Arc<DeviceCache>,
}

/// A new MIG device on one GPU.
struct Hypothesis {
    node: usize,
    gpu: usize,
    profile: &'static MigProfile,
    start: u32,
}

impl Work<'_> {
    pub fn in_use(&self, node: &str, device: &str) -> bool {
        let id = (GPU_DRIVER.to_string(), node.to_string(), device.to_string());
        self.allocated.devices.contains(&id) || self.allocated.shared.contains(&id)
    }

    pub fn mig_in_use(&self, node: &str, gpu: &GpuState, p: &MigPlacement) -> bool {
        let Some(model) = gpu.model else { return false };
        let Some(prof) = model.profile(&p.profile) else {
            return false;
        };
        self.in_use(
            node,
            &mig_device_name(gpu.minor, &prof.name, prof.gi_profile_id, p.start),
        )
    }

    /// Whether a device of the GPU, whole or MIG, existing or wanted, is in use.
    pub fn gpu_in_use(&self, n: usize, g: usize) -> bool {
        let node = &self.nodes[n];
        let gpu = &node.gpus[g];
        self.in_use(&node.name, &gpu_device_name(gpu.minor))
            || gpu
                .all_devices()
                .into_iter()
                .any(|p| self.mig_in_use(&node.name, gpu, p))
    }

    pub fn set_layout(&mut self, n: usize, g: usize, mut layout: Vec<MigPlacement>) {
        layout.sort_by(|a, b| (a.start, &a.profile).cmp(&(b.start, &b.profile)));
        self.nodes[n].gpus[g].wanted = Some(layout);
        self.touched.insert((n, g));
    }

    pub fn record(&mut self, n: usize, g: usize, kind: ChangeKind, p: Option<MigPlacement>) {
        self.changes.push(Change {
            node: self.nodes[n].name.clone(),
            gpu: self.nodes[n].gpus[g].uuid.clone(),
            kind,
            placement: p,
            claim: None,
        });
    }

    /// Gives up a carve on a GPU that the scheduler allocated whole before the plugin got to it
    /// (the plugin refuses it): the GPU stays whole and its pending claims are planned again.
    fn restore_whole(&mut self) {
        for n in 0..self.nodes.len() {
            for g in 0..self.nodes[n].gpus.len() {
                let node = &self.nodes[n];
                let gpu = &node.gpus[g];
                let carved = gpu.wanted.as_ref().is_some_and(|w| !w.is_empty());
                if carved && self.in_use(&node.name, &gpu_device_name(gpu.minor)) {
                    self.set_layout(n, g, Vec::new());
                    self.record(n, g, ChangeKind::Restore, None);
                }
            }
        }
    }

    /// Puts back any allocated MIG device that exists but that a managed GPU's spec no longer
    /// lists (the scheduler allocated it while a merge was on its way).
    fn restore_allocated(&mut self) {
        for n in 0..self.nodes.len() {
            for g in 0..self.nodes[n].gpus.len() {
                let node = &self.nodes[n];
                let gpu = &node.gpus[g];
                let Some(wanted) = &gpu.wanted else { continue };
                let lost: Vec<MigPlacement> = gpu
                    .existing
                    .iter()
                    .filter(|p| !wanted.contains(p) && self.mig_in_use(&node.name, gpu, p))
                    .cloned()
                    .collect();
                if lost.is_empty() {
                    continue;
                }
                // Whatever the spec added since may overlap; the allocated device wins.
                let mut layout: Vec<MigPlacement> = wanted
                    .iter()
                    .filter(|p| self.mig_in_use(&node.name, gpu, p))
                    .cloned()
                    .collect();
                layout.extend(lost.iter().cloned());
                self.set_layout(n, g, layout);
                for p in lost {
                    self.record(n, g, ChangeKind::Restore, Some(p));
                }
            }
        }
    }

    /// Whether the pod waiting for `p` may run on `node` as far as its node selector goes.
    fn selects(&self, p: &PendingClaim, node: &str) -> bool {
        let labels = self.node_labels.get(node);
        p.node_selector
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
    }

    fn sim_node(&self, node: &str) -> SimNode {
        SimNode {
            name: node.to_string(),
            labels: self.node_labels.get(node).cloned().unwrap_or_default(),
        }
    }

    /// The allocation of `claim` on `node` over `slices` with what is in use now, if any.
    pub fn allocate(
        &self,
        slices: &[ResourceSlice],
        node: &str,
        claim: &ResourceClaim,
    ) -> Option<Vec<AllocationResult>> {
        let alloc = Allocator::new(self.classes, slices, self.allocated.clone());
        let sim = self.sim_node(node);
        alloc
            .allocate(&sim, std::slice::from_ref(claim))
            .ok()
            .flatten()
    }

    fn reserve(&mut self, results: &[AllocationResult]) {
        for r in results {
            self.allocated.add(r);
        }
    }

    /// Plans one pending claim: nothing when it fits what is published or planned, else one new
    /// MIG device; `Some` when neither works.
    fn place(&mut self, p: &PendingClaim, published: &Published<'_>) -> Option<Unmet> {
        if let Some(r) = self.fits_published(published, p) {
            self.reserve(&r);
            return None;
        }
        // Nodes whose spec is carried out already publish what it asks for: checked above.
        for n in 0..self.nodes.len() {
            if !self.nodes[n].changing() || !self.selects(p, &self.nodes[n].name) {
                continue;
            }
            let slices = node_slices(&self.nodes[n], GpuState::layout);
            if let Some(r) = self.allocate(&slices, &self.nodes[n].name, &p.claim) {
                self.reserve(&r);
                return None;
            }
        }
        let mut probes = super::unmet::Probes::default();
        let hypotheses = self.hypotheses(p, &mut probes);
        for h in hypotheses.iter().take(MAX_TRIES) {
            if self.try_hypothesis(h, p) {
                return None;
            }
        }
        let reason = probes.reason(self, &p.claim);
        Some(Unmet {
            pod: p.pod.clone(),
            claim: p.key.clone(),
            reason,
        })
    }

    fn fits_published(
        &self,
        published: &Published<'_>,
        p: &PendingClaim,
    ) -> Option<Vec<AllocationResult>> {
        let alloc = Allocator::with_cache(
            self.classes,
            published.slices,
            self.allocated.clone(),
            published.cache.clone(),
        );
        alloc
            .node_names()
            .into_iter()
            .filter(|name| self.selects(p, name))
            .find_map(|name| {
                alloc
                    .allocate(&self.sim_node(&name), std::slice::from_ref(&p.claim))
                    .ok()
                    .flatten()
            })
    }

    /// Whether the GPU may get new MIG devices: shapeable, not allocated or planned whole, and
    /// either managed already or not carved by anyone else.
    pub fn eligible(&self, n: usize, g: usize) -> Option<&'static GpuModel> {
        let node = &self.nodes[n];
        let gpu = &node.gpus[g];
        let model = gpu.shapeable()?;
        let ours = gpu.wanted.is_some() || gpu.existing.is_empty();
        (ours && !self.in_use(&node.name, &gpu_device_name(gpu.minor))).then_some(model)
    }

    /// GPUs of node `n` in use in any way (carved, allocated, planned).
    pub fn node_load(&self, n: usize) -> usize {
        (0..self.nodes[n].gpus.len())
            .filter(|&g| !self.nodes[n].gpus[g].layout().is_empty() || self.gpu_in_use(n, g))
            .count()
    }

    /// The order policy puts GPU `g` of node `n` in (smaller first).
    pub fn rank(&self, n: usize, g: usize, policy: MigPolicy) -> (i64, i64) {
        let gpu = &self.nodes[n].gpus[g];
        let used = i64::from(gpu.model.map_or(0, |m| used_slices(m, gpu.layout())));
        let load = i64::try_from(self.node_load(n)).unwrap_or(i64::MAX);
        match policy {
            MigPolicy::BinPack => (-used, -load),
            MigPolicy::Spread => (load, used),
        }
    }

    /// Every single new MIG device that could serve `claim`, best first: smallest matching profile,
    /// then the policy's GPU order, then node, GPU and placement.
    fn hypotheses(&self, p: &PendingClaim, probes: &mut super::unmet::Probes) -> Vec<Hypothesis> {
        let claim = &p.claim;
        let mut out = Vec::new();
        for n in 0..self.nodes.len() {
            if !self.selects(p, &self.nodes[n].name) {
                continue;
            }
            for g in 0..self.nodes[n].gpus.len() {
                let Some(model) = self.eligible(n, g) else {
                    continue;
                };
                let layout = self.nodes[n].gpus[g].layout();
                for profile in &model.profiles {
                    if !probes.matches(self, model, Some(profile), claim) {
                        continue;
                    }
                    for start in free_starts(model, layout, profile) {
                        out.push(Hypothesis {
                            node: n,
                            gpu: g,
                            profile,
                            start,
                        });
                    }
                }
            }
        }
        let policy = self.policy.placement;
        out.sort_by_cached_key(|h| {
            (
                (h.profile.memory_slices, h.profile.compute_slices),
                self.rank(h.node, h.gpu, policy),
                self.nodes[h.node].name.clone(),
                // The scheduler takes whole GPUs lowest device first; carving from the other end
                // keeps a carve and a whole-GPU pod from reaching for the same GPU.
                std::cmp::Reverse(self.nodes[h.node].gpus[h.gpu].minor),
                h.start,
            )
        });
        out
    }

    /// Adds the hypothesis's device when the claim then allocates on its node; reserves it.
    fn try_hypothesis(&mut self, h: &Hypothesis, p: &PendingClaim) -> bool {
        let placement = MigPlacement {
            profile: h.profile.name.clone(),
            start: h.start,
        };
        let mut node = self.nodes[h.node].clone();
        let gpu = &mut node.gpus[h.gpu];
        let mut layout = gpu.layout().to_vec();
        layout.push(placement.clone());
        gpu.wanted = Some(layout.clone());
        let slices = node_slices(&node, GpuState::layout);
        let Some(results) = self.allocate(&slices, &node.name, &p.claim) else {
            return false;
        };
        self.set_layout(h.node, h.gpu, layout);
        self.reserve(&results);
        self.record(h.node, h.gpu, ChangeKind::Carve, Some(placement));
        if let Some(c) = self.changes.last_mut() {
            c.claim = Some(p.key.clone());
        }
        true
    }

    /// Returns managed GPUs whose MIG devices have all been unused for the hold-down to whole;
    /// `kept` GPUs hold pre-carved devices and stay. The time until the next one is due.
    fn hold_down(
        &mut self,
        idle_since: &mut BTreeMap<String, Instant>,
        kept: &BTreeSet<(usize, usize)>,
        now: Instant,
    ) -> Option<Duration> {
        let mut idle_now = BTreeSet::new();
        let mut next: Option<Duration> = None;
        for n in 0..self.nodes.len() {
            for g in 0..self.nodes[n].gpus.len() {
                let gpu = &self.nodes[n].gpus[g];
                let carved = gpu.wanted.as_ref().is_some_and(|w| !w.is_empty());
                let busy = self.gpu_in_use(n, g) || self.touched.contains(&(n, g));
                if !carved || busy || kept.contains(&(n, g)) {
                    continue;
                }
                let uuid = gpu.uuid.clone();
                let since = *idle_since.entry(uuid.clone()).or_insert(now);
                let idle = now.saturating_duration_since(since);
                if idle >= self.policy.hold_down {
                    self.set_layout(n, g, Vec::new());
                    self.record(n, g, ChangeKind::Merge, None);
                } else {
                    let left = self.policy.hold_down - idle;
                    next = Some(next.map_or(left, |d| d.min(left)));
                    idle_now.insert(uuid);
                }
            }
        }
        idle_since.retain(|uuid, _| idle_now.contains(uuid));
        next
    }

    /// The new specs of the nodes whose managed layouts differ from `original`.
    fn specs(&self, original: &[NodeState]) -> BTreeMap<String, Vec<GpuLayout>> {
        let spec = |node: &NodeState| -> Vec<GpuLayout> {
            let mut gpus: Vec<&GpuState> =
                node.gpus.iter().filter(|g| g.wanted.is_some()).collect();
            gpus.sort_by_key(|g| g.minor);
            gpus.into_iter()
                .map(|g| GpuLayout {
                    uuid: g.uuid.clone(),
                    devices: g.layout().to_vec(),
                })
                .collect()
        };
        self.nodes
            .iter()
            .zip(original)
            .filter(|(now, _)| {
                self.touched
                    .iter()
                    .any(|(n, _)| self.nodes[*n].name == now.name)
            })
            .filter_map(|(now, before)| {
                let new = spec(now);
                (new != spec(before)).then(|| (now.name.clone(), new))
            })
            .collect()
    }
}
