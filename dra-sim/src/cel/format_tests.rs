//! ext.Strings `format`. Expected texts and error messages were checked against the Go oracle
//! (cel-go v0.29 with the Kubernetes environment: ext.Strings v2, the first formatter).
use super::*;

fn eval(expr: &str) -> Result<bool, String> {
    let d = device_value("dra.example.com", None, None, false).expect("device");
    compile(expr)?.eval(&d)
}

/// `call` must give `want`: read back through the key of a failed map lookup.
fn out(call: &str, want: &str) {
    let e = eval(&format!("{{'k': 1}}[{call}] == 1"));
    assert_eq!(e, Err(format!("no such key: {want}")), "{call}");
}

fn compile_err(expr: &str, want: &str) {
    match compile(expr) {
        Err(e) => assert!(e.contains(want), "{expr}: {e}"),
        Ok(_) => panic!("{expr}: compiled, want {want:?}"),
    }
}

fn run_err(expr: &str, want: &str) {
    match eval(expr) {
        Err(e) if !e.starts_with("compilation failed") => assert_eq!(e, want, "{expr}"),
        other => panic!("{expr}: {other:?}, want the runtime error {want:?}"),
    }
}

#[test]
fn string_clause_prints_every_type() {
    out(r#""%s|%s|%s|%s".format([1, -2, 3u, true])"#, "1|-2|3|true");
    out(r#""%s %s %s".format(["a", b"xy", null])"#, "a xy null");
    out(
        r#""%s %s".format([type(1), type(ip("1.2.3.4"))])"#,
        "int net.IP",
    );
    out(r#""%s".format([type(optional.none())])"#, "optional_type");
    // doubles as Go's %g
    for (d, s) in [
        ("1.0", "1"),
        ("-0.0", "-0"),
        ("0.1", "0.1"),
        ("1e-5", "1e-05"),
        ("0.0001234", "0.0001234"),
        ("123456.0", "123456"),
        ("1234567.0", "1.234567e+06"),
        ("1e20", "1e+20"),
        ("double('NaN')", "NaN"),
        ("double('Inf')", "+Inf"),
        ("-1.0/0.0", "-Inf"),
    ] {
        out(&format!("'%s'.format([{d}])"), s);
    }
}

#[test]
fn string_clause_lists_and_maps_read_like_literals() {
    out(
        r#""%s".format([[1.5, "a", b"x", null, true, 2u, [], {}]])"#,
        r#"[1.500000, "a", b"x", null, true, 2, [], {}]"#,
    );
    out(
        r#""%s".format([[1.0/0.0, -1.0/0.0, 0.0/0.0, -0.0]])"#,
        r#"["+Inf", "-Inf", "NaN", -0.000000]"#,
    );
    // keys sorted as printed, quotes included
    out(
        r#""%s".format([{-1: 1, 2: 2, 10: 3, "z": 4, true: 5, false: 6, 3u: 7}])"#,
        r#"{"z":4, -1:1, 10:3, 2:2, 3:7, false:6, true:5}"#,
    );
    out(
        r#""%s".format([{"a": {"b": 1.0}, "c": [type(1)]}])"#,
        r#"{"a":{"b":1.000000}, "c":[int]}"#,
    );
    // members are quoted like Go's %q
    out(
        r#""%s".format([["a\"\\\n\t\x01\u00a0é\u200b😀"]])"#,
        r#"["a\"\\\n\t\x01\u00a0é\u200b😀"]"#,
    );
}

#[test]
fn numeric_clauses() {
    out(
        r#""%d %d".format([-9223372036854775807 - 1, 18446744073709551615u])"#,
        "-9223372036854775808 18446744073709551615",
    );
    out(
        r#""%b %b %b %b".format([5, -5, 4u, true])"#,
        "101 -101 100 1",
    );
    out(r#""%o %o".format([30u, -8])"#, "36 -10");
    out(r#""%x %X %x".format([26, -26, 255u])"#, "1a -1A ff");
    out(r#""%x %X %x".format(["hé", b"\xff", ""])"#, "68c3a9 FF ");
    out(r#""%%%s%%".format(["x"])"#, "%x%");
    out(r#""%.3s".format([1])"#, "1");
}

#[test]
fn fixed_point_groups_thousands_and_rounds_half_even() {
    for (call, want) in [
        ("'%f'.format([1234567.891])", "1,234,567.891000"),
        ("'%f'.format([-1234.5])", "-1,234.500000"),
        ("'%f'.format([-0.0])", "0.000000"),
        ("'%f'.format([-0.0000001])", "-0.000000"),
        ("'%.0f'.format([-0.4])", "-0"),
        ("'%.2f'.format([2.675])", "2.67"),
        ("'%.2f'.format([0.125])", "0.12"),
        ("'%.0f'.format([2.5])", "2"),
        ("'%.0f'.format([1.5])", "2"),
        ("'%.3f'.format([999.9996])", "1,000.000"),
        ("'%.30f'.format([0.1])", "0.100000000000000005551115123126"),
        ("'%f'.format([1e20])", "100,000,000,000,000,000,000.000000"),
        (
            "'%f %f %f'.format(['NaN', 'Infinity', '-Infinity'])",
            "NaN ∞ -∞",
        ),
    ] {
        out(call, want);
    }
}

#[test]
fn scientific_takes_precision_as_width() {
    for (call, want) in [
        ("'%e'.format([2.71828])", "2.718280×10⁰⁰"),
        ("'%e'.format([-1e-10])", "-1.000000×10⁻¹⁰"),
        ("'%e'.format([1e100])", "1.000000×10¹⁰⁰"),
        ("'%e'.format([9.9999999])", "1.000000×10⁰¹"),
        ("'%e'.format([-0.0])", "0.000000×10⁰⁰"),
        ("'%.2e'.format([1234567.891])", "1.234568×10⁰⁶"),
        ("'%.20e'.format([1.0])", "       1.000000×10⁰⁰"),
        ("'%e'.format(['NaN'])", "   NaN"),
        ("'%e'.format(['-Infinity'])", "    -∞"),
        ("'%.1e'.format(['Infinity'])", "∞"),
    ] {
        out(call, want);
    }
}

// A table of cases, one per row: long, not complex.
#[test]
fn literal_calls_are_checked_at_compile_time() {
    for (expr, want) in [
        ("'%s %s'.format([1]) == ''", "1:15: index 1 out of range"),
        ("'%s'.format([]) == ''", "index 0 out of range"),
        (
            "'%s'.format([1, 2]) == ''",
            "1:12: too many arguments supplied to string.format (expected 1, got 2)",
        ),
        ("'%%'.format([1]) == ''", "expected 0, got 1"),
        (
            "'%z'.format([1]) == ''",
            "could not parse formatting clause: unrecognized formatting clause \"z\"",
        ),
        (
            "'%é'.format([1]) == ''",
            "1:12: could not parse formatting clause: unrecognized formatting clause \"Ã\"",
        ),
        (
            "'%5d'.format([1]) == ''",
            "unrecognized formatting clause \"5\"",
        ),
        ("'%'.format([1]) == ''", "unexpected end of string"),
        ("'%s%'.format(['x'])  == ''", "unexpected end of string"),
        (
            "'%.'.format([1]) == ''",
            "error while parsing precision: could not find end of precision specifier",
        ),
        (
            "'%.s'.format([1]) == ''",
            "error while converting precision to integer: strconv.Atoi: parsing \"\": invalid syntax",
        ),
        (
            "'%.99999999999999999999f'.format([1.0]) == ''",
            "parsing \"99999999999999999999\": value out of range",
        ),
        // type errors point at the argument
        (
            "'%d'.format([1.0]) == ''",
            "1:14: error during formatting: decimal clause can only be used on integers, was given double",
        ),
        (
            "'%f'.format([1]) == ''",
            "fixed-point clause can only be used on doubles, was given int",
        ),
        (
            "'%e'.format([true]) == ''",
            "scientific clause can only be used on doubles, was given bool",
        ),
        (
            "'%b'.format([[1]]) == ''",
            "only integers and bools can be formatted as binary, was given list",
        ),
        (
            "'%x'.format([{}]) == ''",
            "only integers, byte buffers, and strings can be formatted as hex, was given map",
        ),
        (
            "'%o'.format(['a']) == ''",
            "octal clause can only be used on integers, was given string",
        ),
        (
            "'%d'.format([device]) == ''",
            "was given kubernetes.DRADevice",
        ),
        (
            "'%s'.format([quantity('1')]) == ''",
            "string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists, types, durations, and timestamps, was given kubernetes.Quantity",
        ),
        // %s looks into list and map literals
        (
            "'%s'.format([[1, [optional.none()]]]) == ''",
            "was given optional_type",
        ),
        (
            "'%s'.format([{'a': [ip('::1')]}]) == ''",
            "was given net.IP",
        ),
    ] {
        compile_err(expr, want);
    }
    // several errors, in source order
    let e = compile("'%d'.format(['a']) == '' && '%q'.format([1]) == ''").unwrap_err();
    assert!(
        e.contains("1:14: error during formatting")
            && e.contains("\nERROR: <input>:1:40: could not parse"),
        "{e}"
    );
    // validators run only when checking succeeded
    compile_err(
        "'%d'.format(['a']) == '' && device.nope",
        "undefined field 'nope'",
    );
}

#[test]
fn format_arguments_may_be_heterogeneous() {
    out(r#""%d %s".format([1, "a"])"#, "1 a");
    out(r#""%s".format([[1, "a"]])"#, r#"[1, "a"]"#);
    out(r#""%s".format([{"a": 1, 2: "b"}])"#, r#"{"a":1, 2:"b"}"#);
    assert_eq!(
        eval("'%s'.format([[1, 'a'].exists(x, x == 1)]) == 'true'"),
        Ok(true)
    );
    // outside format the validator still objects, after checking
    compile_err(
        "[1, 'a'].size() == 2",
        "expected type 'int' but found 'string'",
    );
    compile_err("[1, 'a'] == [] && device.nope", "undefined field 'nope'");
}

#[test]
fn dynamic_calls_fail_at_run_time() {
    for (expr, want) in [
        (
            "dyn('%d').format([1.5]) == ''",
            "error during formatting: decimal clause can only be used on integers, was given double",
        ),
        (
            "'%d'.format(dyn([1.5])) == ''",
            "error during formatting: decimal clause can only be used on integers, was given double",
        ),
        (
            "'%d'.format([dyn('a')]) == ''",
            "error during formatting: decimal clause can only be used on integers, was given string",
        ),
        (
            "'%s'.format([dyn(quantity('1'))]) == ''",
            "error during formatting: string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists, types, durations, and timestamps, was given kubernetes.Quantity",
        ),
        (
            "'%s'.format([dyn(semver('1.0.0'))]) == ''",
            "error during formatting: string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists, types, durations, and timestamps, was given kubernetes.Semver",
        ),
        (
            "'%s'.format([[dyn(cidr('10.0.0.0/8'))]]) == ''",
            "error during formatting: no formatting function for net.CIDR",
        ),
        (
            "'%s'.format([{dyn(1.5): 1}]) == ''",
            "error during formatting: no formatting function for map key of type double",
        ),
        (
            "'%s'.format([dyn(b'\\xff')]) == ''",
            "error during formatting: could not convert argument \"invalid UTF-8 in bytes, cannot convert to string\" to string",
        ),
        (
            "'%e'.format([dyn('abc')]) == ''",
            "error during formatting: scientific clause can only be used on doubles, was given string",
        ),
        // the argument is fetched before the end of the string is noticed
        ("dyn('%s%').format(['x']) == ''", "index 1 out of range"),
        (
            "dyn('%s%').format(['x', 'y']) == ''",
            "unexpected end of string",
        ),
        ("'%s %s'.format(dyn([1])) == ''", "index 1 out of range"),
        (
            "dyn('%q').format([1]) == ''",
            "could not parse formatting clause: unrecognized formatting clause \"q\"",
        ),
    ] {
        run_err(expr, want);
    }
    // extra arguments are fine at run time
    assert_eq!(eval("dyn('%s').format(['x', 'y']) == 'x'"), Ok(true));
}

#[test]
fn format_costs_a_tenth_per_character() {
    let cost = |fmt: &str| {
        let p = compile(&format!("'{fmt}'.format([]) == ''")).expect("compiles");
        let (result, cost) = p.eval_cost(&Value::Null);
        result.expect("evaluates");
        cost
    };

    // upstream: ceil(characters / 10) for the call
    assert_eq!(cost(&"é".repeat(97)) - cost("x"), 9);
    assert_eq!(cost(&"x".repeat(100)) - cost(&"x".repeat(91)), 0);
}
