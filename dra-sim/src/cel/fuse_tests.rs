//! Device accesses fused into direct reads (`fuse.rs`) in every spelling, picking what the whole
//! `device` value would hold.
use super::tests::{A, DRV, dev, run};
use super::*;

/// Counts the fused device accesses in a compiled program.
fn fused_nodes(n: &node::Node) -> usize {
    use node::Node as N;
    match n {
        N::DeviceField { .. } | N::DeviceProp(_) => 1,
        N::Select { operand, .. } | N::OptSelect { operand, .. } => fused_nodes(operand),
        N::And(a, b) | N::OrOp(a, b) => fused_nodes(a) + fused_nodes(b),
        N::Cond(c, a, b) => fused_nodes(c) + fused_nodes(a) + fused_nodes(b),
        N::Call { args, .. } => args.iter().map(fused_nodes).sum(),
        N::Bind { init, body, .. } => fused_nodes(init) + fused_nodes(body),
        N::RegexCall { target, .. } => fused_nodes(target),
        _ => 0,
    }
}

#[test]
fn device_accesses_are_fused_in_every_spelling() {
    for (expr, fused) in [
        (r#"device.driver == "x""#, 1),
        (r#"device.allowMultipleAllocations"#, 1),
        (r#"device.attributes["dra.example.com"].name"#, 1),
        (r#"device.attributes["dra.example.com"]["name"]"#, 1),
        (r#"device.attributes.example.name"#, 1),
        (
            r#"device.attributes["dra.example.com"].?name.orValue(false)"#,
            1,
        ),
        (
            r#"device.attributes["dra.example.com"][?"name"].orValue(false)"#,
            1,
        ),
        (r#"has(device.attributes["dra.example.com"].name)"#, 1),
        (
            r#"device.capacity["dra.example.com"].memory.isGreaterThan(quantity("1Gi")) && device.attributes["dra.example.com"].model.startsWith("h")"#,
            2,
        ),
        // the domain map itself, or a computed key: the whole value, not fused
        (
            r#"cel.bind(d, device.attributes["dra.example.com"], d.name)"#,
            0,
        ),
        (r#"device.attributes["dra.example.com"]["na" + "me"]"#, 0),
        (r#""name" in device.attributes["dra.example.com"]"#, 0),
    ] {
        let p = compile(expr).unwrap();
        assert_eq!(fused_nodes(&p.node), fused, "{expr}");
    }
}

#[test]
fn fused_lookups_pick_the_same_attribute_as_the_whole_value() {
    // Both spellings of one key: the whole value keeps the first in name order.
    let d = dev(
        DRV,
        &[
            ("name", A::I(1)),
            ("dra.example.com/name", A::I(2)),
            ("dra.example.com/only", A::S("q")),
            ("dra.example.comx/name", A::I(3)),
            ("a/b/c", A::I(4)),
            ("dra.example.com.sub/name", A::I(5)),
        ],
        &[("memory", "1Gi"), ("dra.example.com/memory", "2Gi")],
        false,
    );
    for expr in [
        r#"device.attributes["dra.example.com"].name == 1"#,
        r#"device.attributes["dra.example.com"].name == 2"#,
        r#"device.attributes["dra.example.com"].only == "q""#,
        r#"device.attributes["dra.example.comx"].name == 3"#,
        r#"device.attributes["a"]["b/c"] == 4"#,
        r#"device.attributes["dra.example.com"]["b/c"] == 4"#,
        r#"device.attributes["dra.example.com.sub"].name == 5"#,
        r#"device.attributes["dra.example.com"].missing == 1"#,
        r#"device.attributes["nowhere.example.com"].name == 1"#,
        r#"device.capacity["dra.example.com"].memory == quantity("1Gi")"#,
        r#"device.capacity["dra.example.com"].memory == quantity("2Gi")"#,
    ] {
        // `run` requires the three ways to agree
        let _ = run(expr, &d);
    }
    // A bad version anywhere fails every selector on the device, as the whole value does.
    let bad = dev(
        DRV,
        &[("v", A::V("not-semver")), ("n", A::I(1))],
        &[],
        false,
    );
    let e = run(r#"device.attributes["dra.example.com"].n == 1"#, &bad).unwrap_err();
    assert!(e.contains("attribute v: parse semantic version"), "{e}");
}
