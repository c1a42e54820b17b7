//! The Kubernetes format library. Expected messages, results, compile errors and costs were
//! checked against the Go side (the apiserver library's `ConstantFormats` and the DRA CEL
//! environment of k8s.io/dynamic-resource-allocation v0.37.2).
use super::value::named_format::{FORMATS, lookup};
use super::*;

const LABEL_1123: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_1035: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const KEY_NAME: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const KEY_PARTS: &str = "a valid label key must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')";
const LABEL_VALUE: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

fn validate(key: &str, s: &str) -> Vec<String> {
    lookup(key)
        .unwrap_or_else(|| panic!("format {key}"))
        .validate(s)
}

fn valid(key: &str, inputs: &[&str]) {
    for s in inputs {
        assert_eq!(validate(key, s), Vec::<String>::new(), "{key} {s:?}");
    }
}

fn invalid(key: &str, s: &str, want: &[&str]) {
    assert_eq!(validate(key, s), want, "{key} {s:?}");
}

#[test]
fn names_and_lookup() {
    let keys: Vec<&str> = FORMATS.iter().map(|f| f.key).collect();
    assert_eq!(
        keys,
        [
            "dns1123Label",
            "dns1123Subdomain",
            "dns1035Label",
            "qualifiedName",
            "dns1123LabelPrefix",
            "dns1123SubdomainPrefix",
            "dns1035LabelPrefix",
            "labelValue",
            "uri",
            "uuid",
            "byte",
            "date",
            "datetime"
        ]
    );
    assert_eq!(lookup("uri").map(|f| f.name), Some("URI"));
    assert!(lookup("URI").is_none() && lookup("").is_none() && lookup("dns1123label").is_none());
}

#[test]
fn dns1123_label() {
    valid(
        "dns1123Label",
        &["a", "my-name", "123", "1a", "a-b-c", &"a".repeat(63)],
    );
    for s in ["", "A", "-a", "a-", "a_b", "é", "my-name-"] {
        invalid("dns1123Label", s, &[LABEL_1123]);
    }
    invalid("dns1123Label", "a.b", &["must not contain dots"]);
    invalid(
        "dns1123Label",
        &"a".repeat(64),
        &["must be no more than 63 characters"],
    );
    invalid(
        "dns1123Label",
        &"a-".repeat(40),
        &["must be no more than 63 characters", LABEL_1123],
    );
}

/// Three 63-byte labels and one of `last` bytes: 192 + `last` bytes long.
fn subdomain(last: usize) -> String {
    let l = "a".repeat(63);
    format!("{l}.{l}.{l}.{}", "b".repeat(last))
}

#[test]
fn dns1123_subdomain() {
    valid(
        "dns1123Subdomain",
        &["a", "example.com", "a.b-c.d1", &subdomain(61)],
    );
    for s in ["", "a..b", ".a", "a.", "Example.com", "a_b.c", "a-.b"] {
        invalid("dns1123Subdomain", s, &[SUBDOMAIN]);
    }
    invalid(
        "dns1123Subdomain",
        &subdomain(62),
        &["must be no more than 253 characters"],
    );
    invalid(
        "dns1123Subdomain",
        &"a.".repeat(130),
        &["must be no more than 253 characters", SUBDOMAIN],
    );
}

#[test]
fn dns1035_label() {
    valid("dns1035Label", &["a", "my-name", "a1", &"a".repeat(63)]);
    for s in ["", "1a", "123", "-a", "a-", "a.b", "A"] {
        invalid("dns1035Label", s, &[LABEL_1035]);
    }
    invalid(
        "dns1035Label",
        &"a".repeat(64),
        &["must be no more than 63 characters"],
    );
}

