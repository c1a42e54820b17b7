use super::*;
use crate::simulated::{GpuGroup, simulate_node};

fn inv(spec: &[&str], layout: Option<&str>) -> Inventory {
    let groups: Vec<_> = spec.iter().map(|s| GpuGroup::parse(s).unwrap()).collect();
    simulate_node("node-a", &groups, layout).unwrap()
}

fn attr<'d>(d: &'d Device, name: &str) -> &'d DeviceAttribute {
    d.attributes
        .as_ref()
        .unwrap()
        .get(name)
        .unwrap_or_else(|| panic!("{} lacks {name}", d.name))
}

fn all_devices(slices: &[SliceContent]) -> Vec<&Device> {
    slices.iter().flat_map(|s| &s.devices).collect()
}

#[test]
fn whole_gpu_has_every_nvidia_attribute_with_its_type() {
    let slices = build_pool(
        &inv(&["h100-80gb:8"], None),
        &SliceOptions::new("node-a"),
        &TaintMap::new(),
    );
    assert_eq!(slices.len(), 1);
    let devices = all_devices(&slices);
    assert_eq!(devices.len(), 8);
    let d = devices[0];
    assert_eq!(d.name, "gpu-0");
    assert_eq!(attr(d, "type").string.as_deref(), Some("gpu"));
    assert!(attr(d, "uuid").string.as_ref().unwrap().starts_with("GPU-"));
    assert_eq!(
        attr(d, "productName").string.as_deref(),
        Some("NVIDIA H100 80GB HBM3")
    );
    assert_eq!(attr(d, "brand").string.as_deref(), Some("NVIDIA"));
    assert_eq!(attr(d, "architecture").string.as_deref(), Some("Hopper"));
    assert_eq!(
        attr(d, "cudaComputeCapability").version.as_deref(),
        Some("9.0.0")
    );
    assert_eq!(
        attr(d, "driverVersion").version.as_deref(),
        Some("580.105.8")
    );
    assert_eq!(
        attr(d, "cudaDriverVersion").version.as_deref(),
        Some("13.0.0")
    );
    assert_eq!(
        attr(d, "resource.kubernetes.io/pciBusID").string.as_deref(),
        Some("0000:18:00.0")
    );
    assert!(attr(d, "resource.kubernetes.io/pcieRoot").string.is_some());
    assert_eq!(attr(d, "resource.kubernetes.io/numaNode").int, Some(0));
    assert_eq!(attr(d, "addressingMode").string.as_deref(), Some("HMM"));
    assert_eq!(d.capacity.as_ref().unwrap()["memory"].value.0, "81559Mi");
    assert_eq!(
        attr(devices[7], "resource.kubernetes.io/numaNode").int,
        Some(1)
    );
}

#[test]
fn static_mig_gpu_publishes_its_mig_devices_not_itself() {
    let slices = build_pool(
        &inv(&["h100-80gb:2"], Some("all-3g.40gb")),
        &SliceOptions::new("node-a"),
        &TaintMap::new(),
    );
    let devices = all_devices(&slices);
    let names: Vec<_> = devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "gpu-0-mig-3g40gb-9-0",
            "gpu-0-mig-3g40gb-9-4",
            "gpu-1-mig-3g40gb-9-0",
            "gpu-1-mig-3g40gb-9-4"
        ]
    );
    let d = devices[1];
    assert_eq!(attr(d, "type").string.as_deref(), Some("mig"));
    assert_eq!(attr(d, "profile").string.as_deref(), Some("3g.40gb"));
    assert!(attr(d, "uuid").string.as_ref().unwrap().starts_with("MIG-"));
    assert!(
        attr(d, "parentUUID")
            .string
            .as_ref()
            .unwrap()
            .starts_with("GPU-")
    );
    assert_eq!(
        attr(d, "productName").string.as_deref(),
        Some("NVIDIA H100 80GB HBM3")
    );
    let cap = d.capacity.as_ref().unwrap();
    for (k, v) in [
        ("multiprocessors", "60"),
        ("copyEngines", "3"),
        ("decoders", "3"),
        ("encoders", "0"),
        ("jpegEngines", "3"),
        ("ofaEngines", "0"),
        ("memory", "40448Mi"),
    ] {
        assert_eq!(cap[k].value.0, v, "{k}");
    }
    for s in 4..8 {
        assert_eq!(cap[&format!("memorySlice{s}")].value.0, "1");
    }
    assert!(!cap.contains_key("memorySlice0"));
}

