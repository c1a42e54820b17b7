use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, DeviceCapacity};

use super::*;
use crate::simulated::{GpuGroup, simulate_node};
use crate::slices::{SliceOptions, TaintMap, build_pool};

fn pool(spec: &str, layout: Option<&str>, dynamic_mig: bool) -> Vec<SliceContent> {
    let groups = [GpuGroup::parse(spec).unwrap()];
    let inv = simulate_node("n1", &groups, layout).unwrap();
    let opts = SliceOptions {
        dynamic_mig,
        ..SliceOptions::new("n1")
    };
    build_pool(&inv, &opts, &TaintMap::new())
}

fn devices(c: &[SliceContent]) -> Vec<&Device> {
    c.iter().flat_map(|s| &s.devices).collect()
}

/// `(value, default, min, max, step)` of a capacity's request policy.
fn shape(c: &DeviceCapacity) -> (&str, &str, &str, &str, &str) {
    let p = c.request_policy.as_ref().expect("a request policy");
    let r = p.valid_range.as_ref().unwrap();
    (
        &c.value.0,
        &p.default.as_ref().unwrap().0,
        &r.min.0,
        &r.max.as_ref().unwrap().0,
        &r.step.as_ref().unwrap().0,
    )
}

fn caps(d: &Device) -> &BTreeMap<String, DeviceCapacity> {
    d.capacity.as_ref().unwrap()
}

#[test]
fn modes_parse_like_nvidias_flag() {
    // NVIDIA cmd/gpu-kubelet-plugin/main.go: --consumable-shares / CONSUMABLE_SHARES validation.
    for (s, want) in [
        ("disabled", ConsumableShares::Disabled),
        ("memory", ConsumableShares::Memory),
        ("unlimited", ConsumableShares::Unlimited),
        ("4", ConsumableShares::Shares(4)),
    ] {
        assert_eq!(s.parse::<ConsumableShares>(), Ok(want));
        assert_eq!(want.to_string(), s);
    }
    for bad in ["0", "-2", "Memory", "", "four", "2.5"] {
        let e = bad.parse::<ConsumableShares>().unwrap_err();
        assert_eq!(
            e,
            format!(
                "invalid value for --consumable-shares: {bad:?} (must be 'disabled', 'memory', \
                 'unlimited', or a positive integer)"
            )
        );
    }
    assert_eq!(ConsumableShares::default(), ConsumableShares::Disabled);
    let off = FeatureGates::parse("").unwrap();
    let on = FeatureGates::parse("ConsumableShares=true").unwrap();
    let e = ConsumableShares::Memory.check_gate(&off).unwrap_err();
    assert!(e.contains("requires feature gate ConsumableShares"), "{e}");
    assert!(ConsumableShares::Disabled.check_gate(&off).is_ok());
    assert!(ConsumableShares::Memory.check_gate(&on).is_ok());
    assert!(
        !ConsumableShares::Disabled.active(&on),
        "the gate alone shares nothing"
    );
    assert!(ConsumableShares::Unlimited.active(&on));
}

#[test]
fn each_mode_publishes_nvidias_memory_policy() {
    // NVIDIA cmd/gpu-kubelet-plugin/consumable_shares.go applyConsumableShares.
    let before = pool("h100-80gb:1", None, false);
    assert_eq!(caps(devices(&before)[0])["memory"].value.0, "81559Mi");
    let mut off = before.clone();
    enable_consumable_shares(&mut off, ConsumableShares::Disabled);
    assert_eq!(off, before);

    let mut c = before.clone();
    enable_consumable_shares(&mut c, ConsumableShares::Unlimited);
    let d = devices(&c)[0];
    assert_eq!(d.allow_multiple_allocations, Some(true));
    assert_eq!(
        shape(&caps(d)["memory"]),
        ("81559Mi", "0", "0", "81559Mi", "1Mi")
    );
    assert!(!caps(d).contains_key("shares"));

    let mut c = before.clone();
    enable_consumable_shares(&mut c, ConsumableShares::Memory);
    assert_eq!(
        shape(&caps(devices(&c)[0])["memory"]),
        ("81559Mi", "81559Mi", "1Mi", "81559Mi", "1Mi")
    );

    let mut c = before.clone();
    enable_consumable_shares(&mut c, ConsumableShares::Shares(4));
    let d = devices(&c)[0];
    assert_eq!(
        shape(&caps(d)["memory"]),
        ("81559Mi", "0", "0", "81559Mi", "1Mi")
    );
    assert_eq!(shape(&caps(d)["shares"]), ("4", "1", "1", "4", "1"));
    let mut c = before.clone();
    enable_consumable_shares(&mut c, ConsumableShares::Shares(2000));
    assert_eq!(
        shape(&caps(devices(&c)[0])["shares"]),
        ("2k", "1", "1", "2k", "1")
    );
}

#[test]
fn memory_is_rounded_down_to_whole_mebibytes() {
    let mut c = pool("h100-80gb:1", None, false);
    c[0].devices[0]
        .capacity
        .as_mut()
        .unwrap()
        .get_mut("memory")
        .unwrap()
        .value = Quantity(((10u64 << 30) + 12345).to_string());
    enable_consumable_shares(&mut c, ConsumableShares::Memory);
    assert_eq!(
        shape(&caps(&c[0].devices[0])["memory"]),
        ("10Gi", "10Gi", "1Mi", "10Gi", "1Mi")
    );
}

#[test]
fn static_and_dynamic_mig_devices_are_shared_too() {
    let mut mig = pool("a100-40gb:1", Some("all-1g.5gb"), false);
    enable_consumable_shares(&mut mig, ConsumableShares::Shares(3));
    assert_eq!(devices(&mig).len(), 7);
    for d in devices(&mig) {
        assert_eq!(d.allow_multiple_allocations, Some(true), "{}", d.name);
        assert_eq!(shape(&caps(d)["shares"]).0, "3");
        assert_eq!(shape(&caps(d)["memory"]).3, "4864Mi");
    }
    let mut dynamic = pool("h100-80gb:1", None, true);
    enable_consumable_shares(&mut dynamic, ConsumableShares::Unlimited);
    let all = devices(&dynamic);
    assert_eq!(all.len(), 26);
    assert!(
        all.iter()
            .all(|d| d.allow_multiple_allocations == Some(true))
    );
    let whole = all.iter().find(|d| d.name == "gpu-0").unwrap();
    assert_eq!(shape(&caps(whole)["memory"]).3, "81152Mi");
}

#[test]
fn vfio_devices_are_never_shared() {
    let mut c = pool("h100-80gb:1", None, false);
    let mut vfio = c[0].devices[0].clone();
    vfio.name = "gpu-vfio-0".into();
    let attrs = vfio.attributes.as_mut().unwrap();
    attrs.get_mut("type").unwrap().string = Some("vfio".into());
    c[0].devices.push(vfio.clone());
    enable_consumable_shares(&mut c, ConsumableShares::Memory);
    assert_eq!(c[0].devices[1], vfio);
}