#[test]
fn prefixes_mask_the_trailing_dash_and_the_byte_before_it() {
    // upstream replaces the last two bytes of a name ending in `-` by `a`
    valid(
        "dns1123LabelPrefix",
        &["a", "a-", "ab-", "a_-", "a.-", "--", "my-name-"],
    );
    // a lone dash is not masked
    invalid("dns1123LabelPrefix", "-", &[LABEL_1123]);
    invalid("dns1123LabelPrefix", "---", &[LABEL_1123]);
    invalid("dns1123LabelPrefix", "a.b-", &["must not contain dots"]);
    valid("dns1123LabelPrefix", &[&format!("{}-", "a".repeat(63))]);
    invalid(
        "dns1123LabelPrefix",
        &format!("{}-", "a".repeat(64)),
        &["must be no more than 63 characters"],
    );
    valid("dns1123SubdomainPrefix", &["example.com-", "a.-"]);
    invalid("dns1123SubdomainPrefix", "a...-", &[SUBDOMAIN]);
    valid("dns1123SubdomainPrefix", &["a..-"]);
    invalid("dns1123SubdomainPrefix", "-", &[SUBDOMAIN]);
    valid("dns1035LabelPrefix", &["a-", "ab-", "a1-", "1-"]);
    invalid("dns1035LabelPrefix", "1a-", &[LABEL_1035]);
    invalid("dns1035LabelPrefix", "-", &[LABEL_1035]);
    // a multi-byte character before the dash is cut in half: no longer a match
    invalid("dns1123LabelPrefix", "aé-", &[LABEL_1123]);
}

#[test]
fn qualified_name() {
    valid(
        "qualifiedName",
        &[
            "a",
            "MyName",
            "my.name",
            "123-abc",
            "example.com/MyName",
            "a/b",
            &"a".repeat(63),
        ],
    );
    invalid(
        "qualifiedName",
        "",
        &["name part must be non-empty", KEY_NAME],
    );
    invalid(
        "qualifiedName",
        "x/",
        &["name part must be non-empty", KEY_NAME],
    );
    invalid("qualifiedName", "/y", &["prefix part must be non-empty"]);
    invalid("qualifiedName", "-a", &[KEY_NAME]);
    invalid("qualifiedName", "x/-a", &[KEY_NAME]);
    invalid("qualifiedName", "a/b/c", &[KEY_PARTS]);
    invalid(
        "qualifiedName",
        "UPPER.com/x",
        &[&format!("prefix part {SUBDOMAIN}")],
    );
    invalid(
        "qualifiedName",
        &format!("b/{}", "a".repeat(64)),
        &["name part must be no more than 63 bytes"],
    );
    invalid(
        "qualifiedName",
        &format!("{}/b", "a.".repeat(130)),
        &[
            "prefix part must be no more than 253 bytes",
            &format!("prefix part {SUBDOMAIN}"),
        ],
    );
}

#[test]
fn label_value() {
    valid(
        "labelValue",
        &[
            "",
            "a",
            "MyValue",
            "my_value",
            "12345",
            "a.b-c_d",
            &"a".repeat(63),
        ],
    );
    for s in ["-a", "a-", "_", "a b", "é", "a/b"] {
        invalid("labelValue", s, &[LABEL_VALUE]);
    }
    invalid(
        "labelValue",
        &"a".repeat(64),
        &["must be no more than 63 bytes"],
    );
    invalid(
        "labelValue",
        &"-".repeat(64),
        &["must be no more than 63 bytes", LABEL_VALUE],
    );
}

#[test]
fn uri() {
    valid(
        "uri",
        &[
            "http://example.com",
            "/path",
            "mailto:x",
            "https://user:pw@h:8443/a?b#c",
            "*",
        ],
    );
    invalid("uri", "", &["parse \"\": empty url"]);
    invalid("uri", "a.b", &["parse \"a.b\": invalid URI for request"]);
    invalid("uri", "é", &["parse \"é\": invalid URI for request"]);
    invalid(
        "uri",
        "http://a b/",
        &["parse \"http://a b/\": invalid character \" \" in host name"],
    );
    invalid(
        "uri",
        "a\tb",
        &["parse \"a\\tb\": net/url: invalid control character in URL"],
    );
    invalid(
        "uri",
        "http://[::1",
        &["parse \"http://[::1\": missing ']' in host"],
    );
    invalid(
        "uri",
        "http://h/%zz",
        &["parse \"http://h/%zz\": invalid URL escape \"%zz\""],
    );
}

#[test]
fn uuid() {
    valid(
        "uuid",
        &[
            "123e4567-e89b-12d3-a456-426614174000",
            "123E4567E89B12D3A456426614174000",
            "123e4567e89b-12d3a456-426614174000",
        ],
    );
    for s in [
        "",
        "123e4567-e89b-12d3-a456-42661417400",
        "123e4567-e89b-12d3-a456-4266141740000",
        "123e4567--e89b-12d3-a456-426614174000",
        "-123e4567-e89b-12d3-a456-426614174000",
        "123e4567-e89b-12d3-a456-426614174000-",
        "g23e4567-e89b-12d3-a456-426614174000",
        "123e4567-e89b-12d3-a456-426614174000\n",
    ] {
        invalid("uuid", s, &["does not match the UUID format"]);
    }
}

