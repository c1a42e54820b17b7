//! Why a pending claim gets no MIG device: the probes that tell "no GPU model offers it" from
//! "every candidate GPU is busy".
use std::collections::{BTreeMap, BTreeSet};

use dra_sim::alloc::{AllocatedState, Allocator, SimNode};
use gpu_dra_api::miglayout::MigPlacement;
use gpu_dra_api::profiles::{GpuModel, MigProfile};
use gpu_dra_api::simulated::plan_layout;
use k8s_openapi::api::resource::v1::ResourceClaim;

use super::decide::Work;
use super::model::{GpuState, NodeState, node_slices};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UnmetReason {
    /// No GPU model in the pool offers a device (whole or any MIG profile) the claim would take.
    NoMatchingProfile,
    /// Some model would do, but every GPU that could host it is allocated or has no room.
    AllCandidatesBusy,
}

impl UnmetReason {
    /// The Event's reason and the metric's label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoMatchingProfile => "NoMatchingMigProfile",
            Self::AllCandidatesBusy => "AllMigCandidatesBusy",
        }
    }

    pub fn message(self, claim: &str) -> String {
        match self {
            Self::NoMatchingProfile => format!(
                "on-demand MIG: no GPU model in the pool offers a device that claim {claim} matches, whole or as any MIG profile"
            ),
            Self::AllCandidatesBusy => format!(
                "on-demand MIG: every GPU that could host claim {claim} is allocated or has no free MIG placement left; \
                 idle MIG devices go back to whole after the hold-down"
            ),
        }
    }
}

/// Per claim: whether it allocates on a lone GPU of a model, whole (`None`) or filled with one
/// MIG profile, cached by (model, profile).
#[derive(Default)]
pub(super) struct Probes {
    seen: BTreeMap<(String, Option<String>), bool>,
}

impl Probes {
    pub(super) fn matches(
        &mut self,
        w: &Work<'_>,
        model: &'static GpuModel,
        profile: Option<&MigProfile>,
        claim: &ResourceClaim,
    ) -> bool {
        let key = (model.key.clone(), profile.map(|p| p.name.clone()));
        if let Some(m) = self.seen.get(&key) {
            return *m;
        }
        let m = probe(w, model, profile, claim);
        self.seen.insert(key, m);
        m
    }

    pub(super) fn reason(&mut self, w: &Work<'_>, claim: &ResourceClaim) -> UnmetReason {
        let models: BTreeSet<&'static str> = w
            .nodes
            .iter()
            .flat_map(|n| &n.gpus)
            .filter_map(|g| g.model.map(|m| m.key.as_str()))
            .collect();
        for key in models {
            let Some(model) = gpu_dra_api::profiles::catalog()
                .iter()
                .find(|m| m.key == key)
            else {
                continue;
            };
            if self.matches(w, model, None, claim)
                || model
                    .profiles
                    .iter()
                    .any(|p| self.matches(w, model, Some(p), claim))
            {
                return UnmetReason::AllCandidatesBusy;
            }
        }
        UnmetReason::NoMatchingProfile
    }
}

/// Allocates `claim` on a one-GPU node of `model` with nothing else in use: every instance of
/// `profile` that fits (a claim may want several), or the whole GPU.
fn probe(
    w: &Work<'_>,
    model: &'static GpuModel,
    profile: Option<&MigProfile>,
    claim: &ResourceClaim,
) -> bool {
    let layout: Vec<MigPlacement> = match profile {
        None => Vec::new(),
        Some(p) => match plan_layout(model, &format!("all-{}", p.name)) {
            Ok(chosen) => chosen
                .into_iter()
                .map(|(p, start)| MigPlacement {
                    profile: p.name.clone(),
                    start,
                })
                .collect(),
            Err(_) => return false,
        },
    };
    let node = NodeState {
        name: "on-demand-mig-probe".into(),
        gpus: vec![GpuState {
            uuid: "GPU-on-demand-mig-probe".into(),
            minor: 0,
            model: Some(model),
            mig_capable: model.mig_capable,
            existing: layout,
            wanted: None,
        }],
    };
    let slices = node_slices(&node, GpuState::layout);
    let alloc = Allocator::new(w.classes, &slices, AllocatedState::default());
    let sim = SimNode {
        name: node.name.clone(),
        labels: BTreeMap::new(),
    };
    matches!(
        alloc.allocate(&sim, std::slice::from_ref(claim)),
        Ok(Some(_))
    )
}
