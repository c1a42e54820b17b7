//! `preCarve`: idle MIG devices kept ready on every pool node, where free GPUs allow.
use std::collections::BTreeSet;

use gpu_dra_api::miglayout::MigPlacement;

use super::decide::{ChangeKind, Work};
use super::model::free_starts;
use crate::controller::crd::MigPolicy;

impl Work<'_> {
    /// Idle devices of pre-carved profiles on node `n`, by `preCarve` entry: (gpu, placement).
    fn idle_of(&self, n: usize, profile: &str) -> Vec<(usize, MigPlacement)> {
        let node = &self.nodes[n];
        node.gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| g.wanted.is_some())
            .flat_map(|(g, gpu)| gpu.layout().iter().map(move |p| (g, gpu, p)))
            .filter(|(_, gpu, p)| p.profile == profile && !self.mig_in_use(&node.name, gpu, p))
            .map(|(g, _, p)| (g, p.clone()))
            .collect()
    }

    /// GPUs that hold the idle devices `preCarve` keeps (the first `count` of each profile per
    /// node); the hold-down leaves them carved.
    pub(super) fn pre_carve_kept(&self) -> BTreeSet<(usize, usize)> {
        let mut kept = BTreeSet::new();
        for n in 0..self.nodes.len() {
            for pc in &self.policy.pre_carve {
                let idle = self.idle_of(n, &pc.profile);
                kept.extend(idle.iter().take(pc.count as usize).map(|(g, _)| (n, *g)));
            }
        }
        kept
    }

    /// Carves what `preCarve` still lacks per node, packed onto GPUs already carved first.
    pub(super) fn pre_carve_fill(&mut self) {
        for n in 0..self.nodes.len() {
            for pc in self.policy.pre_carve.clone() {
                let have = self.idle_of(n, &pc.profile).len();
                for _ in have..pc.count as usize {
                    if !self.pre_carve_one(n, &pc.profile) {
                        break;
                    }
                }
            }
        }
    }

    fn pre_carve_one(&mut self, n: usize, profile: &str) -> bool {
        let mut best: Option<((i64, i64), usize, u32)> = None;
        for g in 0..self.nodes[n].gpus.len() {
            let Some(model) = self.eligible(n, g) else {
                continue;
            };
            let Some(p) = model.profile(profile) else {
                continue;
            };
            let gpu = &self.nodes[n].gpus[g];
            // A whole GPU a pending claim was planned onto is eligible() no more; an unmanaged
            // idle one is ours to take.
            let Some(start) = free_starts(model, gpu.layout(), p).first().copied() else {
                continue;
            };
            let rank = self.rank(n, g, MigPolicy::BinPack);
            // Ties go to the highest minor, as carves for claims do.
            if best.is_none_or(|(r, _, _)| rank <= r) {
                best = Some((rank, g, start));
            }
        }
        let Some((_, g, start)) = best else {
            return false;
        };
        let placement = MigPlacement {
            profile: profile.to_string(),
            start,
        };
        let mut layout = self.nodes[n].gpus[g].layout().to_vec();
        layout.push(placement.clone());
        self.set_layout(n, g, layout);
        self.record(n, g, ChangeKind::PreCarve, Some(placement));
        true
    }
}
