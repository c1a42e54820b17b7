use super::*;

fn err(spec: &str) -> String {
    FeatureGates::parse(spec).unwrap_err().to_string()
}

#[test]
fn defaults_are_nvidias() {
    let g = FeatureGates::default();
    let on: Vec<_> = GATES
        .iter()
        .filter(|x| g.enabled(x.name))
        .map(|x| x.name)
        .collect();
    assert_eq!(
        on,
        [
            "IMEXDaemonsWithDNSNames",
            "ComputeDomainCliques",
            "CrashOnNVLinkFabricErrors",
            "ContextualLogging",
            "LoggingBetaOptions",
        ]
    );
    assert_eq!(
        GATES.len(),
        18,
        "13 driver gates, 3 logging gates, AllAlpha, AllBeta"
    );
    assert_eq!(FeatureGates::parse("").unwrap(), g);
    assert_eq!(FeatureGates::parse(",,").unwrap(), g);
}

#[test]
fn parses_nvidia_gate_strings() {
    let g = FeatureGates::parse("DynamicMIG=true, MPSSupport=false").unwrap();
    assert!(g.dynamic_mig());
    assert!(!g.enabled("MPSSupport"));
    assert!(g.is_set("MPSSupport"));
    assert!(!g.is_set("TimeSlicingSettings"));
    assert!(g.enabled("ComputeDomainCliques"), "defaults kept");
    // The last value for a name wins.
    assert!(
        !FeatureGates::parse("DynamicMIG=true,DynamicMIG=false")
            .unwrap()
            .dynamic_mig()
    );
}

#[test]
fn the_logging_gates_of_a_helm_values_file_are_accepted() {
    let g = FeatureGates::parse(
        "ContextualLogging=true,LoggingAlphaOptions=true,LoggingBetaOptions=false,TimeSlicingSettings=true",
    )
    .unwrap();
    assert!(g.enabled("ContextualLogging"));
    assert!(g.enabled("LoggingAlphaOptions"));
    assert!(!g.enabled("LoggingBetaOptions"));
    assert!(g.enabled("TimeSlicingSettings"));
    assert!(
        !FeatureGates::parse("ContextualLogging=false")
            .unwrap()
            .enabled("ContextualLogging")
    );
}

#[test]
fn values_are_go_booleans() {
    for v in ["1", "t", "T", "true", "TRUE", "True", " true "] {
        assert!(
            FeatureGates::parse(&format!("DynamicMIG={v}"))
                .unwrap()
                .dynamic_mig(),
            "{v}"
        );
    }
    for v in ["0", "f", "F", "false", "FALSE", "False"] {
        assert!(
            !FeatureGates::parse(&format!(
                "ComputeDomainCliques={v},IMEXDaemonsWithDNSNames={v}"
            ))
            .unwrap()
            .enabled("ComputeDomainCliques"),
            "{v}"
        );
    }
    for v in ["yes", "on", "tRuE", "", "2"] {
        let e = err(&format!("DynamicMIG={v}"));
        assert!(e.contains("invalid value of DynamicMIG"), "{v}: {e}");
    }
}

#[test]
fn rejects_unknown_and_malformed_gates() {
    let e = err("DynamicMig=true");
    assert!(
        e.contains("unrecognized feature gate: DynamicMig") && e.contains("DynamicMIG"),
        "{e}"
    );
    // Names are case-sensitive; LoggingStableOptions is declared by Kubernetes but not registered.
    for unknown in ["dynamicmig=true", "LoggingStableOptions=true", "Foo=false"] {
        assert!(
            err(unknown).contains("unrecognized feature gate"),
            "{unknown}"
        );
    }
    assert_eq!(
        err("DynamicMIG"),
        "invalid feature gates: missing bool value for DynamicMIG"
    );
    // Only empty items are skipped: a blank one is malformed, as in component-base.
    assert!(err("DynamicMIG=true, ").contains("missing bool value"));
    // Values are read before names, so a bad value is reported before an unknown name.
    assert!(err("Foo=true,DynamicMIG=yes").contains("invalid value of DynamicMIG"));
}

