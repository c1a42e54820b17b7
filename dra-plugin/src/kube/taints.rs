//! The core's device health as the API shows it: `DeviceTaint`s on the published devices of an
//! unhealthy GPU.
use gpu_dra_api::slices::{SliceContent, TaintMap};
use k8s_openapi::api::resource::v1::DeviceTaint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use dra_plugin_core::health::{HealthTaint, HealthTracker, gpu_of};

/// The API's taint for one of the core's.
pub fn device_taint(t: &HealthTaint) -> DeviceTaint {
    DeviceTaint {
        key: t.key.to_string(),
        value: t.value.clone(),
        effect: t.effect.to_string(),
        time_added: t.since.map(|since| {
            Time(
                k8s_openapi::jiff::Timestamp::try_from(since)
                    .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            )
        }),
    }
}

/// Taints for every published device of an unhealthy GPU (the GPU and its MIG devices).
pub fn taint_map(tracker: &HealthTracker, pool: &[SliceContent]) -> TaintMap {
    let mut map = TaintMap::new();
    for d in pool.iter().flat_map(|s| &s.devices) {
        let Some(minor) = gpu_of(&d.name) else {
            continue;
        };
        let taints: Vec<DeviceTaint> = tracker.taints(minor).iter().map(device_taint).collect();
        if !taints.is_empty() {
            map.insert(d.name.clone(), taints);
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use dra_plugin_core::backend::{HealthEvent, HealthEventKind};
    use gpu_dra_api::names::{TAINT_GPU_LOST, TAINT_UNMONITORED, TAINT_XID};
    use gpu_dra_api::simulated::{GpuGroup, simulate_node};
    use gpu_dra_api::slices::{SliceOptions, build_pool};

    use super::*;

    fn ev(minor: u32, kind: HealthEventKind) -> HealthEvent {
        HealthEvent {
            minor,
            uuid: format!("GPU-{minor}"),
            kind,
            mig: None,
        }
    }

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    #[test]
    fn faults_carry_their_first_time_and_unmonitored_none() {
        let mut h = HealthTracker::new(Duration::from_secs(60));
        h.apply(&ev(0, HealthEventKind::Xid(79)), t(0));
        h.apply(&ev(0, HealthEventKind::Xid(79)), t(1));
        h.apply(&ev(1, HealthEventKind::Unmonitored), t(0));
        let xid = device_taint(&h.taints(0)[0]);
        assert_eq!(
            (xid.key.as_str(), xid.value.as_deref(), xid.effect.as_str()),
            (TAINT_XID, Some("79"), "NoSchedule")
        );
        assert_eq!(
            xid.time_added,
            Some(Time(k8s_openapi::jiff::Timestamp::try_from(t(0)).unwrap())),
            "first occurrence kept"
        );
        let unmonitored = device_taint(&h.taints(1)[0]);
        assert_eq!(
            (unmonitored.key.as_str(), unmonitored.effect.as_str()),
            (TAINT_UNMONITORED, "None")
        );
        assert_eq!(unmonitored.time_added, None);
    }

    #[test]
    fn taints_cover_the_gpu_and_its_mig_devices() {
        let inv = simulate_node("n", &[GpuGroup::parse("h100-80gb:2").unwrap()], None).unwrap();
        let opts = SliceOptions {
            dynamic_mig: true,
            ..SliceOptions::new("n")
        };
        let pool = build_pool(&inv, &opts, &TaintMap::new());
        let mut h = HealthTracker::new(Duration::from_secs(60));
        h.apply(&ev(1, HealthEventKind::GpuLost), t(0));
        let map = taint_map(&h, &pool);
        assert_eq!(map.len(), 26, "gpu-1 and its 25 placements");
        assert!(map.keys().all(|d| gpu_of(d) == Some(1)));
        let tainted = build_pool(&inv, &opts, &map);
        let d = tainted
            .iter()
            .flat_map(|s| &s.devices)
            .find(|d| d.name == "gpu-1-mig-3g40gb-9-4")
            .unwrap();
        assert_eq!(d.taints.as_ref().unwrap()[0].key, TAINT_GPU_LOST);
    }
}