#[test]
fn byte() {
    valid(
        "byte",
        &["aGVsbG8=", "aGVsbA==", "aGVs", "ab+/", "ab+/cd=="],
    );
    for s in [
        "", "aGVsbG8", "a===", "====", "ab=c", "a=b=", "ab-_", "aGVs\n", "aGV", "é",
    ] {
        invalid("byte", s, &["invalid base64"]);
    }
}

#[test]
fn date() {
    valid(
        "date",
        &[
            "2021-01-01",
            "2020-02-29",
            "2000-02-29",
            "0000-02-29",
            "9999-12-31",
        ],
    );
    for s in [
        "",
        "2021-02-29",
        "1900-02-29",
        "2021-13-01",
        "2021-00-01",
        "2021-01-00",
        "2021-04-31",
        "2021-1-01",
        "2021-01-1",
        "21-01-01",
        "2021-01-01T00:00:00Z",
        "2021/01/01",
        "+021-01-01",
    ] {
        invalid("date", s, &["invalid date"]);
    }
}

#[test]
fn datetime() {
    valid(
        "datetime",
        &[
            "2021-01-01T00:00:00Z",
            "2021-01-01t23:59:59.123+01:00",
            "2021-01-01T00:00:00-23:99",
            "2021-01-01T00:00:00Zt junk",
            "2021-01-01T00:00:00x5Z",
            "2021-01-01T00:00:00é5z",
            "2021-01-01T00:00:0012z",
        ],
    );
    for s in [
        "",
        "2021",
        "2021-01-01",
        "2021-01-01T24:00:00Z",
        "2021-01-01T00:60:00Z",
        "2021-01-01T00:00:60Z",
        "2021-01-01T00:00:00",
        "2021-01-01T00:00:00.Z",
        "2021-01-01T00:00:00+0100",
        "2021-01-01 00:00:00Z",
        "2021-02-30T00:00:00Z",
        "2021-01-01T0:00:00Z",
        "2021-01-01T00:00:00\n5Z",
        "2021-01-01T00:00:00ZZ",
        "2021-01-01T00:00:001z",
    ] {
        invalid("datetime", s, &["invalid datetime"]);
    }
}

fn eval(expr: &str) -> Result<bool, String> {
    let d = device_value("dra.example.com", None, None, false).expect("device");
    compile(expr)?.eval(&d)
}

fn cost(expr: &str) -> u64 {
    let d = device_value("dra.example.com", None, None, false).expect("device");
    let (result, cost) = compile(expr).expect("compiles").eval_cost(&d);
    result.expect("evaluates");
    cost
}

#[test]
fn selectors() {
    for e in [
        "format.named('uri').hasValue()",
        "!format.named('URI').hasValue()",
        "format.named('nosuch').orValue(format.uuid()).validate('x').hasValue()",
        "format.uri().validate('/x') == optional.none()",
        "format.named('uri').value().validate('x').value() == ['parse \"x\": invalid URI for request']",
        "format.dns1123Label().validate('a.b').value() == ['must not contain dots']",
        "format.dns1123Label().validate('a'.repeat(64) + '.') == optional.none() || true",
        "format.labelValue().validate('-').value().size() == 1",
        "format.uri() == format.named('uri').value()",
        "format.uri() != format.uuid()",
        "format.named('byte') == optional.of(format.byte())",
        "type(format.uri()) == type(format.uuid())",
        "format.uri() in [format.uuid(), format.uri()]",
        "!(1 == dyn(format.uri()))",
        "cel.bind(f, format.labelValue(), !f.validate('x').hasValue())",
        // a namespaced function wins over a variable of the same name, as in cel-go
        "['uri'].all(format, format.named(format).hasValue())",
        "['uri'].all(format, format.size() == 3)",
    ] {
        let e = e.replace("'a'.repeat(64)", &format!("'{}'", "a".repeat(64)));
        assert_eq!(eval(&e), Ok(true), "{e}");
    }
    for (e, want) in [
        (
            "format.named('nosuch').value().validate('x').hasValue()",
            "optional.none() dereference",
        ),
        ("dyn(format.uri()) == 1", "no such overload"),
        (
            "format.uri().validate(dyn(1)).hasValue()",
            "no such overload",
        ),
        ("dyn('x').validate('x').hasValue()", "no such overload"),
        ("format.named(dyn(1)).hasValue()", "no such overload"),
    ] {
        assert_eq!(eval(e), Err(want.to_string()), "{e}");
    }
}

