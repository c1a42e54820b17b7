//! Cases from the upstream `compile_test.go` table (written from its facts) plus library checks.
use super::*;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as KQ;

enum A {
    B(bool),
    I(i64),
    S(&'static str),
    V(&'static str),
}

/// A device both ways: its whole CEL value, and the slice data fused selectors read in place.
struct TDev {
    driver: String,
    attrs: BTreeMap<String, DeviceAttribute>,
    caps: BTreeMap<String, DeviceCapacity>,
    multi: bool,
    value: Result<Value, String>,
}

fn dev(driver: &str, attrs: &[(&str, A)], caps: &[(&str, &str)], multi: bool) -> TDev {
    let attrs: BTreeMap<String, DeviceAttribute> = attrs
        .iter()
        .map(|(k, v)| {
            let mut a = DeviceAttribute::default();
            match v {
                A::B(b) => a.bool = Some(*b),
                A::I(i) => a.int = Some(*i),
                A::S(s) => a.string = Some(s.to_string()),
                A::V(s) => a.version = Some(s.to_string()),
            }
            (k.to_string(), a)
        })
        .collect();
    let caps: BTreeMap<String, DeviceCapacity> = caps
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                DeviceCapacity {
                    value: KQ(v.to_string()),
                    ..Default::default()
                },
            )
        })
        .collect();
    let value = device_value(driver, Some(&attrs), Some(&caps), multi);
    TDev {
        driver: driver.to_string(),
        attrs,
        caps,
        multi,
        value,
    }
}

/// Evaluates three ways and requires one answer: the unfused program on the whole value (the
/// reference), the fused program on the whole value, and the fused program on the slice data.
fn run(expr: &str, d: &TDev) -> Result<bool, String> {
    let raw = RawDevice {
        driver: &d.driver,
        attributes: Some(&d.attrs),
        capacity: Some(&d.caps),
        allow_multiple_allocations: d.multi,
    };
    let fused = compile(expr)?;
    let on_raw = device_check(&raw).and_then(|()| fused.eval_raw(raw));
    let Ok(value) = &d.value else {
        assert_eq!(
            &on_raw,
            &d.value.clone().map(|_| false),
            "{expr}: conversion error"
        );
        return on_raw;
    };
    let reference = compile_unfused(expr)?.eval(value);
    assert_eq!(fused.eval(value), reference, "{expr}: fused, whole value");
    assert_eq!(on_raw, reference, "{expr}: fused, slice data");
    reference
}

const DRV: &str = "dra.example.com";

#[test]
fn basics_and_compile_errors() {
    let d = dev("", &[], &[], false);
    assert_eq!(run("true", &d), Ok(true));
    assert_eq!(run("false", &d), Ok(false));
    let e = compile("?!").unwrap_err();
    assert!(e.contains("Syntax error"), "{e}");
    let e = compile("1").unwrap_err();
    assert!(
        e.contains("must evaluate to bool or the unknown type, not int"),
        "{e}"
    );
    let e = compile("device.nope").unwrap_err();
    assert!(e.contains("undefined field 'nope'"), "{e}");
    let e = compile("foo == 1").unwrap_err();
    assert!(e.contains("undeclared reference to 'foo'"), "{e}");
    let e = compile("device.driver + 1 == 'a'").unwrap_err();
    assert!(
        e.contains("found no matching overload for '_+_' applied to '(string, int)'"),
        "{e}"
    );
    let e = compile("[1, 'a'].size() == 2").unwrap_err();
    assert!(e.contains("expected type 'int' but found 'string'"), "{e}");
    let e = compile("'a'.matches('[')").unwrap_err();
    assert!(e.contains("compilation failed"), "{e}");
    assert!(compile("dyn(true)").is_ok());
    assert!(compile("device.attributes").is_err());
}