#[test]
fn all_alpha_and_all_beta_set_every_unnamed_gate_of_their_stage() {
    let g = FeatureGates::parse_unchecked("AllAlpha=true").unwrap();
    for x in GATES.iter().filter(|x| x.origin != Origin::Switch) {
        let want = match x.stage {
            Stage::Alpha => true,
            Stage::Beta => x.default,
        };
        assert_eq!(g.enabled(x.name), want, "{}", x.name);
    }
    assert!(g.is_set("DynamicMIG"));
    // ... which breaks NVIDIA's rules, as it does there.
    assert!(g.check_rules().is_err());
    let g = FeatureGates::parse(
        "AllAlpha=true,DynamicMIG=false,NVMLDeviceHealthCheck=false,PassthroughSupport=true",
    )
    .unwrap();
    assert!(g.enabled("MPSSupport") && g.enabled("DeviceMetadata") && !g.dynamic_mig());

    // AllBeta=false turns off the beta gates, except ContextualLogging, which NVIDIA's binaries
    // set themselves; naming it still works.
    let g = FeatureGates::parse("AllBeta=false").unwrap();
    assert!(!g.enabled("IMEXDaemonsWithDNSNames"));
    assert!(!g.enabled("ComputeDomainCliques"));
    assert!(!g.enabled("CrashOnNVLinkFabricErrors"));
    assert!(!g.enabled("LoggingBetaOptions"));
    assert!(g.enabled("ContextualLogging"));
    assert!(!g.is_set("ContextualLogging"));
    let g =
        FeatureGates::parse("AllBeta=false,ContextualLogging=false,CrashOnNVLinkFabricErrors=true")
            .unwrap();
    assert!(!g.enabled("ContextualLogging"));
    assert!(g.enabled("CrashOnNVLinkFabricErrors"));
}

#[test]
fn each_rule_is_a_startup_error_naming_both_gates() {
    let cases = [
        (
            "DynamicMIG=true,PassthroughSupport=true",
            ["DynamicMIG", "PassthroughSupport"],
        ),
        (
            "DynamicMIG=true,MPSSupport=true",
            ["DynamicMIG", "MPSSupport"],
        ),
        (
            "PassthroughSupport=true,NVMLDeviceHealthCheck=true",
            ["PassthroughSupport", "NVMLDeviceHealthCheck"],
        ),
        (
            "DeviceMetadata=true",
            ["DeviceMetadata", "PassthroughSupport"],
        ),
        // ComputeDomainCliques is on by default, so turning the DNS names off alone breaks it.
        (
            "IMEXDaemonsWithDNSNames=false",
            ["ComputeDomainCliques", "IMEXDaemonsWithDNSNames"],
        ),
    ];
    for (spec, [a, b]) in cases {
        let e = err(spec);
        assert!(e.contains(a) && e.contains(b), "{spec}: {e}");
        assert!(FeatureGates::parse_unchecked(spec).is_ok(), "{spec}");
    }
    let e = err("DynamicMIG=true,PassthroughSupport=true,MPSSupport=true");
    assert!(
        e.contains("DynamicMIG and PassthroughSupport") && e.contains("DynamicMIG and MPSSupport"),
        "every broken rule is reported: {e}"
    );
    // What the rules allow.
    for ok in [
        "DeviceMetadata=true,PassthroughSupport=true",
        "IMEXDaemonsWithDNSNames=false,ComputeDomainCliques=false",
        "DynamicMIG=true,NVMLDeviceHealthCheck=true",
        "DynamicMIG=true,TimeSlicingSettings=true,ConsumableShares=true",
        "MPSSupport=true,NVMLDeviceHealthCheck=true",
        "AllBeta=false",
    ] {
        FeatureGates::parse(ok).unwrap();
    }
}

#[test]
fn gates_without_effect_are_listed_for_the_binaries_they_matter_to() {
    let names = |g: &FeatureGates, c: Component| -> Vec<&str> {
        g.without_effect(c).iter().map(|n| n.gate).collect()
    };
    let d = FeatureGates::default();
    assert!(
        names(&d, Component::GpuPlugin).is_empty(),
        "nothing asked for"
    );
    // Of NVIDIA's default-on compute-domain gates, only the fabric-error one does nothing here.
    assert_eq!(
        names(&d, Component::ComputeDomainPlugin),
        ["CrashOnNVLinkFabricErrors"]
    );
    let g = FeatureGates::parse(
        "PassthroughSupport=true,DRAListTypeAttributes=true,FabricManagerPartitioning=false,\
         ContextualLogging=true,HostManagedIMEXDaemon=true,DynamicMIG=false",
    )
    .unwrap();
    assert_eq!(
        names(&g, Component::GpuPlugin),
        [
            "DRAListTypeAttributes",
            "FabricManagerPartitioning",
            "ContextualLogging"
        ]
    );
    let notice = &g.without_effect(Component::GpuPlugin)[0];
    let text = notice.to_string();
    assert!(
        text.contains("DRAListTypeAttributes=true") && text.contains("no effect here"),
        "{text}"
    );
    assert!(names(&g, Component::ComputeDomainPlugin).contains(&"HostManagedIMEXDaemon"));
    assert!(!names(&g, Component::ComputeDomainPlugin).contains(&"PassthroughSupport"));
}