#[test]
fn every_device_respects_the_attribute_and_capacity_limit() {
    for (spec, layout, dynamic) in [
        ("h100-80gb:8", Some("all-1g.10gb"), false),
        ("b200:8", None, true),
        ("a100-80gb:8", None, true),
    ] {
        let opts = SliceOptions {
            dynamic_mig: dynamic,
            ..SliceOptions::new("node-a")
        };
        for s in build_pool(&inv(&[spec], layout), &opts, &TaintMap::new()) {
            for d in &s.devices {
                let n = d.attributes.as_ref().map_or(0, |a| a.len())
                    + d.capacity.as_ref().map_or(0, |c| c.len());
                assert!(
                    n <= MAX_ATTRIBUTES_AND_CAPACITIES,
                    "{spec} {} has {n}",
                    d.name
                );
            }
            assert!(
                s.devices.len() <= MAX_DEVICES_WITH_COUNTERS_OR_TAINTS
                    || s.shared_counters.is_empty()
            );
            assert!(s.shared_counters.len() <= MAX_COUNTER_SETS_PER_SLICE);
        }
    }
}

#[test]
fn dynamic_mig_split_layout_has_a_counters_slice_then_one_slice_per_gpu() {
    let opts = SliceOptions {
        dynamic_mig: true,
        ..SliceOptions::new("node-a")
    };
    let slices = build_pool(
        &inv(&["h100-80gb:8", "l4:1"], None),
        &opts,
        &TaintMap::new(),
    );
    assert_eq!(slices.len(), 1 + 8 + 1);
    assert!(slices[0].devices.is_empty());
    assert_eq!(slices[0].shared_counters.len(), 8);
    let set = &slices[0].shared_counters[0];
    assert_eq!(set.name, "gpu-0-counter-set");
    let keys: Vec<_> = set.counters.keys().map(String::as_str).collect();
    for k in [
        "multiprocessors",
        "copy-engines",
        "decoders",
        "encoders",
        "jpeg-engines",
        "ofa-engines",
        "memory",
        "memory-slice-0",
        "memory-slice-7",
    ] {
        assert!(keys.contains(&k), "{k} missing from {keys:?}");
    }
    let gpu0 = &slices[1];
    assert!(gpu0.shared_counters.is_empty());
    // Whole GPU + 7+7+4+3+2+1+1 placements.
    assert_eq!(gpu0.devices.len(), 26);
    let full = gpu0.devices.iter().find(|d| d.name == "gpu-0").unwrap();
    assert_eq!(
        full.consumes_counters.as_ref().unwrap()[0].counters,
        set.counters,
        "the whole GPU takes everything"
    );
    let mig = gpu0
        .devices
        .iter()
        .find(|d| d.name == "gpu-0-mig-3g40gb-9-4")
        .unwrap();
    assert!(
        mig.attributes.as_ref().unwrap().get("uuid").is_none(),
        "not created yet"
    );
    let used = &mig.consumes_counters.as_ref().unwrap()[0];
    assert_eq!(used.counter_set, "gpu-0-counter-set");
    let slices_used: Vec<_> = used
        .counters
        .keys()
        .filter(|k| k.starts_with("memory-slice-"))
        .cloned()
        .collect();
    assert_eq!(
        slices_used,
        [
            "memory-slice-4",
            "memory-slice-5",
            "memory-slice-6",
            "memory-slice-7"
        ]
    );
    assert!(
        gpu0.devices
            .iter()
            .any(|d| d.name == "gpu-0-mig-1g10gb-me-20-6"),
        "+me variants are separate devices"
    );
    // The L4 cannot do MIG: a plain GPU, never an empty slice.
    let l4 = slices.last().unwrap();
    assert_eq!(l4.devices.len(), 1);
    assert!(l4.devices[0].consumes_counters.is_none());
    // Devices sorted by name inside each slice: stable republishing.
    for s in &slices {
        assert!(s.devices.windows(2).all(|w| w[0].name < w[1].name));
    }
}

#[test]
fn dynamic_mig_on_1_34_keeps_counters_with_their_devices() {
    let opts = SliceOptions {
        dynamic_mig: true,
        split_counters: false,
        ..SliceOptions::new("node-a")
    };
    let slices = build_pool(&inv(&["h100-80gb:2"], None), &opts, &TaintMap::new());
    assert_eq!(slices.len(), 2);
    for (i, s) in slices.iter().enumerate() {
        assert_eq!(s.shared_counters.len(), 1);
        assert_eq!(s.shared_counters[0].name, format!("gpu-{i}-counter-set"));
        assert_eq!(s.devices.len(), 26);
    }
}

fn counter_values(
    counters: &BTreeMap<String, k8s_openapi::api::resource::v1::Counter>,
) -> Vec<(&str, &str)> {
    counters
        .iter()
        .map(|(k, v)| (k.as_str(), v.value.0.as_str()))
        .collect()
}

