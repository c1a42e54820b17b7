use std::collections::BTreeSet;

use gpu_dra_api::inventory::Gpu;
use gpu_dra_api::simulated::{GpuGroup, simulate_node};

use super::*;

fn h100(layout: Option<&str>) -> Gpu {
    let groups = [GpuGroup::parse("h100-80gb:1").unwrap()];
    simulate_node("n", &groups, layout).unwrap().gpus.remove(0)
}

fn want(list: &[(&str, u32)]) -> Vec<WantedMig> {
    list.iter()
        .map(|(p, s)| WantedMig {
            profile: p.to_string(),
            start: *s,
        })
        .collect()
}

fn held(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn carving_a_whole_gpu_creates_and_withdraws_the_gpu() {
    let gpu = h100(None);
    let c = plan_gpu(&gpu, &want(&[("3g.40gb", 4), ("1g.10gb", 0)]), &held(&[])).unwrap();
    assert!(c.destroy.is_empty());
    let made: Vec<_> = c
        .create
        .iter()
        .map(|n| (n.gi_profile_id, n.start))
        .collect();
    assert_eq!(made, vec![(9, 4), (19, 0)]);
    assert_eq!(c.withdrawn, held(&["gpu-0"]));
}

#[test]
fn an_unchanged_layout_is_no_change_and_a_partial_one_keeps_what_exists() {
    let whole = h100(None);
    assert!(plan_gpu(&whole, &[], &held(&["gpu-0"])).unwrap().is_empty());
    let gpu = h100(Some("3g.40gb,3g.40gb"));
    let existing: Vec<_> = gpu.mig.as_ref().unwrap().devices.clone();
    let keep: Vec<_> = existing
        .iter()
        .map(|d| (d.profile.as_str(), d.placement_start))
        .collect();
    assert!(plan_gpu(&gpu, &want(&keep), &held(&[])).unwrap().is_empty());
    // Keep the first, replace the second with two 1g devices: only the second is withdrawn.
    let first = &existing[0];
    let other = if first.placement_start == 0 { 4 } else { 0 };
    let c = plan_gpu(
        &gpu,
        &want(&[
            ("3g.40gb", first.placement_start),
            ("1g.10gb", other),
            ("1g.10gb", other + 1),
        ]),
        &held(&[&device_name(0, first)]),
    )
    .unwrap();
    assert_eq!(c.destroy, vec![existing[1].clone()]);
    assert_eq!(c.create.len(), 2);
    assert_eq!(c.withdrawn, held(&[&device_name(0, &existing[1])]));
}

#[test]
fn back_to_whole_destroys_every_instance_unless_one_is_held() {
    let gpu = h100(Some("3g.40gb,3g.40gb"));
    let names: Vec<_> = gpu
        .mig
        .as_ref()
        .unwrap()
        .devices
        .iter()
        .map(|d| device_name(0, d))
        .collect();
    let c = plan_gpu(&gpu, &[], &held(&[])).unwrap();
    assert_eq!(c.destroy.len(), 2);
    assert!(c.create.is_empty());
    assert!(
        !c.withdrawn.contains("gpu-0"),
        "the whole GPU comes back, it is not withdrawn"
    );
    let r = plan_gpu(&gpu, &[], &held(&[&names[1]])).unwrap_err();
    assert_eq!(r.reason, "InUse");
    assert!(r.message.contains(&names[1]), "{}", r.message);
}

#[test]
fn a_gpu_stuck_in_mig_mode_without_devices_is_reported() {
    let mut gpu = h100(None);
    gpu.mig.as_mut().unwrap().enabled = true;
    let r = plan_gpu(&gpu, &[], &held(&[])).unwrap_err();
    assert_eq!(r.reason, "Failed");
    assert!(r.message.contains("MIG mode"), "{}", r.message);
    let c = plan_gpu(&gpu, &want(&[("7g.80gb", 0)]), &held(&[])).unwrap();
    assert_eq!(c.create.len(), 1, "carving it is fine");
}

#[test]
fn a_held_whole_gpu_is_not_carved() {
    let r = plan_gpu(&h100(None), &want(&[("3g.40gb", 0)]), &held(&["gpu-0"])).unwrap_err();
    assert_eq!(r.reason, "InUse");
    assert!(r.message.contains("gpu-0"), "{}", r.message);
}

#[test]
fn impossible_wishes_are_invalid() {
    let gpu = h100(None);
    for (w, why) in [
        (want(&[("9g.90gb", 0)]), "no MIG profile"),
        (want(&[("3g.40gb", 2)]), "cannot start"),
        (want(&[("3g.40gb", 0), ("1g.10gb", 3)]), "overlaps"),
    ] {
        let r = plan_gpu(&gpu, &w, &held(&[])).unwrap_err();
        assert_eq!(r.reason, "Invalid", "{w:?}");
        assert!(r.message.contains(why), "{w:?}: {}", r.message);
    }
    let mut no_mig = gpu.clone();
    no_mig.mig = None;
    assert!(plan_gpu(&no_mig, &[], &held(&[])).unwrap().is_empty());
    let r = plan_gpu(&no_mig, &want(&[("3g.40gb", 0)]), &held(&[])).unwrap_err();
    assert!(r.message.contains("cannot do MIG"), "{}", r.message);
}
