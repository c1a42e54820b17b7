//! Cases from the upstream `compile_test.go` table (written from its facts) plus library checks.
use super::*;
use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as KQ;
use std::collections::BTreeMap;

pub(super) enum A {
    B(bool),
    I(i64),
    S(&'static str),
    V(&'static str),
}

/// A device both ways: its whole CEL value, and the slice data fused selectors read in place.
pub(super) struct TDev {
    pub(super) driver: String,
    pub(super) attrs: BTreeMap<String, DeviceAttribute>,
    pub(super) caps: BTreeMap<String, DeviceCapacity>,
    pub(super) multi: bool,
    pub(super) value: Result<Value, String>,
}

pub(super) fn dev(driver: &str, attrs: &[(&str, A)], caps: &[(&str, &str)], multi: bool) -> TDev {
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
pub(super) fn run(expr: &str, d: &TDev) -> Result<bool, String> {
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

pub(super) const DRV: &str = "dra.example.com";

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

/// A uint or double index must be exactly an int (cel-go's `IndexOrError` and map lookup): those
/// beyond int64 used to wrap or saturate into one (the map lookup found the key 2^63 - 1). Answers
/// checked against the Go oracle.
#[test]
fn indexes_beyond_int64_are_not_wrapped_into_one() {
    let d = dev("", &[], &[], false);
    let e = run("{9223372036854775807: true}[dyn(1e19)]", &d).unwrap_err();
    assert!(e.contains("no such key"), "{e}");
    for x in ["18446744073709551615u", "1e19", "-1e19", "1.5"] {
        let e = run(&format!("[true][dyn({x})]"), &d).unwrap_err();
        assert!(e.contains("unsupported index value"), "{x}: {e}");
    }
    let e = run("[true][dyn(3u)]", &d).unwrap_err();
    assert!(e.contains("index out of bounds: 3"), "{e}");
    for e in [
        "[true][dyn(0u)]",
        "[true][dyn(0.0)]",
        "{1: true}[dyn(1.0)]",
        "{1u: true}[dyn(1.0)]",
    ] {
        assert_eq!(run(e, &d), Ok(true), "{e}");
    }
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

/// The members of `[]` and `{}` take the type of their first use, as in cel-go's checker.
#[test]
fn empty_literal_members_take_their_first_use() {
    for (expr, err) in [
        (
            "[].map(x, x != 1, x.size() > 0).size() == 0",
            Some("'int.()'"),
        ),
        ("[].all(x, 1.5 < x && x + 1 > 0)", Some("'(double, int)'")),
        ("[].all(x, x < 1.5 && x + 1 > 0)", None),
        ("{}.all(k, k in ['a'] && k.size() > 0)", None),
        ("[].all(x, size(x) > 0 && x != 1)", Some("'(bytes, int)'")),
        (
            "[[]].all(x, x == [1] && x[0] + 'a' == 'b')",
            Some("'(int, string)'"),
        ),
        (
            "cel.bind(v, [], v == [1] && v == ['a'])",
            Some("list(string)"),
        ),
    ] {
        match (compile(expr), err) {
            (Ok(_), None) => {}
            (Err(e), Some(want)) => assert!(e.contains(want), "{expr}: {e}"),
            (r, _) => panic!("{expr}: {:?}", r.err()),
        }
    }
}