#[test]
fn dynamic_mig_counters_and_whole_gpu_capacity_are_nvidias_profile_maxima() {
    // NVIDIA cmd/gpu-kubelet-plugin/partitions.go + nvlib.go inspectMigProfilesAndPlacements:
    // per capacity the maximum over all profiles, counters named camelCase -> DNS style.
    let opts = SliceOptions {
        dynamic_mig: true,
        ..SliceOptions::new("node-a")
    };
    let pool = build_pool(&inv(&["h100-80gb:1"], None), &opts, &TaintMap::new());
    let set = &pool[0].shared_counters[0];
    let mut want = vec![
        ("copy-engines", "8"),
        ("decoders", "7"),
        ("encoders", "0"),
        ("jpeg-engines", "7"),
        ("memory", "81152Mi"),
    ];
    let slices: Vec<String> = (0..8).map(|i| format!("memory-slice-{i}")).collect();
    want.extend(slices.iter().map(|s| (s.as_str(), "1")));
    want.extend([("multiprocessors", "132"), ("ofa-engines", "1")]);
    want.sort();
    assert_eq!(counter_values(&set.counters), want);
    let whole = pool[1].devices.iter().find(|d| d.name == "gpu-0").unwrap();
    let caps: Vec<_> = whole
        .capacity
        .as_ref()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.as_str(), v.value.0.as_str()))
        .collect();
    assert_eq!(
        caps,
        [
            ("copyEngines", "8"),
            ("decoders", "7"),
            ("encoders", "0"),
            ("jpegEngines", "7"),
            ("memory", "81152Mi"),
            ("multiprocessors", "132"),
            ("ofaEngines", "1"),
        ]
    );
    let me = pool[1]
        .devices
        .iter()
        .find(|d| d.name == "gpu-0-mig-1g10gb-me-20-3")
        .unwrap();
    let used = &me.consumes_counters.as_ref().unwrap()[0].counters;
    assert_eq!(
        counter_values(used),
        [
            ("copy-engines", "1"),
            ("decoders", "1"),
            ("encoders", "0"),
            ("jpeg-engines", "1"),
            ("memory", "9984Mi"),
            ("memory-slice-3", "1"),
            ("multiprocessors", "16"),
            ("ofa-engines", "1"),
        ]
    );
}

#[test]
fn dynamic_mig_on_ampere_offers_placements_only_while_mig_mode_is_on() {
    // NVIDIA cmd/gpu-kubelet-plugin/nvlib.go isDynamicMIGCapable: Ampere cannot toggle MIG mode
    // without a reset; the A100 values are the KEP-4815 table NVIDIA's driver reproduces.
    let opts = SliceOptions {
        dynamic_mig: true,
        ..SliceOptions::new("node-a")
    };
    let mut node = inv(&["a100-40gb:1"], None);
    let off = build_pool(&node, &opts, &TaintMap::new());
    assert_eq!(off.len(), 1);
    assert_eq!(off[0].devices.len(), 1);
    assert_eq!(
        off[0].devices[0].capacity.as_ref().unwrap()["memory"]
            .value
            .0,
        "40Gi"
    );
    assert!(off[0].shared_counters.is_empty());
    node.gpus[0].mig.as_mut().unwrap().enabled = true;
    let on = build_pool(&node, &opts, &TaintMap::new());
    assert_eq!(on.len(), 2);
    let set = &on[0].shared_counters[0];
    assert_eq!(set.counters.len(), 15);
    for (k, v) in [
        ("multiprocessors", "98"),
        ("copy-engines", "7"),
        ("decoders", "5"),
        ("encoders", "0"),
        ("jpeg-engines", "1"),
        ("ofa-engines", "1"),
        ("memory", "40192Mi"),
        ("memory-slice-7", "1"),
    ] {
        assert_eq!(set.counters[k].value.0, v, "{k}");
    }
    assert_eq!(on[1].devices.len(), 25, "every placement, no whole GPU");
    assert!(on[1].devices.iter().all(|d| d.name != "gpu-0"));
}