#[test]
fn lookup_errors_and_domains() {
    let d = dev("", &[], &[], false);
    for e in [
        r#"device.attributes["no-such-domain"].noSuchAttr.isGreaterThan(quantity("0"))"#,
        r#"device.attributes["no-such-domain"]["noSuchAttr"].isGreaterThan(quantity("0"))"#,
    ] {
        let err = run(e, &d).unwrap_err();
        assert!(err.contains("no such key: noSuchAttr"), "{err}");
        assert!(enhance_runtime_error(&err).contains("consider using CEL optional chaining"));
    }
    assert_eq!(
        run(r#""no-such-domain" in device.attributes"#, &d),
        Ok(false)
    );
    let d = dev(DRV, &[("name", A::B(true))], &[], false);
    assert_eq!(
        run(r#""dra.example.com" in device.attributes"#, &d),
        Ok(true)
    );
    assert_eq!(run(r#"device.driver == "dra.example.com""#, &d), Ok(true));
    assert_eq!(
        run(r#"device.attributes["dra.example.com"].name"#, &d),
        Ok(true)
    );
    assert_eq!(
        run(r#"device.attributes["dra.example.com"]["name"]"#, &d),
        Ok(true)
    );
    assert_eq!(
        run(
            r#"cel.bind(dra, device.attributes["dra.example.com"], dra.name)"#,
            &d
        ),
        Ok(true)
    );
    let d = dev(DRV, &[("other.example.com/name", A::B(true))], &[], false);
    assert_eq!(
        run(r#"device.attributes["other.example.com"].name"#, &d),
        Ok(true)
    );
    assert_eq!(
        run(
            r#"device.attributes["dra.example.com"].?name.orValue(false) == false"#,
            &d
        ),
        Ok(true)
    );
    assert_eq!(
        run(r#"has(device.attributes["other.example.com"].name)"#, &d),
        Ok(true)
    );
    assert_eq!(
        run(r#"has(device.attributes["other.example.com"].nope)"#, &d),
        Ok(false)
    );
}

#[test]
fn scalar_types_and_macros() {
    let d = dev(DRV, &[("name", A::I(1))], &[], false);
    assert_eq!(
        run(r#"device.attributes["dra.example.com"].name > 0"#, &d),
        Ok(true)
    );
    let err = run(
        r#"device.attributes["dra.example.com"].name.exists(x, x > 0)"#,
        &d,
    )
    .unwrap_err();
    assert!(
        err.contains("got 'types.Int', expected iterable type"),
        "{err}"
    );
    let d = dev(DRV, &[("name", A::B(true))], &[], false);
    let err = run(
        r#"device.attributes["dra.example.com"].name.exists(x, x == true)"#,
        &d,
    )
    .unwrap_err();
    assert!(
        err.contains("got 'types.Bool', expected iterable type"),
        "{err}"
    );
    let d = dev(DRV, &[("name", A::S("fish"))], &[], false);
    assert_eq!(
        run(r#"device.attributes["dra.example.com"].name == "fish""#, &d),
        Ok(true)
    );
    let err = run(
        r#"device.attributes["dra.example.com"].name.exists(x, x == "fish")"#,
        &d,
    )
    .unwrap_err();
    assert!(
        err.contains("got 'types.String', expected iterable type"),
        "{err}"
    );
    let d = dev(DRV, &[("name", A::V("1.0.0"))], &[], false);
    assert_eq!(
        run(
            r#"device.attributes["dra.example.com"].name.isGreaterThan(semver("0.0.1"))"#,
            &d
        ),
        Ok(true)
    );
    assert_eq!(
        run(
            r#"device.attributes["dra.example.com"].name.isGreaterThan(semver("v0.0.1", true)) && isSemver("v1.0.0", true)"#,
            &d
        ),
        Ok(true)
    );
    let err = run(
        r#"device.attributes["dra.example.com"].name.exists(x, x.isGreaterThan(semver("0.0.1")))"#,
        &d,
    )
    .unwrap_err();
    assert!(
        err.contains("got 'cel.Semver', expected iterable type"),
        "{err}"
    );
    // a version attribute compared with a string is a runtime error, not false
    assert!(
        run(
            r#"device.attributes["dra.example.com"].name == "1.0.0""#,
            &d
        )
        .is_err()
    );
}

#[test]
fn capacity_and_composites() {
    let d = dev(DRV, &[], &[("name", "1Mi")], false);
    assert_eq!(
        run(
            r#"device.capacity["dra.example.com"].name.isGreaterThan(quantity("1Ki"))"#,
            &d
        ),
        Ok(true)
    );
    assert_eq!(
        run(
            r#""name" in device.capacity["dra.example.com"] && device.capacity["dra.example.com"].name.isGreaterThan(quantity("1Ki"))"#,
            &d
        ),
        Ok(true)
    );
    let d0 = dev(DRV, &[], &[], false);
    assert_eq!(
        run(
            r#"!("name" in device.capacity["dra.example.com"]) || device.capacity["dra.example.com"].name.isGreaterThan(quantity("1Ki"))"#,
            &d0
        ),
        Ok(true)
    );
    let all = r#"
device.capacity["dra.example.com"].quantity.isGreaterThan(quantity("1Ki")) &&
device.attributes["dra.example.com"].bool &&
device.attributes["dra.example.com"].int > 0 &&
device.attributes["dra.example.com"].string == "fish" &&
device.attributes["dra.example.com"].version.isGreaterThan(semver("0.0.1")) &&
device.capacity["dra.example.com"]["quantity"].isGreaterThan(quantity("1Ki")) &&
device.attributes["dra.example.com"]["bool"] &&
device.attributes["dra.example.com"]["int"] > 0 &&
device.attributes["dra.example.com"]["string"] == "fish" &&
device.attributes["dra.example.com"]["version"].isGreaterThan(semver("0.0.1"))
"#;
    let d = dev(
        DRV,
        &[
            ("bool", A::B(true)),
            ("int", A::I(1)),
            ("string", A::S("fish")),
            ("version", A::V("1.0.0")),
        ],
        &[("quantity", "1Mi")],
        false,
    );
    assert_eq!(run(all, &d), Ok(true));
    let d = dev(
        DRV,
        &[("a", A::B(true)), ("b", A::B(true)), ("c", A::B(true))],
        &[],
        false,
    );
    assert_eq!(
        run(
            r#"device.attributes["dra.example.com"].a && device.attributes["dra.example.com"].b && device.attributes["dra.example.com"].c"#,
            &d
        ),
        Ok(true)
    );
}

#[test]
fn map_iteration_strings_regex() {
    let d = dev(
        DRV,
        &[("services", A::S("some_example_sym"))],
        &[("memory", "1Gi")],
        false,
    );
    assert_eq!(
        run(
            r#"device.attributes.exists_one(x, x == "dra.example.com")"#,
            &d
        ),
        Ok(true)
    );
    assert_eq!(
        run(
            r#"device.attributes["dra.example.com"].exists_one(x, x == "services")"#,
            &d
        ),
        Ok(true)
    );
    assert_eq!(
        run(
            r#"device.attributes["dra.example.com"].services.split("example").size() >= 2"#,
            &d
        ),
        Ok(true)
    );
    assert_eq!(
        run(
            r#"device.attributes["dra.example.com"].services.matches("[^a]?sym")"#,
            &d
        ),
        Ok(true)
    );
    assert_eq!(
        run(
            r#"device.capacity.exists_one(x, x == "dra.example.com")"#,
            &d
        ),
        Ok(true)
    );
    assert_eq!(
        run(
            r#"device.capacity["dra.example.com"].exists_one(x, x == "memory")"#,
            &d
        ),
        Ok(true)
    );
    assert_eq!(
        run(
            r#"device.attributes["dra.example.com"].all(k, v, k == "services" && v.startsWith("some"))"#,
            &d
        ),
        Ok(true)
    );
}

#[test]
fn cost_limit() {
    let d = dev("", &[], &[], false);
    let e = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(x, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(y, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z2, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z3, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z4, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z5, int('1'.find('[0-9]*')) < 100)))))))";
    let err = run(e, &d).unwrap_err();
    assert!(err.contains("actual cost limit exceeded"), "{err}");
}

#[test]
fn allow_multiple_allocations() {
    assert_eq!(
        run(
            "device.allowMultipleAllocations == true",
            &dev("", &[], &[], true)
        ),
        Ok(true)
    );
    assert_eq!(
        run(
            "device.allowMultipleAllocations == false",
            &dev("", &[], &[], false)
        ),
        Ok(true)
    );
}

#[test]
fn libraries() {
    let d = dev("", &[], &[], false);
    let t = |e: &str| assert_eq!(run(e, &d), Ok(true), "{e}");
    t(
        "quantity('1.5Gi').isGreaterThan(quantity('1Gi')) && quantity('1Gi').compareTo(quantity('1024Mi')) == 0",
    );
    t("quantity('1').add(2) == quantity('3') && quantity('5').sub(quantity('2')).asInteger() == 3");
    t(
        "!quantity('1.5').isInteger() && sign(quantity('-2')) == -1 && quantity('500m').asApproximateFloat() == 0.5",
    );
    t("isQuantity('1Ki') && !isQuantity('1KB')");
    t(
        "semver('1.2.3').major() == 1 && semver('1.2.3').minor() == 2 && semver('1.2.3').patch() == 3",
    );
    t(
        "semver('1.0.0-rc.1').isLessThan(semver('1.0.0')) && !isSemver('v1.0.0') && isSemver('v1', true)",
    );
    t("'hello'.charAt(1) == 'e' && 'hello'.indexOf('l') == 2 && 'hello'.lastIndexOf('l') == 3");
    t(
        "'Hello'.lowerAscii() == 'hello' && 'a,b,c'.split(',') == ['a', 'b', 'c'] && ' x '.trim() == 'x'",
    );
    t(
        "'hello'.substring(1, 3) == 'el' && ['a', 'b'].join('-') == 'a-b' && 'aaa'.replace('a', 'b', 2) == 'bba'",
    );
    t("'abc123'.find('[0-9]+') == '123' && 'a1b2'.findAll('[0-9]') == ['1', '2']");
    t("[1, 2, 3].isSorted() && [1, 2, 3].sum() == 6 && [3, 1].min() == 1 && [3, 1].max() == 3");
    t(
        "[1, 2, 3].slice(1, 3) == [2, 3] && [[1], [2]].flatten() == [1, 2] && [1, 1, 2].distinct() == [1, 2]",
    );
    t("lists.range(3) == [0, 1, 2] && [1, 2].reverse() == [2, 1] && [2, 1].sort() == [1, 2]");
    t("[1, 2].first().value() == 1 && !([].first().hasValue())");
    t(
        "sets.contains([1, 2], [1]) && sets.equivalent([1, 2], [2, 1]) && sets.intersects([1], [1, 3])",
    );
    t(
        "optional.of(1).orValue(2) == 1 && optional.none().orValue(2) == 2 && {'a': 1}[?'b'].orValue(3) == 3",
    );
    t(
        "[1, 2].map(x, x * 2) == [2, 4] && [1, 2, 3].filter(x, x > 1).size() == 2 && [1, 2].exists_one(x, x == 2)",
    );
    t("1 < 1.5 && 2u > 1 && 1 == 1 && (1 / 0 == 1 || true) && (false && 1 / 0 == 1) == false");
    t("{'a': 1}.exists(k, v, v == 1) && [5, 6].all(i, v, v - i == 5 || v - i == 5)");
    assert!(
        run("1 / 0 == 1", &d)
            .unwrap_err()
            .contains("division by zero")
    );
    assert!(
        run("9223372036854775807 + 1 > 0", &d)
            .unwrap_err()
            .contains("overflow")
    );
}

/// Equality of a Kubernetes type with another type behind `dyn` fails, but `!=` answers true
/// (cel-go's "equality did not answer true"), and inside lists and maps such a member counts as
/// equal; inside optionals the error passes on. Answers checked against the Go oracle.
#[test]
fn equality_errors_of_kubernetes_types() {
    let d = dev("", &[], &[], false);
    for e in [
        "ip('1.2.3.4') != dyn(1)",
        "cidr('10.0.0.0/8') != dyn(1)",
        "url('/x') != dyn(1)",
        "quantity('1') != dyn('1')",
        "semver('1.0.0') != dyn(1)",
        "format.uri() != dyn(1)",
        "[ip('1.2.3.4')] == [dyn(1)]",
        "!([format.uri()] != [dyn(1)])",
        "{'a': ip('1.2.3.4')} == {'a': dyn(1)}",
        "optional.of(ip('1.2.3.4')) != optional.of(dyn(1))",
        "!([dyn(1)] == [ip('1.2.3.4')])",
    ] {
        assert_eq!(run(e, &d), Ok(true), "{e}");
    }
    for e in [
        "dyn(ip('1.2.3.4')) == 1",
        "dyn(format.uri()) == 1",
        "optional.of(ip('1.2.3.4')) == optional.of(dyn(1))",
    ] {
        assert_eq!(run(e, &d), Err("no such overload".into()), "{e}");
    }
}

/// Counts the fused device accesses in a compiled program.
fn fused_nodes(n: &compile::Node) -> usize {
    use compile::Node as N;
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

/// The authz library is declared, so calls through `dyn` type-check, but the DRA environment has
/// no `authorizer`: no value of its types exists and every such call fails when it runs.
/// Answers and error texts as the Go oracle gave them.
#[test]
fn authz_library_without_an_authorizer() {
    let d = dev("", &[], &[], false);
    assert_eq!(
        run("dyn(1).path('x').check('get').errored() || true", &d),
        Ok(true)
    );
    for expr in [
        "dyn(1).group('g').resource('r').check('get').allowed()",
        "dyn(1).serviceAccount('ns', 'sa').group('').resource('r').subresource('s').namespace('n')\
         .name('x').fieldSelector('a=b').labelSelector('c').check('list').reason() == ''",
        "dyn('x').error() == ''",
        "dyn(1).check('x').allowed()",
    ] {
        let e = run(expr, &d).unwrap_err();
        assert!(e.contains("no such overload"), "{expr}: {e}");
    }
    for (expr, want) in [
        (
            "'x'.group('y') == true",
            "found no matching overload for 'group' applied to 'string.(string)'",
        ),
        (
            "group('x')",
            "found no matching overload for 'group' applied to '(string)'",
        ),
        (
            "dyn(1).group()",
            "found no matching overload for 'group' applied to 'dyn.()'",
        ),
        (
            "dyn(1).check(1)",
            "found no matching overload for 'check' applied to 'dyn.(int)'",
        ),
        (
            "dyn(1).group('x') == true",
            "found no matching overload for '_==_' applied to '(kubernetes.authorization.GroupCheck, bool)'",
        ),
        (
            "dyn(1).path('a').check('get').denied()",
            "undeclared reference to 'denied'",
        ),
        (
            "authorizer.group('y') == true",
            "undeclared reference to 'authorizer'",
        ),
        (
            "dyn(1).path('x').check('get')",
            "must evaluate to bool or the unknown type, not kubernetes.authorization.Decision",
        ),
    ] {
        let e = run(expr, &d).unwrap_err();
        assert!(e.contains(want), "{expr}: {e}");
    }
}

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
