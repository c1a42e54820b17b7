//! The reconciler's report: `status` (every GPU as it is now, per-GPU refusal messages, the
//! `Applied` condition, the generation acted on) and Events on the MigLayout.
use std::collections::BTreeMap;

use dra_plugin_core::miglayout::Refusal;
use gpu_dra_api::inventory::{Gpu, Inventory};
use gpu_dra_api::miglayout::{
    APPLIED_CONDITION, GpuLayoutStatus, MigLayout, MigLayoutStatus, MigPlacement,
};
use gpu_dra_api::names::MIG_LAYOUT_PLUGIN_FIELD_MANAGER;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use tracing::{info, warn};

use super::{GpuOutcome, Reconciler};
use crate::Error;
use crate::kube::events::{EventKind, object_event};

/// One GPU as the status shows it.
fn gpu_status(gpu: &Gpu, message: Option<String>) -> GpuLayoutStatus {
    GpuLayoutStatus {
        uuid: gpu.uuid.clone(),
        minor: gpu.minor,
        product_name: gpu.product_name.clone(),
        mig_capable: gpu.mig.is_some(),
        devices: placements(gpu),
        message,
    }
}

fn placements(gpu: &Gpu) -> Vec<MigPlacement> {
    let mut v: Vec<MigPlacement> = gpu
        .mig
        .iter()
        .flat_map(|m| &m.devices)
        .map(|d| MigPlacement {
            profile: d.profile.clone(),
            start: d.placement_start,
        })
        .collect();
    v.sort();
    v
}

/// The `Applied` condition: True when every listed GPU matches; False with the first refusal's
/// reason. The transition time stays while the status does.
pub(crate) fn applied_condition(
    outcomes: &BTreeMap<String, GpuOutcome>,
    generation: i64,
    previous: Option<&Condition>,
) -> Condition {
    let refusals: Vec<&Refusal> = outcomes.values().filter_map(|o| o.as_ref().err()).collect();
    let (status, reason, message) = match refusals.first() {
        None => (
            "True",
            "Applied",
            "every listed GPU has the wanted MIG devices".to_string(),
        ),
        Some(first) => (
            "False",
            first.reason,
            refusals
                .iter()
                .map(|r| r.message.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        ),
    };
    let since = previous
        .filter(|p| p.status == status)
        .map(|p| p.last_transition_time.clone())
        .unwrap_or_else(|| Time(k8s_openapi::jiff::Timestamp::now()));
    Condition {
        type_: APPLIED_CONDITION.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: Some(generation),
        last_transition_time: since,
    }
}

impl Reconciler {
    /// Writes the status and records an Event per GPU changed or newly refused.
    pub(super) async fn report(
        &self,
        layout: &MigLayout,
        live: &Inventory,
        outcomes: &BTreeMap<String, GpuOutcome>,
    ) -> Result<(), Error> {
        let previous = layout.status.clone().unwrap_or_default();
        let message_of = |uuid: &str| {
            outcomes
                .get(uuid)
                .and_then(|o| o.as_ref().err())
                .map(|r| r.message.clone())
        };
        let generation = layout.metadata.generation.unwrap_or_default();
        let status = MigLayoutStatus {
            observed_generation: Some(generation),
            gpus: live
                .gpus
                .iter()
                .map(|g| gpu_status(g, message_of(&g.uuid)))
                .collect(),
            conditions: vec![applied_condition(
                outcomes,
                generation,
                previous
                    .conditions
                    .iter()
                    .find(|c| c.type_ == APPLIED_CONDITION),
            )],
        };
        for gpu in &live.gpus {
            let before = previous.gpus.iter().find(|g| g.uuid == gpu.uuid);
            match outcomes.get(&gpu.uuid) {
                Some(Ok(true)) => {
                    self.event(layout, "Normal", "MigLayoutApplied", changed_message(gpu))
                        .await
                }
                Some(Err(r)) if before.and_then(|b| b.message.as_ref()) != Some(&r.message) => {
                    self.refused(r);
                    warn!(gpu = gpu.minor, reason = r.reason, message = %r.message, "MIG layout not applied");
                    let reason = match r.reason {
                        "Failed" => "MigLayoutFailed",
                        _ => "MigLayoutRefused",
                    };
                    self.event(layout, "Warning", reason, r.message.clone())
                        .await;
                }
                _ => {}
            }
        }
        if layout.status.as_ref() == Some(&status) {
            return Ok(());
        }
        let body = serde_json::json!({
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "MigLayout",
            "status": status,
        });
        let params = PatchParams::apply(MIG_LAYOUT_PLUGIN_FIELD_MANAGER).force();
        self.api()
            .patch_status(&self.node, &params, &Patch::Apply(body))
            .await?;
        Ok(())
    }

    async fn event(&self, layout: &MigLayout, type_: &str, reason: &str, message: String) {
        let involved = ObjectReference {
            api_version: Some("nvidia.com/v1alpha1".into()),
            kind: Some("MigLayout".into()),
            name: Some(self.node.clone()),
            uid: layout.metadata.uid.clone(),
            ..Default::default()
        };
        let what = EventKind {
            type_,
            reason,
            action: "ReconcileMigLayout",
        };
        if let Err(e) = object_event(&self.client, &self.node, involved, what, &message).await {
            warn!(reason, error = %e, "could not record the event");
        }
    }
}

fn changed_message(gpu: &Gpu) -> String {
    let devices = placements(gpu);
    let msg = match devices.is_empty() {
        true => format!("gpu-{} is a whole GPU again", gpu.minor),
        false => format!(
            "gpu-{} has MIG devices {}",
            gpu.minor,
            devices
                .iter()
                .map(|d| format!("{}@{}", d.profile, d.start))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    info!("{msg}");
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applied_is_false_with_the_first_refusal_and_keeps_its_transition_time() {
        let mut outcomes = BTreeMap::new();
        outcomes.insert("GPU-a".to_string(), Ok(true));
        let ok = applied_condition(&outcomes, 3, None);
        assert_eq!(
            (ok.status.as_str(), ok.reason.as_str()),
            ("True", "Applied")
        );
        assert_eq!(ok.observed_generation, Some(3));
        outcomes.insert(
            "GPU-b".to_string(),
            Err(Refusal {
                reason: "InUse",
                message: "gpu-1: gpu-1 held".into(),
            }),
        );
        let refused = applied_condition(&outcomes, 4, Some(&ok));
        assert_eq!(refused.status, "False");
        assert_eq!(refused.reason, "InUse");
        assert!(
            refused.message.contains("gpu-1 held"),
            "{}",
            refused.message
        );
        let mut old = refused.clone();
        old.last_transition_time = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let again = applied_condition(&outcomes, 4, Some(&old));
        assert_eq!(
            again.last_transition_time, old.last_transition_time,
            "no transition"
        );
    }
}
