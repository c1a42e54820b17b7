//! Each input below is accepted or refused exactly as NVIDIA's driver (v0.5) accepts or refuses it;
//! refusals must name the offending field.
//! One file over 600 lines on purpose: one table of inputs per config kind, in NVIDIA's order.
use serde_json::{Value, json};

use super::*;

fn gates(s: &str) -> FeatureGates {
    FeatureGates::parse(s).unwrap()
}

const ALL: &str = "TimeSlicingSettings=true,MPSSupport=true";

fn cfg(kind: &str, body: Value) -> Value {
    let mut v = json!({"apiVersion": API_VERSION, "kind": kind});
    for (k, x) in body.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

fn decode(kind: &str, body: Value) -> Result<OpaqueConfig> {
    OpaqueConfig::decode(&cfg(kind, body), "p")
}

/// Decoded and applied to a device of its kind with `g` gates.
fn effective(kind: &str, body: Value, g: &str) -> Result<DeviceConfig> {
    decode(kind, body)?.device_config(&gates(g), "p")
}

#[track_caller]
fn refused_at<T: std::fmt::Debug>(r: Result<T>, want: &str) -> String {
    match r {
        Err(Error::Config { path, reason }) => {
            assert_eq!(path, want, "{reason}");
            reason
        }
        other => panic!("want a refusal at {want}, got {other:?}"),
    }
}

#[test]
fn decodes_each_kind() {
    assert!(matches!(
        decode("GpuConfig", json!({"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}})).unwrap(),
        OpaqueConfig::Gpu(_)
    ));
    assert!(matches!(
        decode("MigDeviceConfig", json!({})).unwrap(),
        OpaqueConfig::Mig(_)
    ));
    assert!(matches!(
        decode(
            "VfioDeviceConfig",
            json!({"iommu": {"backendPolicy": "PreferIommuFD"}})
        )
        .unwrap(),
        OpaqueConfig::Vfio(_)
    ));
    assert_eq!(
        decode(
            "ComputeDomainChannelConfig",
            json!({"domainID": "d", "allocationMode": "All"})
        )
        .unwrap()
        .compute_domain_kind(),
        Some(ComputeDomainDeviceKind::Channel)
    );
    assert_eq!(
        decode("ComputeDomainDaemonConfig", json!({"domainID": "d"}))
            .unwrap()
            .compute_domain_kind(),
        Some(ComputeDomainDeviceKind::Daemon)
    );
}

#[test]
fn api_version_and_kind_are_required_and_exact() {
    let at = |v: Value, path: &str| refused_at(OpaqueConfig::decode(&v, "p"), path);
    at(json!({"kind": "GpuConfig"}), "p.apiVersion");
    at(
        json!({"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"}),
        "p.apiVersion",
    );
    at(
        json!({"apiVersion": "resource.nvidia.com/v1beta1 ", "kind": "GpuConfig"}),
        "p.apiVersion",
    );
    at(
        json!({"apiVersion": 1, "kind": "GpuConfig"}),
        "p.apiVersion",
    );
    at(json!({"apiVersion": API_VERSION}), "p.kind");
    at(json!({"apiVersion": API_VERSION, "kind": 3}), "p.kind");
    at(
        json!({"apiVersion": API_VERSION, "kind": "gpuconfig"}),
        "p.kind",
    );
    at(
        json!({"apiVersion": API_VERSION, "kind": "TpuConfig"}),
        "p.kind",
    );
    let why = at(
        json!({"apiVersion": API_VERSION, "kind": "ComputeDomain"}),
        "p.kind",
    );
    assert!(why.contains("not a device configuration"), "{why}");
    at(json!([1]), "p");
    // Field names are case-sensitive, so another spelling of apiVersion is an unknown field.
    at(
        json!({"apiVersion": API_VERSION, "APIVersion": API_VERSION, "kind": "GpuConfig"}),
        "p.APIVersion",
    );
}

#[test]
fn unknown_and_miscased_fields_are_refused_with_their_path() {
    let cases = [
        ("GpuConfig", json!({"sharng": {}}), "p.sharng"),
        ("GpuConfig", json!({"Sharing": {}}), "p.Sharing"),
        (
            "GpuConfig",
            json!({"metadata": {"name": "x"}}),
            "p.metadata",
        ),
        (
            "GpuConfig",
            json!({"sharing": {"Strategy": "MPS"}}),
            "p.sharing.Strategy",
        ),
        (
            "GpuConfig",
            json!({"sharing": {"strategy": "MPS", "mpsConfig": {"bogus": 1}}}),
            "p.sharing.mpsConfig.bogus",
        ),
        (
            "GpuConfig",
            json!({"sharing": {"strategy": "MPS", "mpsconfig": {}}}),
            "p.sharing.mpsconfig",
        ),
        (
            "GpuConfig",
            json!({"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"Interval": "Short"}}}),
            "p.sharing.timeSlicingConfig.Interval",
        ),
        // A MIG device's sharing has no timeSlicingConfig at all.
        (
            "MigDeviceConfig",
            json!({"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}}),
            "p.sharing.timeSlicingConfig",
        ),
        (
            "VfioDeviceConfig",
            json!({"iommu": {"enableApiDevice": true}}),
            "p.iommu.enableApiDevice",
        ),
        ("VfioDeviceConfig", json!({"Iommu": {}}), "p.Iommu"),
        (
            "ComputeDomainChannelConfig",
            json!({"domainId": "d"}),
            "p.domainId",
        ),
        (
            "ComputeDomainDaemonConfig",
            json!({"domainID": "d", "allocationMode": "All"}),
            "p.allocationMode",
        ),
    ];
    for (kind, body, path) in cases {
        let why = refused_at(decode(kind, body.clone()), path);
        let field = path.rsplit('.').next().unwrap();
        assert!(why.contains(field), "{kind} {body}: {why}");
    }
}

#[test]
fn wrong_json_types_are_refused_with_their_path() {
    let cases = [
        ("GpuConfig", json!({"sharing": "MPS"}), "p.sharing"),
        (
            "GpuConfig",
            json!({"sharing": {"strategy": 1}}),
            "p.sharing.strategy",
        ),
        (
            "GpuConfig",
            json!({"sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50.0}}}),
            "p.sharing.mpsConfig.defaultActiveThreadPercentage",
        ),
        (
            "GpuConfig",
            json!({"sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 5e1}}}),
            "p.sharing.mpsConfig.defaultActiveThreadPercentage",
        ),
        (
            "GpuConfig",
            json!({"sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": "50"}}}),
            "p.sharing.mpsConfig.defaultActiveThreadPercentage",
        ),
        (
            "GpuConfig",
            json!({"sharing": {"strategy": "MPS", "mpsConfig": {"multiUser": "true"}}}),
            "p.sharing.mpsConfig.multiUser",
        ),
        (
            "GpuConfig",
            json!({"sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": true}}}),
            "p.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
        ),
        (
            "GpuConfig",
            json!({"sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "10 Gi"}}}),
            "p.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
        ),
        (
            "GpuConfig",
            json!({"sharing": {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "lots"}}}}),
            "p.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.0",
        ),
        (
            "VfioDeviceConfig",
            json!({"iommu": {"enableAPIDevice": "true"}}),
            "p.iommu.enableAPIDevice",
        ),
        (
            "ComputeDomainChannelConfig",
            json!({"domainID": 7}),
            "p.domainID",
        ),
        (
            "ComputeDomainChannelConfig",
            json!({"domainID": "d", "allocationMode": true}),
            "p.allocationMode",
        ),
    ];
    for (kind, body, path) in cases {
        refused_at(decode(kind, body), path);
    }
}

#[test]
fn enable_api_device_takes_nvidias_spelling() {
    let on = "PassthroughSupport=true";
    let c = effective(
        "VfioDeviceConfig",
        json!({"iommu": {"enableAPIDevice": true}}),
        on,
    )
    .unwrap();
    let DeviceConfig::Vfio(v) = c else {
        panic!("{c:?}")
    };
    let iommu = v.iommu.unwrap();
    assert_eq!(iommu.enable_api_device, Some(true));
    assert_eq!(iommu.backend_policy, Some(IommuBackendPolicy::LegacyOnly));
    // It serializes under the same name (the checkpoint form).
    let s = serde_json::to_value(&IommuConfig {
        backend_policy: None,
        enable_api_device: Some(true),
    })
    .unwrap();
    assert_eq!(s, json!({"enableAPIDevice": true}));
}

#[test]
fn vfio_backend_policy_defaults_and_exact_spellings() {
    let on = "PassthroughSupport=true";
    let policy = |body: Value| match effective("VfioDeviceConfig", body, on) {
        Ok(DeviceConfig::Vfio(v)) => Ok(v.iommu.unwrap().backend_policy.unwrap()),
        Ok(other) => panic!("{other:?}"),
        Err(e) => Err(e),
    };
    assert_eq!(policy(json!({})).unwrap(), IommuBackendPolicy::LegacyOnly);
    assert_eq!(
        policy(json!({"iommu": null})).unwrap(),
        IommuBackendPolicy::LegacyOnly
    );
    assert_eq!(
        policy(json!({"iommu": {"backendPolicy": ""}})).unwrap(),
        IommuBackendPolicy::LegacyOnly
    );
    assert_eq!(
        policy(json!({"iommu": {"backendPolicy": null}})).unwrap(),
        IommuBackendPolicy::LegacyOnly
    );
    assert_eq!(
        policy(json!({"iommu": {"backendPolicy": "PreferIommuFD"}})).unwrap(),
        IommuBackendPolicy::PreferIommuFD
    );
    for bad in ["preferiommufd", "PreferIOMMUFD", "Legacy"] {
        // Decodes (a string), refused once applied.
        decode("VfioDeviceConfig", json!({"iommu": {"backendPolicy": bad}})).unwrap();
        refused_at(
            policy(json!({"iommu": {"backendPolicy": bad}})),
            "p.iommu.backendPolicy",
        );
    }
}

#[test]
fn quantities_take_json_numbers_like_resource_quantity() {
    let mps = |m: Value| {
        effective(
            "GpuConfig",
            json!({"sharing": {"strategy": "MPS", "mpsConfig": m}}),
            ALL,
        )
        .map(|c| c.sharing().unwrap().mps_config.clone().unwrap())
    };
    let m = mps(json!({
        "defaultPinnedDeviceMemoryLimit": 1073741824,
        "defaultPerDevicePinnedMemoryLimit": {"0": 2147483648u64, "GPU-x": 1.5e9, "1": "  512Mi "}
    }))
    .unwrap();
    assert_eq!(
        m.default_pinned_device_memory_limit.as_deref(),
        Some("1073741824")
    );
    let per = m.default_per_device_pinned_memory_limit.unwrap();
    assert_eq!(per["0"], "2147483648");
    assert_eq!(
        crate::quantity::parse_int(&per["GPU-x"]).unwrap(),
        1_500_000_000
    );
    assert_eq!(per["1"], "512Mi");
    // Quantity forms Kubernetes accepts.
    for q in [
        "1Gi", "+1Gi", "1.5Gi", "1e9", "1E9", "2048Ki", "1.Gi", "1048576",
    ] {
        mps(json!({"defaultPinnedDeviceMemoryLimit": q})).unwrap();
    }
}

#[test]
fn quantities_below_one_mib_are_refused_when_applied() {
    let body = |m: Value| json!({"sharing": {"strategy": "MPS", "mpsConfig": m}});
    for (m, path) in [
        (
            json!({"defaultPinnedDeviceMemoryLimit": "10Ki"}),
            "p.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
        ),
        (
            json!({"defaultPinnedDeviceMemoryLimit": 1048575}),
            "p.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
        ),
        (
            json!({"defaultPinnedDeviceMemoryLimit": "-1Gi"}),
            "p.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
        ),
        // Kubernetes reads a bare suffix as zero.
        (
            json!({"defaultPinnedDeviceMemoryLimit": "Gi"}),
            "p.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
        ),
        // A null map value is a zero quantity in Go.
        (
            json!({"defaultPerDevicePinnedMemoryLimit": {"0": null}}),
            "p.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[0]",
        ),
    ] {
        decode("GpuConfig", body(m.clone())).unwrap();
        let why = refused_at(effective("GpuConfig", body(m), ALL), path);
        assert!(why.contains("1Mi"), "{why}");
    }
    // 1048575.5 rounds up to a whole MiB, as Quantity.Value() does.
    effective(
        "GpuConfig",
        body(json!({"defaultPinnedDeviceMemoryLimit": "1048575.5"})),
        ALL,
    )
    .unwrap();
    // A null pointer field is simply unset.
    let c = effective(
        "GpuConfig",
        body(json!({"defaultPinnedDeviceMemoryLimit": null, "defaultPerDevicePinnedMemoryLimit": null})),
        ALL,
    )
    .unwrap();
    assert_eq!(c.sharing().unwrap().mps_config, Some(MpsConfig::default()));
}

#[test]
fn strategy_spelling_and_gates() {
    for kind in ["GpuConfig", "MigDeviceConfig"] {
        for bad in ["mps", "Mps", "timeslicing", "Timeslicing", "", "Sometimes"] {
            let body = json!({"sharing": {"strategy": bad}});
            decode(kind, body.clone()).unwrap();
            let why = refused_at(effective(kind, body, ALL), "p.sharing.strategy");
            assert!(why.contains("unknown GPU sharing strategy"), "{why}");
        }
        // `sharing: {}` has an empty strategy; `sharing: null` is no sharing.
        refused_at(
            effective(kind, json!({"sharing": {}}), ALL),
            "p.sharing.strategy",
        );
        refused_at(
            effective(kind, json!({"sharing": {"strategy": null}}), ALL),
            "p.sharing.strategy",
        );
        assert!(
            effective(kind, json!({"sharing": null}), "")
                .unwrap()
                .sharing()
                .is_none()
        );
        let why = refused_at(
            effective(kind, json!({"sharing": {"strategy": "TimeSlicing"}}), ""),
            "p.sharing.strategy",
        );
        assert!(why.contains("TimeSlicingSettings"), "{why}");
        let why = refused_at(
            effective(kind, json!({"sharing": {"strategy": "MPS"}}), ""),
            "p.sharing.strategy",
        );
        assert!(why.contains("MPSSupport"), "{why}");
        effective(
            kind,
            json!({"sharing": {"strategy": "TimeSlicing"}}),
            "TimeSlicingSettings=true",
        )
        .unwrap();
        effective(
            kind,
            json!({"sharing": {"strategy": "MPS"}}),
            "MPSSupport=true",
        )
        .unwrap();
    }
}

#[test]
fn time_slice_intervals() {
    let interval = |tsc: Value| {
        effective(
            "GpuConfig",
            json!({"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": tsc}}),
            ALL,
        )
        .map(|c| {
            c.sharing()
                .unwrap()
                .time_slicing_config
                .as_ref()
                .unwrap()
                .interval
                .unwrap()
        })
    };
    assert_eq!(
        interval(json!({"interval": "Long"})).unwrap(),
        TimeSliceInterval::Long
    );
    assert_eq!(interval(Value::Null).unwrap(), TimeSliceInterval::Default);
    for bad in ["short", "SHORT", "1", "Forever"] {
        refused_at(
            interval(json!({"interval": bad})),
            "p.sharing.timeSlicingConfig.interval",
        );
    }
    // An explicit timeSlicingConfig without an interval: NVIDIA's driver crashes on it; refused.
    refused_at(interval(json!({})), "p.sharing.timeSlicingConfig.interval");
    refused_at(
        interval(json!({"interval": null})),
        "p.sharing.timeSlicingConfig.interval",
    );
    refused_at(
        decode(
            "GpuConfig",
            json!({"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": 1}}}),
        ),
        "p.sharing.timeSlicingConfig.interval",
    );
}

#[test]
fn strategy_and_settings_must_agree_on_whole_gpus() {
    refused_at(
        effective(
            "GpuConfig",
            json!({"sharing": {"strategy": "TimeSlicing", "mpsConfig": {}}}),
            ALL,
        ),
        "p.sharing.mpsConfig",
    );
    refused_at(
        effective(
            "GpuConfig",
            json!({"sharing": {"strategy": "MPS", "timeSlicingConfig": {"interval": "Short"}}}),
            ALL,
        ),
        "p.sharing.timeSlicingConfig",
    );
    // Null settings are unset settings.
    effective(
        "GpuConfig",
        json!({"sharing": {"strategy": "TimeSlicing", "mpsConfig": null}}),
        ALL,
    )
    .unwrap();
}

#[test]
fn time_slicing_on_mig_is_an_accepted_no_op_whatever_it_carries() {
    for body in [
        json!({"sharing": {"strategy": "TimeSlicing"}}),
        // NVIDIA neither reads nor checks a MIG device's mpsConfig under TimeSlicing.
        json!({"sharing": {"strategy": "TimeSlicing", "mpsConfig": {"defaultActiveThreadPercentage": 500}}}),
    ] {
        let c = effective("MigDeviceConfig", body, "TimeSlicingSettings=true").unwrap();
        let s = c.sharing().unwrap();
        assert_eq!(s.strategy, SharingStrategy::TimeSlicing);
        assert_eq!(s.time_slicing_config, None);
        assert_eq!(s.mps_config, None);
    }
}

#[test]
fn active_thread_percentage_range() {
    let p = |v: Value, kind: &str| {
        effective(
            kind,
            json!({"sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": v}}}),
            ALL,
        )
    };
    for kind in ["GpuConfig", "MigDeviceConfig"] {
        for ok in [0, 50, 100] {
            p(json!(ok), kind).unwrap();
        }
        for bad in [-1, 101, 150] {
            decode(
                kind,
                json!({"sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": bad}}}),
            )
            .unwrap();
            refused_at(
                p(json!(bad), kind),
                "p.sharing.mpsConfig.defaultActiveThreadPercentage",
            );
        }
        // Beyond Go's int: a decode error.
        refused_at(
            decode(
                kind,
                json!({"sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": u64::MAX}}}),
            ),
            "p.sharing.mpsConfig.defaultActiveThreadPercentage",
        );
    }
}

