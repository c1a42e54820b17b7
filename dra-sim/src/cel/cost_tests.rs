//! Runtime costs, case by case as cel-go's cost tracker reports them.
use super::tests::{A, TDev, dev};
use super::*;

/// The runtime cost of `expr` on `d`, the same for the unfused program on the whole value, the
/// fused one on the whole value and the fused one on the slice data.
fn cost(expr: &str, d: &TDev) -> (Result<bool, String>, u64) {
    let value = d.value.as_ref().expect("device converts");
    let raw = RawDevice {
        driver: &d.driver,
        attributes: Some(&d.attrs),
        capacity: Some(&d.caps),
        allow_multiple_allocations: d.multi,
    };
    let fused = compile(expr).expect("compiles");
    let reference = compile_unfused(expr).expect("compiles").eval_cost(value);
    assert_eq!(
        fused.eval_cost(value),
        reference,
        "{expr}: fused, whole value"
    );
    assert_eq!(
        fused.eval_raw_cost(raw),
        reference,
        "{expr}: fused, slice data"
    );
    reference
}

// A table of cases, one per row: long, not complex.
#[test]
fn runtime_costs_are_cel_gos() {
    let d = dev(
        "gpu.example.com",
        &[
            ("model", A::S("h100")),
            ("cores", A::I(8)),
            ("ecc", A::B(true)),
            ("other.example.com/zone", A::S("z1")),
        ],
        &[("memory", "40Gi")],
        false,
    );
    let a = r#"device.attributes["gpu.example.com"]"#;
    // (selector, cel-go's ActualCost, its outcome), measured with the oracle (e2e/oracle)
    let cases: Vec<(String, u64, &str)> = vec![
        // the colleague's examples: constant literals are built when planning, a comprehension
        // charges its loop condition, step and result, `orValue` is no call
        ("['x'].all(x, x.size() == 1)".into(), 7, "true"),
        (
            "optional.of(['x']).orValue([]).size() == 1".into(),
            3,
            "true",
        ),
        // indexing a value made at run time: a relative attribute (1) and the qualifier (1)
        (format!("{a}.model.split('1')[0] == 'h'"), 8, "true"),
        (
            "['a', device.driver][1] == 'gpu.example.com'".into(),
            16,
            "true",
        ),
        // string equality, startsWith, contains and + by length
        ("device.driver == 'gpu.example.com'".into(), 4, "true"),
        ("device.driver.startsWith('gpu.example')".into(), 4, "true"),
        ("device.driver.contains('example.com')".into(), 6, "true"),
        ("device.driver + 'abcdefghij' == ''".into(), 5, "false"),
        // presence tests cost nothing of their own; optional qualifiers only when they find
        (format!("has({a}.model)"), 3, "true"),
        (format!("{a}.?model.orValue('') == 'h100'"), 5, "true"),
        (format!("{a}.?nope.orValue('') == 'h100'"), 3, "false"),
        // both sides of a binary call run after an error and the call is still charged
        (
            "url('http://a b/') == url('https://example.com')".into(),
            5,
            "error",
        ),
        // a ternary's attribute branch (filter's `accu`) is not observed
        (
            "[1, 2].map(x, x * 2).filter(x, x > 2) == [4]".into(),
            48,
            "true",
        ),
        (
            format!("{a}.cores > 4 ? {a}.model : 'x' == 'y'"),
            8,
            "error",
        ),
        // a literal pattern's call is priced unless its target failed
        (format!("{a}.model.matches('^[a-z]+[0-9]+$')"), 8, "true"),
        (format!("{a}.nope.matches('^[a-z]+[0-9]+$')"), 4, "error"),
        // the Kubernetes estimator prices `check` at 350,000 even when it cannot run
        (
            "dyn('x').check('get').error() != 'x' || true".into(),
            350_002,
            "true",
        ),
        ("{'a': 1}.a == 1".into(), 3, "true"),
        ("{'a': device.driver}.a == 'x'".into(), 35, "false"),
        // `in` a constant list of scalars is a set lookup
        ("device.driver in ['a', 'b']".into(), 2, "false"),
        ("device.driver in [device.driver]".into(), 15, "true"),
        ("dyn(1) == 1".into(), 1, "true"),
        ("int('5') == 5".into(), 1, "true"),
        (format!("dyn({a}.cores) == 8"), 6, "true"),
        (format!("{a}.model.indexOf('1') == 1"), 5, "true"),
        ("[3, 1, 2].sort() == [1, 2, 3]".into(), 30, "true"),
        ("sets.contains([1, 2], [1])".into(), 3, "true"),
        ("'%s'.format([device.driver]) == ''".into(), 13, "false"),
        (
            "lists.range(1000).map(i, i).size() > 0".into(),
            14_014,
            "true",
        ),
        ("lists.range(3).all(j, true)".into(), 24, "true"),
        (
            "lists.range(3).all(i, lists.range(3).all(j, true))".into(),
            96,
            "true",
        ),
        // the limit is checked after each step: cel-go stops one unit past it
        (
            "lists.range(2000).all(i, lists.range(2000).all(j, true))".into(),
            1_000_001,
            "error",
        ),
        // and nothing absorbs that abort: cel-go panics out of the whole evaluation
        (
            "lists.range(2000).all(i, lists.range(2000).all(j, true)) || true".into(),
            1_000_001,
            "error",
        ),
    ];
    for (expr, want, outcome) in &cases {
        let (r, got) = cost(expr, &d);
        let kind = match &r {
            Ok(b) => b.to_string(),
            Err(_) => "error".to_string(),
        };
        assert_eq!((got, kind.as_str()), (*want, *outcome), "{expr}: {r:?}");
    }
}