#[test]
fn many_devices_are_split_within_limits_and_taints_lower_the_limit() {
    let big = inv(&["h100-80gb:64"], Some("all-1g.10gb"));
    let slices = build_pool(&big, &SliceOptions::new("node-a"), &TaintMap::new());
    assert_eq!(all_devices(&slices).len(), 64 * 7);
    assert!(
        slices
            .iter()
            .all(|s| s.devices.len() <= MAX_DEVICES_PER_SLICE)
    );
    assert_eq!(slices.len(), 4);

    let mut taints = TaintMap::new();
    taints.insert(
        "gpu-0".into(),
        vec![DeviceTaint {
            key: "gpu.nvidia.com/xid".into(),
            value: Some("79".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }],
    );
    let slices = build_pool(
        &inv(&["h100-80gb:64", "l4:64"], None),
        &SliceOptions::new("node-a"),
        &taints,
    );
    assert!(
        slices
            .iter()
            .all(|s| s.devices.len() <= MAX_DEVICES_WITH_COUNTERS_OR_TAINTS)
    );
    assert!(slices[0].devices[0].taints.is_some());
}

#[test]
fn resource_slices_carry_pool_bookkeeping_and_sorted_names() {
    let slices = simulated_node_slices("n1", &["h100-80gb:8"], None, true).unwrap();
    assert_eq!(slices.len(), 9);
    for s in &slices {
        assert_eq!(s.spec.driver, "gpu.nvidia.com");
        assert_eq!(s.spec.node_name.as_deref(), Some("n1"));
        assert_eq!(s.spec.pool.name, "n1");
        assert_eq!(s.spec.pool.resource_slice_count, 9);
        assert!(
            s.spec.devices.is_some() != s.spec.shared_counters.is_some(),
            "never both on >= 1.35"
        );
    }
    let names: Vec<_> = slices
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    assert_eq!(names[0], "n1-gpu.nvidia.com-00000");
    assert!(simulated_node_slices("n1", &["nope"], None, false).is_err());
}

#[test]
fn an_empty_node_still_publishes_one_empty_slice() {
    let slices = build_pool(
        &Inventory::default(),
        &SliceOptions::new("node-a"),
        &TaintMap::new(),
    );
    assert_eq!(slices, vec![SliceContent::default()]);
    let rs = to_resource_slices(slices, &SliceOptions::new("node-a"), 3, None);
    assert_eq!(rs[0].spec.devices.as_deref(), Some(&[][..]));
    assert_eq!(rs[0].spec.pool.generation, 3);
}

/// For every MIG-capable model: each placement's consumption fits the GPU's counters; the whole GPU
/// and any placement, or two overlapping placements, can never be allocated together; and every
/// layout the hardware accepts (disjoint memory slices; compute slices, instance limits and the
/// physical media engines respected) fits the counters, so the scheduler never refuses what the
/// GPU could do.
#[test]
fn counters_match_the_hardware_for_every_model_and_placement() {
    use std::collections::BTreeMap as Map;
    let int = |q: &Quantity| crate::quantity::parse_int(&q.0).unwrap();
    let opts = SliceOptions {
        dynamic_mig: true,
        ..SliceOptions::new("node-a")
    };
    for model in crate::profiles::catalog().iter().filter(|m| m.mig_capable) {
        let mut gpu = simulate_node("n", &[GpuGroup::parse(&model.key).unwrap()], None)
            .unwrap()
            .gpus
            .remove(0);
        gpu.mig.as_mut().unwrap().enabled = true; // Ampere publishes placements only then
        let inv = Inventory { gpus: vec![gpu] };
        let pool = build_pool(&inv, &opts, &TaintMap::new());
        let totals: Map<String, u128> = pool[0].shared_counters[0]
            .counters
            .iter()
            .map(|(k, v)| (k.clone(), int(&v.value)))
            .collect();
        let use_of = |d: &Device| -> Map<String, u128> {
            d.consumes_counters.as_ref().unwrap()[0]
                .counters
                .iter()
                .map(|(k, v)| (k.clone(), int(&v.value)))
                .collect()
        };
        let fits = |sets: &[&Map<String, u128>]| {
            totals.iter().all(|(k, total)| {
                sets.iter()
                    .map(|s| s.get(k).copied().unwrap_or(0))
                    .sum::<u128>()
                    <= *total
            })
        };
        let devices: Vec<&Device> = all_devices(&pool);
        let whole = devices.iter().find(|d| d.name == "gpu-0");
        let migs: Vec<(&Device, Map<String, u128>)> = devices
            .iter()
            .filter(|d| d.name != "gpu-0")
            .map(|d| (*d, use_of(d)))
            .collect();
        assert_eq!(
            whole.is_some(),
            model.architecture != "Ampere",
            "{}",
            model.key
        );
        for (d, u) in &migs {
            assert!(fits(&[u]), "{} {}: fits alone", model.key, d.name);
        }
        if let Some(whole) = whole {
            let whole_use = use_of(whole);
            assert!(
                fits(&[&whole_use]),
                "{}: the whole GPU fits alone",
                model.key
            );
            for (d, u) in &migs {
                assert!(
                    !fits(&[u, &whole_use]),
                    "{} {}: never together with the whole GPU",
                    model.key,
                    d.name
                );
            }
        }
        let slices_of = |u: &Map<String, u128>| -> Vec<String> {
            u.keys()
                .filter(|k| k.starts_with("memory-slice-"))
                .cloned()
                .collect()
        };
        for (i, (a, ua)) in migs.iter().enumerate() {
            for (b, ub) in &migs[i + 1..] {
                let overlap = slices_of(ua).iter().any(|s| slices_of(ub).contains(s));
                if overlap {
                    assert!(
                        !fits(&[ua, ub]),
                        "{}: {} and {} overlap but fit the counters",
                        model.key,
                        a.name,
                        b.name
                    );
                }
            }
        }
        // Every hardware-valid layout (depth-first over disjoint placements) fits the counters,
        // except where NVIDIA's per-capacity maxima (the 7g profile's SMs and memory) fall short
        // of six small 1g instances plus a double-memory one: there NVIDIA's scheduler refuses a
        // layout the GPU could hold, and so does ours.
        const SHORT: [&str; 3] = ["H100-NVL-94GB", "B200-180GB", "GB200"];
        let mut misfits = 0;
        let profile_of = |d: &Device| {
            d.attributes.as_ref().unwrap()["profile"]
                .string
                .clone()
                .unwrap()
        };
        fn walk<'a>(
            i: usize,
            migs: &'a [(&Device, Map<String, u128>)],
            chosen: &mut Vec<usize>,
            check: &mut dyn FnMut(&[usize]) -> bool,
            count: &mut usize,
        ) {
            if !check(chosen) {
                return;
            }
            *count += 1;
            for j in i..migs.len() {
                chosen.push(j);
                walk(j + 1, migs, chosen, check, count);
                chosen.pop();
            }
        }
        let mut layouts = 0;
        let mut check = |chosen: &[usize]| -> bool {
            let sets: Vec<&Map<String, u128>> = chosen.iter().map(|&j| &migs[j].1).collect();
            let mut used_slices = Vec::new();
            for s in &sets {
                for sl in slices_of(s) {
                    if used_slices.contains(&sl) {
                        return false; // not a hardware layout: prune
                    }
                    used_slices.push(sl);
                }
            }
            let compute: u32 = chosen
                .iter()
                .map(|&j| {
                    model
                        .profile(&profile_of(migs[j].0))
                        .unwrap()
                        .compute_slices
                })
                .sum();
            if compute > model.compute_slices {
                return false;
            }
            for p in &model.profiles {
                let n = chosen
                    .iter()
                    .filter(|&&j| profile_of(migs[j].0) == p.name)
                    .count();
                if n > p.max_instances as usize {
                    return false;
                }
            }
            // Media engines are physical and shared (as the simulated hardware models them).
            use crate::profiles::MediaEngines;
            let media = chosen.iter().fold(MediaEngines::default(), |sum, &j| {
                sum.plus(MediaEngines::of(
                    model.profile(&profile_of(migs[j].0)).unwrap(),
                ))
            });
            if media
                .short_of(MediaEngines::of_gpu(&model.profiles))
                .is_some()
            {
                return false;
            }
            if !fits(&sets) {
                assert!(
                    SHORT.contains(&model.key.as_str()),
                    "{}: a valid layout {:?} does not fit the counters",
                    model.key,
                    chosen.iter().map(|&j| &migs[j].0.name).collect::<Vec<_>>()
                );
                misfits += 1;
            }
            true
        };
        walk(0, &migs, &mut Vec::new(), &mut check, &mut layouts);
        assert_eq!(
            misfits > 0,
            SHORT.contains(&model.key.as_str()),
            "{}: SHORT is up to date",
            model.key
        );
        assert!(
            layouts > migs.len(),
            "{}: {layouts} layouts checked",
            model.key
        );
    }
}

#[test]
fn counter_names_are_capacity_names_in_dns_style() {
    // NVIDIA cmd/gpu-kubelet-plugin/mig.go camelToDNSName.
    use super::partitions::camel_to_dns;
    for (camel, dns) in [
        ("copyEngines", "copy-engines"),
        ("jpegEngines", "jpeg-engines"),
        ("ofaEngines", "ofa-engines"),
        ("multiprocessors", "multiprocessors"),
        ("HTTPServer", "http-server"),
        ("gpu2Slice", "gpu2-slice"),
    ] {
        assert_eq!(camel_to_dns(camel), dns);
    }
    assert_eq!(counter_set_name(3), "gpu-3-counter-set");
}