#[test]
fn multi_user_is_part_of_nvidias_mps_config() {
    let c = effective(
        "GpuConfig",
        json!({"sharing": {"strategy": "MPS", "mpsConfig": {"multiUser": true}}}),
        ALL,
    )
    .unwrap();
    assert_eq!(
        c.sharing().unwrap().mps_config.as_ref().unwrap().multi_user,
        Some(true)
    );
    effective(
        "MigDeviceConfig",
        json!({"sharing": {"strategy": "MPS", "mpsConfig": {"multiUser": false}}}),
        ALL,
    )
    .unwrap();
}

#[test]
fn compute_domain_configs() {
    let channel = |body: Value| {
        decode("ComputeDomainChannelConfig", body)
            .unwrap()
            .compute_domain_config("p")
    };
    assert_eq!(
        channel(json!({"domainID": "uid-1", "allocationMode": "All"})).unwrap(),
        ComputeDomainConfig::Channel {
            domain_id: "uid-1".into(),
            all_channels: true
        }
    );
    // Only the exact spelling `All` asks for every channel; anything else is one channel, not an
    // error.
    for mode in [
        json!("Single"),
        json!("single"),
        json!("all"),
        json!("ALL"),
        json!(""),
        json!("bogus"),
        Value::Null,
    ] {
        assert_eq!(
            channel(json!({"domainID": "uid-1", "allocationMode": mode})).unwrap(),
            ComputeDomainConfig::Channel {
                domain_id: "uid-1".into(),
                all_channels: false
            },
            "{mode}"
        );
    }
    for body in [
        json!({"domainID": ""}),
        json!({"domainID": null}),
        json!({}),
    ] {
        refused_at(channel(body.clone()), "p.domainID");
        refused_at(
            decode("ComputeDomainDaemonConfig", body)
                .unwrap()
                .compute_domain_config("p"),
            "p.domainID",
        );
    }
    assert_eq!(
        decode("ComputeDomainDaemonConfig", json!({"domainID": "uid-2"}))
            .unwrap()
            .compute_domain_config("p")
            .unwrap(),
        ComputeDomainConfig::Daemon {
            domain_id: "uid-2".into()
        }
    );
}

#[test]
fn configs_of_the_other_driver_are_refused_when_applied() {
    refused_at(
        decode("ComputeDomainChannelConfig", json!({"domainID": "d"}))
            .unwrap()
            .device_config(&gates(ALL), "p"),
        "p.kind",
    );
    refused_at(
        decode("GpuConfig", json!({}))
            .unwrap()
            .compute_domain_config("p"),
        "p.kind",
    );
}

#[test]
fn effective_configs_are_normalized() {
    let a = effective(
        "GpuConfig",
        json!({"sharing": {"strategy": "TimeSlicing"}}),
        ALL,
    )
    .unwrap();
    let b = effective(
        "GpuConfig",
        json!({"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}}),
        ALL,
    )
    .unwrap();
    assert_eq!(a, b);
    let mut c = a.clone();
    c.normalize();
    assert_eq!(a, c, "normalizing again changes nothing");
    let m = effective("GpuConfig", json!({"sharing": {"strategy": "MPS"}}), ALL).unwrap();
    assert_eq!(m.sharing().unwrap().mps_config, Some(MpsConfig::default()));
}