#[test]
fn compile_errors() {
    for (e, want) in [
        (
            "format.named(1).hasValue()",
            "ERROR: <input>:1:13: found no matching overload for 'format.named' applied to '(int)'",
        ),
        (
            "format.named('uri', 'x').hasValue()",
            "found no matching overload for 'format.named' applied to '(string, string)'",
        ),
        (
            "format.nosuch().validate('x').hasValue()",
            "ERROR: <input>:1:1: undeclared reference to 'format' (in container '')",
        ),
        (
            "format.validate('x').hasValue()",
            "undeclared reference to 'format' (in container '')",
        ),
        (
            "format.dns1123Label",
            "undeclared reference to 'format' (in container '')",
        ),
        (
            "format.uri(1) == format.uri()",
            "found no matching overload for 'format.uri' applied to '(int)'",
        ),
        (
            "format.uri().validate(1).hasValue()",
            "ERROR: <input>:1:22: found no matching overload for 'validate' applied to 'kubernetes.NamedFormat.(int)'",
        ),
        (
            "format.named('uri').validate('x').hasValue()",
            "found no matching overload for 'validate' applied to 'optional_type(kubernetes.NamedFormat).(string)'",
        ),
        (
            "'x'.validate('x').hasValue()",
            "found no matching overload for 'validate' applied to 'string.(string)'",
        ),
        (
            "validate('x', 'y').hasValue()",
            "found no matching overload for 'validate' applied to '(string, string)'",
        ),
        (
            "format.uri() == 1",
            "found no matching overload for '_==_' applied to '(kubernetes.NamedFormat, int)'",
        ),
        (
            "'%s'.format([format.uri()]) == ''",
            "was given kubernetes.NamedFormat",
        ),
    ] {
        match compile(e) {
            Err(m) => assert!(m.contains(want), "{e}: {m}"),
            Ok(_) => panic!("{e} compiled"),
        }
    }
    assert_eq!(
        compile("format.labelValue()").map(|_| ()),
        Err("must evaluate to bool or the unknown type, not kubernetes.NamedFormat".into())
    );
}

#[test]
fn validate_costs_like_a_regex_match() {
    // (1 + code points) / 10 rounded up, times a quarter of the format's regex size rounded up
    // (1,103 for uri: 276), instead of the call's 1; plus 1 for `format.uri()` and `hasValue`
    let uri = |n: usize| {
        cost(&format!(
            "format.uri().validate('{}').hasValue()",
            "x".repeat(n)
        ))
    };
    assert_eq!(uri(0), 278);
    assert_eq!(uri(9), 278);
    assert_eq!(uri(10), 554);
    assert_eq!(uri(29), 830);
    assert_eq!(uri(1000), 27878);
    assert_eq!(
        cost("format.uri().validate('é').hasValue()"),
        278,
        "code points, not bytes"
    );
    let label = |n: usize| {
        cost(&format!(
            "format.dns1123Label().validate('{}').hasValue()",
            "x".repeat(n)
        ))
    };
    assert_eq!((label(29), label(59), label(69)), (26, 50, 58));
    assert_eq!(
        cost(&format!(
            "format.byte().validate('{}').hasValue()",
            "é".repeat(29)
        )),
        65
    );
    assert_eq!(
        cost(&format!(
            "format.datetime().validate('{}').hasValue()",
            "x".repeat(100)
        )),
        200
    );
    assert_eq!(cost("format.named('uri').hasValue()"), 2);
    assert_eq!(cost("format.uri() == format.uri()"), 3);
    assert_eq!(
        cost("format.named('uri').value().validate('http://x').hasValue()"),
        279
    );
    let big = format!("format.uri().validate('{}').hasValue()", "x".repeat(9000));
    assert!(
        eval(&big).is_ok(),
        "9,000 characters cost about 249,000: under the limit"
    );
    let huge = format!("format.uri().validate('{}').hasValue()", "x".repeat(40000));
    assert_eq!(eval(&huge), Err(eval::COST_EXCEEDED.to_string()));
}
