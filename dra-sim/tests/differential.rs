//! Differential test: 2,400 random allocation cases and 5,423 random CEL evaluations (two per case,
//! and in a quarter of the cases a format-library call on its own; seeded, so the same every run)
//! answered by our simulator and by the Go oracle built against
//! k8s.io/dynamic-resource-allocation v0.37.2 (e2e/oracle); answers must be identical, and so must
//! the runtime cost of each CEL evaluation where cel-go reports one (`ActualCost`: every one that
//! ran, successful or failed; 3,755 of them). Go iterates maps in a random order, so where a
//! comprehension over a map stops early the cost differs between runs: the oracle runs each
//! evaluation 128 times and reports the lowest and highest cost, and ours must lie in between (91
//! evaluations; the others cost the same every run and must match exactly).
//!
//! Allocation cases mix plain, partitionable (shared counters that run out) and consumable-capacity
//! pools (allowMultipleAllocations with request policies, pre-existing shares), node selection of
//! every kind, incomplete / obsolete / invalid pools, taints and tolerations, and pods of one or two
//! claims with ExactCount / All / adminAccess / capacity requests / firstAvailable lists whose first
//! entries are often too demanding, matchAttribute / distinctAttribute and config. Compared: status,
//! every result (request, pool, device, adminAccess, share, consumed capacity, tolerations), config
//! and node selector. A coverage check keeps the mix healthy (≥30% allocated, shares, fall-throughs).
//!
//! Selectors include the IP, CIDR and URL libraries over literal addresses (valid and refused, both
//! families, URLs with ports, queries and fragments), and `format` calls over literal and
//! attribute arguments of every type (wrong verbs, bad clauses, missing or extra arguments, both
//! checked at compile time and, behind `dyn`, at run time), the Kubernetes format library
//! (`format.named` of known and unknown names, `format.<name>()`, `validate` over values each
//! format takes and refuses and over attributes, answers read as presence, size or upstream's
//! exact message, wrong argument types), and the authz library's declarations (no `authorizer`
//! exists, so its chains only type-check through `dyn`). Error texts are compared by kind only for
//! CEL evaluations (runtime `no overload` details differ in wording; compile errors carry no
//! source snippet).
//! Skips with a message when `go` is not installed. `SIM_DIFF_DUMP=<file>` keeps cases and answers.
//!
//! The second test, `cel_expressions_against_go_oracle` (`differential/cel_cases.rs`, grammar in
//! `differential/cel_grammar.rs` and `cel_library.rs`), compares the outcome of 10,000 CEL-only
//! expressions built to find differences (`SIM_DIFF_CASES=200000` for a longer run).
//!
//! One file over 600 lines on purpose: the case grammar and the comparison with the oracle
//! belong together; the CEL-only test lives in modules of this same test binary, which builds
//! the oracle once for both.
#[path = "differential/cel_bench.rs"]
mod cel_bench;
#[path = "differential/cel_cases.rs"]
mod cel_cases;
#[path = "differential/cel_grammar.rs"]
mod cel_grammar;
#[path = "differential/cel_library.rs"]
mod cel_library;

use dra_sim::alloc::{AllocatedState, Allocator, DeviceCache, SimNode, SliceFacts};
use dra_sim::cel;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value as J, json};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn n(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).expect("below n, a usize")
    }
    /// `n` as a CEL int.
    fn int(&mut self, n: usize) -> i64 {
        i64::try_from(self.n(n)).expect("below n, a usize")
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.n(v.len())]
    }
    fn coin(&mut self, pct: usize) -> bool {
        self.n(100) < pct
    }
}

const DRV: &str = "gpu.example.com";
const MODELS: &[&str] = &["a100", "h100", "H100-SXM", "l4", "gpu-x"];
const VERSIONS: &[&str] = &["1.0.0", "1.2.3", "2.0.0-rc.1", "12.4.1", "0.9.0"];
const QTYS: &[&str] = &[
    "40Gi",
    "80Gi",
    "10Gi",
    "1Ki",
    "1500m",
    "0",
    "42949672960",
    "1e3",
];

fn rand_attrs(r: &mut Rng) -> J {
    let mut m = serde_json::Map::new();
    if r.coin(85) {
        m.insert("model".into(), json!({"string": r.pick(MODELS)}));
    }
    if r.coin(80) {
        m.insert("cores".into(), json!({"int": r.int(5) * 16 - 8}));
    }
    if r.coin(70) {
        m.insert("ecc".into(), json!({"bool": r.coin(50)}));
    }
    if r.coin(70) {
        m.insert("driverVersion".into(), json!({"version": r.pick(VERSIONS)}));
    }
    if r.coin(50) {
        m.insert(
            "other.example.com/zone".into(),
            json!({"string": r.pick(&["z1", "z2"])}),
        );
    }
    if r.coin(30) {
        m.insert("pcieRoot".into(), json!({"string": r.pick(&["p0", "p1"])}));
    }
    J::Object(m)
}

fn rand_caps(r: &mut Rng) -> J {
    let mut m = serde_json::Map::new();
    if r.coin(80) {
        m.insert("memory".into(), json!({"value": r.pick(QTYS)}));
    }
    if r.coin(40) {
        m.insert(
            "other.example.com/slots".into(),
            json!({"value": r.pick(&["4", "8", "2k"])}),
        );
    }
    J::Object(m)
}

fn attr_ref(r: &mut Rng) -> (String, &'static str) {
    let (name, ty) = *r.pick(&[
        ("model", "s"),
        ("cores", "i"),
        ("ecc", "b"),
        ("driverVersion", "v"),
        ("zone", "s"),
        ("nope", "i"),
    ]);
    let dom = if name == "zone" {
        "other.example.com"
    } else {
        DRV
    };
    let form = if r.coin(50) {
        format!("device.attributes[\"{dom}\"].{name}")
    } else {
        format!("device.attributes[\"{dom}\"][\"{name}\"]")
    };
    (form, ty)
}

fn atom(r: &mut Rng) -> String {
    let (a, ty) = attr_ref(r);
    match r.n(31) {
        0..=5 => match ty {
            "s" => match r.n(5) {
                0 => format!("{a} == \"{}\"", r.pick(MODELS)),
                1 => format!("{a}.startsWith(\"{}\")", r.pick(&["a", "h", "H", "gpu"])),
                2 => format!("{a}.matches(\"^[a-z]+[0-9]+$\")"),
                3 => format!("{a}.lowerAscii().contains(\"h1\")"),
                _ => format!("{a}.split(\"-\").size() > 1"),
            },
            "i" => format!(
                "{a} {} {}",
                r.pick(&[">", ">=", "<", "==", "!="]),
                r.int(60) - 10
            ),
            "b" => {
                if r.coin(50) {
                    a
                } else {
                    format!("!{a}")
                }
            }
            _ => match r.n(3) {
                0 => format!("{a}.isGreaterThan(semver(\"{}\"))", r.pick(VERSIONS)),
                1 => format!("{a}.compareTo(semver(\"v1.2\", true)) >= 0"),
                _ => format!("{a}.major() >= 1"),
            },
        },
        6 => format!(
            "device.capacity[\"{DRV}\"].memory.compareTo(quantity(\"{}\")) >= 0",
            r.pick(QTYS)
        ),
        7 => format!(
            "device.capacity[\"{DRV}\"].memory.isLessThan(quantity(\"{}\"))",
            r.pick(QTYS)
        ),
        8 => format!(
            "\"memory\" in device.capacity[\"{DRV}\"] && device.capacity[\"{DRV}\"].memory.isInteger()"
        ),
        9 => format!(
            "has(device.attributes[\"{DRV}\"].{})",
            r.pick(&["model", "cores", "nope"])
        ),
        10 => format!(
            "\"{}\" in device.attributes",
            r.pick(&[DRV, "other.example.com", "x.io"])
        ),
        11 => format!(
            "device.attributes[\"{DRV}\"].?{}.orValue({}) == {}",
            r.pick(&["cores", "nope"]),
            r.n(3),
            r.n(3)
        ),
        12 => {
            format!("cel.bind(g, device.attributes[\"{DRV}\"], g.?model.orValue(\"\").size() > 2)")
        }
        13 => format!(
            "device.attributes[\"{DRV}\"].exists(k, k.startsWith(\"{}\"))",
            r.pick(&["c", "m", "z"])
        ),
        14 => "device.attributes.all(d, d.contains(\".\"))".to_string(),
        15 => format!("device.driver == \"{}\"", r.pick(&[DRV, "other"])),
        16 => format!("[1, 2, 3].exists(i, i == {})", r.n(5)),
        17 => format!("{a} + 1 > 2"),
        18 => format!("size({a}) > 3"),
        19 if r.coin(50) => format!(
            "{}(device.capacity[\"{DRV}\"].memory) {} 0",
            r.pick(&["sign", "quantity"]),
            r.pick(&[">", "=="])
        ),
        19 => format!(
            "device.capacity[\"other.example.com\"].slots.asInteger() > {}",
            r.n(10)
        ),
        20 if r.coin(30) => format!(
            "device.capacity[\"{DRV}\"].memory.{}",
            r.pick(&[
                "sign() == 1",
                "add(1).sub(quantity(\"1\")).isInteger()",
                "asApproximateFloat() > 1.0",
                "add(quantity(\"1Ki\")).compareTo(quantity(\"2Ki\")) > 0"
            ])
        ),
        20 => format!(
            "isQuantity(\"{}\") && isSemver(\"{}\")",
            r.pick(&["1Gi", "1GB", "1.5"]),
            r.pick(&["1.0.0", "v1.0.0", "1.0"])
        ),
        21 => r.pick(LIBRARY).replace("$a", &a),
        22 => format!(
            "{a}.{}",
            r.pick(&[
                "charAt(0) == \"h\"",
                "indexOf(\"1\") >= 0",
                "upperAscii().endsWith(\"00\")",
                "replace(\"-\", \"\").size() == 4",
                "substring(1) != \"\"",
                "trim() == \"l4\"",
                "find(\"[0-9]+\") == \"100\"",
                "findAll(\"[a-z]\").size() > 1",
                "split(\"-\").join(\"+\") == \"H100+SXM\"",
            ])
        ),
        23 | 24 => net_atom(r),
        25 | 26 => format_atom(r),
        27 => authz_atom(r),
        28 | 29 => named_format_atom(r),
        _ => format!("device.attributes[\"{DRV}\"].all(k, v, k != \"\")"),
    }
}

/// Addresses for the ip/cidr libraries: canonical and not, both families, and the forms
/// upstream refuses (leading zeros, zones, IPv4-mapped IPv6, bad lengths).
const IPS: &[&str] = &[
    "10.0.0.1",
    "127.0.0.1",
    "0.0.0.0",
    "255.255.255.255",
    "169.254.10.1",
    "224.0.0.251",
    "192.168.1.77",
    "::1",
    "::",
    "fe80::1",
    "ff02::fb",
    "2001:db8::abcd",
    "2001:DB8::ABCD",
    "2001:db8:0:0:0:0:0:1",
    "::1.2.3.4",
    "010.0.0.1",
    "1.2.3",
    "1.2.3.256",
    "fe80::1%eth0",
    "::ffff:10.0.0.1",
    "1:2:3:4:5:6:7:8:9",
    "gpu",
    "",
];
const CIDRS: &[&str] = &[
    "10.0.0.0/8",
    "10.0.0.1/24",
    "192.168.0.0/16",
    "0.0.0.0/0",
    "2001:db8::/32",
    "fe80::/10",
    "::/0",
    "::1/128",
    "10.0.0.0/33",
    "10.0.0.0/08",
    "::ffff:10.0.0.0/104",
    "10.0.0.0",
    "2001:db8::/129",
];
const URLS: &[&str] = &[
    "https://example.com",
    "https://user:pw@example.com:8443/a/b%20c?x=1&x=2&y=#frag",
    "http://[::1]:8080/metrics?debug",
    "HTTP://Example.COM/%7euser",
    "ftp://a:b:21/x",
    "http://a:b:80/x",
    "mailto:ops@example.com",
    "/v1/devices?limit=5&limit=6",
    "//host/path",
    "example.com/path",
    "http://a b/",
    "http://a/b?c=%zz&d=1;e=2&f=g",
    "http://h/p#%zz",
    "",
];

/// The apiserver's IP, CIDR and URL libraries over literals.
fn net_atom(r: &mut Rng) -> String {
    let ip = *r.pick(IPS);
    let ip2 = *r.pick(IPS);
    let c = *r.pick(CIDRS);
    let c2 = *r.pick(CIDRS);
    let u = *r.pick(URLS);
    match r.n(12) {
        0 => format!("isIP(\"{ip}\") && !isCIDR(\"{c}\")"),
        1 => format!("ip.isCanonical(\"{ip}\")"),
        2 => format!(
            "ip(\"{ip}\").{}",
            r.pick(&[
                "family() == 4",
                "family() == 6",
                "isUnspecified()",
                "isLoopback()",
                "isLinkLocalMulticast()",
                "isLinkLocalUnicast()",
                "isGlobalUnicast()",
            ])
        ),
        3 => format!("ip(\"{ip}\") == ip(\"{ip2}\")"),
        4 => format!("string(ip(\"{ip}\")) == \"{ip2}\""),
        5 if r.coin(50) => format!("cidr(\"{c}\").containsIP(\"{ip}\")"),
        5 => format!("cidr(\"{c}\").containsIP(ip(\"{ip}\"))"),
        6 if r.coin(50) => format!("cidr(\"{c}\").containsCIDR(\"{c2}\")"),
        6 => format!("cidr(\"{c}\").containsCIDR(cidr(\"{c2}\").masked())"),
        7 => format!(
            "cidr(\"{c}\").{}",
            r.pick(&[
                "prefixLength() >= 16",
                "ip().family() == 4",
                "masked() == cidr(\"10.0.0.0/24\")",
                "ip() == ip(\"10.0.0.1\")",
            ])
        ),
        8 => format!("string(cidr(\"{c}\").masked()) == \"{c2}\""),
        9 => format!("isURL(\"{u}\")"),
        10 => format!(
            "url(\"{u}\").{}",
            r.pick(&[
                "getScheme() == \"https\"",
                "getHost().endsWith(\"com\")",
                "getHostname() == \"::1\"",
                "getPort() == \"\"",
                "getEscapedPath().startsWith(\"/\")",
                "getQuery().size() > 0",
                "getQuery()[?\"x\"].orValue([]).size() == 2",
            ])
        ),
        _ => format!(
            "url(\"{u}\") == url(\"{}\")",
            r.pick(&[u, "https://example.com", "HTTP://example.com/%7Euser"])
        ),
    }
}

/// Messages the validators give (upstream's exact texts); selectors ask whether one is among the
/// answer, so the oracle confirms them.
const M_LABEL: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const M_SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const M_1035: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const M_KEY_NAME: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const M_KEY_PREFIX: &str = "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const M_KEY_PARTS: &str = "a valid label key must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')";
const M_LABEL_VALUE: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
const LONG_63_PLUS: &str =
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const LONG_SUBDOMAIN: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

/// One named format: values it takes, values it refuses, and the messages it gives.
struct NamedFormatCase {
    key: &'static str,
    good: &'static [&'static str],
    bad: &'static [&'static str],
    messages: &'static [&'static str],
}

const NAMED_FORMATS: &[NamedFormatCase] = &[
    NamedFormatCase {
        key: "dns1123Label",
        good: &["a", "my-name", "123", "h100"],
        bad: &["", "A", "-a", "a.b", "a_b", "H100-SXM", LONG_63_PLUS],
        messages: &[
            M_LABEL,
            "must not contain dots",
            "must be no more than 63 characters",
        ],
    },
    NamedFormatCase {
        key: "dns1123Subdomain",
        good: &["example.com", "a", "gpu.example.com"],
        bad: &["", "a..b", "Example.com", ".a", LONG_SUBDOMAIN],
        messages: &[M_SUBDOMAIN, "must be no more than 253 characters"],
    },
    NamedFormatCase {
        key: "dns1035Label",
        good: &["a", "my-name", "gpu-x"],
        bad: &["", "1a", "123", "a-", "a.b"],
        messages: &[M_1035],
    },
    NamedFormatCase {
        key: "qualifiedName",
        good: &["MyName", "my.name", "example.com/MyName", "a/b"],
        bad: &["", "/y", "x/", "a/b/c", "-a", "UPPER.com/x", "x/-a"],
        messages: &[
            "name part must be non-empty",
            M_KEY_NAME,
            "prefix part must be non-empty",
            M_KEY_PARTS,
            M_KEY_PREFIX,
        ],
    },
    NamedFormatCase {
        key: "dns1123LabelPrefix",
        good: &["a-", "ab-", "--", "my-name-", "a_-"],
        bad: &["-", "---", "A-", "a.b-"],
        messages: &[M_LABEL, "must not contain dots"],
    },
    NamedFormatCase {
        key: "dns1123SubdomainPrefix",
        good: &["example.com-", "a..-", "a.-"],
        bad: &["-", "a...-", "Example.com-"],
        messages: &[M_SUBDOMAIN],
    },
    NamedFormatCase {
        key: "dns1035LabelPrefix",
        good: &["a-", "1-", "gpu-"],
        bad: &["-", "1a-", "a.b-"],
        messages: &[M_1035],
    },
    NamedFormatCase {
        key: "labelValue",
        good: &["", "MyValue", "my_value", "12345", "H100-SXM"],
        bad: &["-a", "a-", "_", "a b", "é", LONG_63_PLUS],
        messages: &[M_LABEL_VALUE, "must be no more than 63 bytes"],
    },
    NamedFormatCase {
        key: "uri",
        good: &[
            "http://example.com",
            "/path",
            "mailto:x",
            "https://u:p@h:8443/a?b#c",
            "*",
        ],
        bad: &[
            "",
            "a.b",
            "http://a b/",
            "http://[::1",
            "http://h/%zz",
            "a\tb",
        ],
        messages: &[
            "parse \"\": empty url",
            "parse \"a.b\": invalid URI for request",
            "parse \"http://a b/\": invalid character \" \" in host name",
            "parse \"http://[::1\": missing ']' in host",
            "parse \"http://h/%zz\": invalid URL escape \"%zz\"",
            "parse \"a\\tb\": net/url: invalid control character in URL",
        ],
    },
    NamedFormatCase {
        key: "uuid",
        good: &[
            "123e4567-e89b-12d3-a456-426614174000",
            "123E4567E89B12D3A456426614174000",
        ],
        bad: &[
            "",
            "123e4567-e89b-12d3-a456-42661417400",
            "123e4567--e89b-12d3-a456-426614174000",
            "g23e4567-e89b-12d3-a456-426614174000",
        ],
        messages: &["does not match the UUID format"],
    },
    NamedFormatCase {
        key: "byte",
        good: &["aGVsbG8=", "aGVsbA==", "aGVs", "ab+/"],
        bad: &["", "aGVsbG8", "a===", "ab=c", "ab-_", "aGV"],
        messages: &["invalid base64"],
    },
    NamedFormatCase {
        key: "date",
        good: &["2021-01-01", "2020-02-29", "2000-02-29", "0000-02-29"],
        bad: &[
            "",
            "2021-02-29",
            "1900-02-29",
            "2021-13-01",
            "2021-1-01",
            "2021-01-01T00:00:00Z",
        ],
        messages: &["invalid date"],
    },
    NamedFormatCase {
        key: "datetime",
        good: &[
            "2021-01-01T00:00:00Z",
            "2021-01-01t23:59:59.123+01:00",
            "2021-01-01T00:00:00Zt junk",
            "2021-01-01T00:00:00é5z",
            "2021-01-01T00:00:0012z",
        ],
        bad: &[
            "",
            "2021-01-01",
            "2021-01-01T24:00:00Z",
            "2021-01-01T00:00:00",
            "2021-01-01T00:00:00.Z",
            "2021-01-01T00:00:00+0100",
            "2021-02-30T00:00:00Z",
            "2021-01-01T00:00:001z",
        ],
        messages: &["invalid datetime"],
    },
];

/// A CEL double-quoted string literal.
fn cel_str(s: impl AsRef<str>) -> String {
    let mut out = String::from("\"");
    for c in s.as_ref().chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Whether a selector calls the format library (not ext.Strings' `"...".format`).
fn uses_named_format(e: &str) -> bool {
    e.contains("format.named(")
        || e.contains(".validate(")
        || NAMED_FORMATS
            .iter()
            .any(|f| e.contains(&format!("format.{}(", f.key)))
}

/// The Kubernetes format library: formats by name (known and unknown) and by function, validated
/// over literal values each format takes or refuses and over the device's attributes, with the
/// answer read as presence, size, or upstream's exact message; wrong argument types at compile
/// time and, behind `dyn`, at run time.
fn named_format_atom(r: &mut Rng) -> String {
    let fc = r.pick(NAMED_FORMATS);
    let key = fc.key;
    let other = r.pick(NAMED_FORMATS).key;
    // the answer read as one of upstream's messages: mostly of this format, over a refused value
    let ending = r.n(11);
    let ask_message = matches!(ending, 4..=6);
    let unknown = *r.pick(&["URI", "nosuch", "", "dns1123label", "format.uri"]);
    let name = if r.coin(80) { key } else { unknown };
    let f = match r.n(12) {
        0..=4 => format!("format.{key}()"),
        5 | 6 => format!("format.named(\"{key}\").value()"),
        7 => format!("format.named(\"{name}\").orValue(format.{other}())"),
        8 => format!("format.named(\"{name}\").value()"),
        9 => format!("dyn(format.{key}())"),
        10 => r
            .pick(&[
                "format.named(1).value()",
                "format.named(dyn(1)).value()",
                "format.nosuch()",
                "format.uri(1)",
                "format.named(\"uri\")",
                "dyn(\"uri\")",
                "format",
            ])
            .to_string(),
        _ => format!("format.named(\"{name}\").orValue(format.{key}())"),
    };
    let arg = match r.n(10) {
        _ if ask_message && r.coin(60) => cel_str(r.pick(fc.bad)),
        0..=3 => cel_str(r.pick(fc.good)),
        4..=6 => cel_str(r.pick(fc.bad)),
        7 => {
            let refused = r.pick(NAMED_FORMATS).bad;
            cel_str(r.pick(refused))
        }
        8 => {
            let (a, ty) = attr_ref(r);
            if ty == "s" || r.coin(30) {
                a
            } else {
                format!("dyn({a})")
            }
        }
        _ => r
            .pick(&["device.driver", "1", "dyn(1)", "dyn(\"a\")", "string(1)"])
            .to_string(),
    };
    let v = format!("{f}.validate({arg})");
    let msg = if r.coin(80) {
        cel_str(r.pick(fc.messages))
    } else {
        let any = r.pick(NAMED_FORMATS).messages;
        cel_str(r.pick(any))
    };
    match ending {
        0 => format!("{v}.hasValue()"),
        1 => format!("!{v}.hasValue()"),
        2 => format!("{v} == optional.none()"),
        3 => format!("{v}.orValue([]).size() == {}", r.n(3)),
        4 | 5 => format!("{v}.orValue([]).exists(m, m == {msg})"),
        6 => format!("{v}.value()[0] == {msg}"),
        7 => format!(
            "{v}.orValue([\"\"]).join(\"|\").size() {} {}",
            r.pick(&[">", "<", "=="]),
            r.pick(&[0, 21, 30, 60, 200, 300])
        ),
        8 => format!("format.named(\"{name}\").hasValue()"),
        9 => format!(
            "{} {} {}",
            f,
            r.pick(&["==", "!="]),
            r.pick(&[
                format!("format.{other}()"),
                format!("format.named(\"{name}\").orValue(format.{key}())"),
                "dyn(1)".to_string(),
            ])
        ),
        _ => format!("({v}.hasValue() || {v}.orValue([]).size() == 0)"),
    }
}

/// Clauses for `format`: every verb, precisions, and clauses upstream refuses.
const VERBS: &[&str] = &[
    "%s", "%s", "%s", "%s", "%d", "%f", "%.2f", "%.0f", "%e", "%.12e", "%b", "%x", "%X", "%o",
    "%%", "%q", "%.", "%5d",
];
/// `format` arguments of every type ($a: an attribute of any type).
const FMT_ARGS: &[&str] = &[
    "1",
    "-42",
    "7u",
    "1.5",
    "-0.0",
    "1e21",
    "123456.789",
    "'h100'",
    "'a\"b'",
    "'NaN'",
    "'-Infinity'",
    "b'xy'",
    "true",
    "null",
    "type(1)",
    "[1, 'a', 2.5]",
    "{'b': 1, 'a': [true], 'c': {2: null}}",
    "[]",
    "quantity('1Gi')",
    "ip('10.0.0.1')",
    "semver('1.2.3')",
    "optional.of(1)",
    "device.driver",
    "$a",
    "$a",
    "[$a]",
];

/// The authz library, declared without an `authorizer`: chains that type-check through `dyn`
/// (and fail when run, unless `||`/`&&` absorb it), and ones that do not (wrong receiver, wrong
/// arguments, a missing accessor).
fn authz_atom(r: &mut Rng) -> String {
    let model = format!("dyn(device.attributes[\"{DRV}\"].model)");
    let mut e = r
        .pick(&[
            "dyn(1)",
            "dyn('x')",
            "dyn(device.driver)",
            "device.driver",
            &model,
        ])
        .to_string();
    let steps: &[&str] = &[
        ".path('/metrics')",
        ".group('apps')",
        ".serviceAccount('ns', 'sa')",
        ".resource('deployments')",
        ".subresource('scale')",
        ".namespace('default')",
        ".name('x')",
        ".fieldSelector('a=b')",
        ".labelSelector('c in (d)')",
        ".check('get')",
        ".group(1)",
        ".check()",
        ".serviceAccount('sa')",
    ];
    for _ in 0..r.n(4) {
        let step = *r.pick(steps);
        e.push_str(step);
    }
    let end = *r.pick(&[
        ".allowed()",
        ".errored()",
        ".reason() == ''",
        ".error() != 'x'",
        ".denied()",
        " == true",
        "",
    ]);
    e.push_str(end);
    match r.n(3) {
        0 => format!("({e} || true)"),
        1 => format!("(false && {e})"),
        _ => e,
    }
}

/// `"<clauses>".format([args])` compared as a string, by size or by prefix; arguments may be
/// one short or one too many, and `dyn` defers the checks to run time.
fn format_atom(r: &mut Rng) -> String {
    let n: usize = *r.pick(&[0, 1, 1, 1, 2, 2, 3]);
    let mut f = String::new();
    for _ in 0..n {
        let sep = *r.pick(&["", " ", "-", "é"]);
        let verb = *r.pick(VERBS);
        f.push_str(sep);
        f.push_str(verb);
    }
    if r.coin(5) {
        f.push('%');
    }
    let k = (n + *r.pick(&[1, 1, 1, 1, 1, 1, 1, 1, 0, 2])).saturating_sub(1);
    let args: Vec<String> = (0..k)
        .map(|_| {
            let arg = r.pick(FMT_ARGS).replace("$a", &attr_ref(r).0);
            if r.coin(25) {
                format!("dyn({arg})")
            } else {
                arg
            }
        })
        .collect();
    let mut target = format!("\"{f}\"");
    if r.coin(10) {
        target = format!("dyn({target})");
    }
    let mut list = format!("[{}]", args.join(", "));
    if r.coin(10) {
        list = format!("dyn({list})");
    }
    let call = format!("{target}.format({list})");
    match r.n(3) {
        0 => format!(
            "{call} == \"{}\"",
            r.pick(&["1", "h100", "", "1.500000", "-42", "true", "%"])
        ),
        1 => format!("{call}.size() > {}", r.n(8)),
        _ => format!(
            "{call}.startsWith(\"{}\")",
            r.pick(&["1", "h", "-", "[", "{", "é"])
        ),
    }
}

/// Library calls over literals and the device ($a is an attribute reference of any type).
const LIBRARY: &[&str] = &[
    "[3, 1, 2].sort() == [1, 2, 3]",
    "[1, 2, 3].isSorted() && [1, 2].sum() == 3 && [4, 2].min() == 2 && [4, 2].max() == 4",
    "[[1], [2, 3]].flatten().size() == 3",
    "[1, 1, 2].distinct() == [1, 2]",
    "lists.range(3).reverse().first().value() == 2",
    "[1, 2, 3].slice(1, 2) == [2]",
    "[1, 2, 3].last().hasValue()",
    "[1, 2, 3].indexOf(2) == 1 && [1, 2, 2].lastIndexOf(2) == 2",
    "sets.contains([1, 2, 3], [2]) && sets.intersects([1], [1, 4]) && !sets.equivalent([1], [2])",
    "[1, 2, 3].existsOne(i, v, v == 2)",
    "{'a': 1, 'b': 2}.exists(k, v, v > 1)",
    "[1, 2].transformList(i, v, v * 2) == [2, 4]",
    "{'a': 1}.transformMap(k, v, v + 1) == {'a': 2}",
    "optional.of($a).hasValue()",
    "optional.none().orValue(1) == 1",
    "[1, 2].map(x, x * 2).filter(x, x > 2) == [4]",
    "[1, 2].exists_one(x, x == 1)",
    "'abc'.matches('^a') && 'x1y2'.findAll('[0-9]', 1) == ['1']",
    "strings.quote('a') == '\"a\"'",
    "'a,b'.split(',', 1).size() == 1 && 'abc'.lastIndexOf('c', 2) == 2",
    "quantity('1Gi').add(quantity('1Gi')).isGreaterThan(quantity('2G'))",
    "quantity('1.5').isInteger()",
    "quantity('10').asInteger() == 10 && quantity('1k').asApproximateFloat() == 1000.0",
    "semver('1.2.3').minor() == 2 && semver('1.2.3').patch() == 3",
    "semver('01.2.3', true) == semver('1.2.3')",
    "semver('1.2.3').compareTo(semver('1.10.0')) < 0",
    "type($a) == string",
    "$a == null",
    "double($a) > 1.0",
    "string($a).size() > 0",
    "int('12') + $a > 0",
    "[$a].all(x, x == $a)",
    "{'k': $a}.k == $a",
    "$a in [1, 'h100', true]",
    "($a).?x.hasValue()",
    "['a'].sortBy(x, x) == ['a']",
    "'x'.includes('x')",
];

fn selector(r: &mut Rng, depth: usize) -> String {
    if depth == 0 || r.coin(45) {
        return atom(r);
    }
    match r.n(5) {
        0 => format!("({} && {})", selector(r, depth - 1), selector(r, depth - 1)),
        1 => format!("({} || {})", selector(r, depth - 1), selector(r, depth - 1)),
        2 => format!("!({})", selector(r, depth - 1)),
        3 => format!(
            "({} ? {} : {})",
            selector(r, depth - 1),
            selector(r, depth - 1),
            selector(r, depth - 1)
        ),
        _ => r
            .pick(&[
                "1",
                "device.nope",
                "device.driver + 1 == 2",
                "?!",
                "device.attributes",
                "dyn(true)",
            ])
            .to_string(),
    }
}

fn eval_device(r: &mut Rng) -> J {
    json!({"Driver": DRV, "Attributes": rand_attrs(r), "Capacity": rand_caps(r), "AllowMultipleAllocations": r.coin(20)})
}

/// Selectors for claims and classes that mostly evaluate cleanly (guarded lookups), so that most
/// cases reach the search; `risky` mixes in the full grammar (runtime errors included).
fn safe_atom(r: &mut Rng) -> String {
    let g = format!("device.attributes[\"{DRV}\"]");
    let c = format!("device.capacity[\"{DRV}\"]");
    match r.n(16) {
        0 => format!("{g}.?model.orValue(\"\") == \"{}\"", r.pick(MODELS)),
        1 => format!("{g}.?model.orValue(\"\") != \"{}\"", r.pick(MODELS)),
        2 => format!(
            "has({g}.cores) && {g}.cores {} {}",
            r.pick(&[">", ">=", "<", "!="]),
            r.int(40) - 8
        ),
        3 => format!(
            "\"memory\" in {c} && {c}.memory.compareTo(quantity(\"{}\")) >= 0",
            r.pick(&["10Gi", "20Gi", "40Gi", "1Ki"])
        ),
        4 => format!(
            "{g}.?driverVersion.orValue(semver(\"0.0.1\")).isGreaterThan(semver(\"{}\"))",
            r.pick(&["0.9.0", "1.0.0", "1.2.3"])
        ),
        5 => format!("{g}.?ecc.orValue({})", r.coin(50)),
        6 => format!("device.driver == \"{DRV}\""),
        7 => format!("device.allowMultipleAllocations == {}", r.coin(70)),
        8 => format!(
            "{g}.?model.orValue(\"x\").lowerAscii().startsWith(\"{}\")",
            r.pick(&["h", "a", "l", "gpu"])
        ),
        9 => format!(
            "device.attributes[\"other.example.com\"].?zone.orValue(\"z1\") == \"{}\"",
            r.pick(&["z1", "z2"])
        ),
        10 => format!("cel.bind(a, {g}, a.?cores.orValue(0) + 8 >= {})", r.n(40)),
        11 => format!(
            "{g}.exists(k, k == \"{}\")",
            r.pick(&["ecc", "model", "pcieRoot"])
        ),
        12 => format!("{g}.?model.orValue(\"\").matches(\"^[a-z]+[0-9]+$\")"),
        13 => format!("{c}.all(k, v, sign(v) >= 0)"),
        14 => "true".to_string(),
        _ => format!(
            "{g}.?pcieRoot.orValue(\"p0\") in [\"{}\", \"p9\"]",
            r.pick(&["p0", "p1"])
        ),
    }
}

fn claim_selectors(r: &mut Rng, risky: bool) -> J {
    let n = *r.pick(&[0, 0, 0, 0, 1, 1, 2]);
    J::Array(
        (0..n)
            .map(|_| {
                let e = if risky && r.coin(25) {
                    selector(r, 1)
                } else if r.coin(25) {
                    format!("{} && {}", safe_atom(r), safe_atom(r))
                } else {
                    safe_atom(r)
                };
                json!({"cel": {"expression": e}})
            })
            .collect(),
    )
}

fn classes() -> J {
    let class = |name: &str, expr: String, config: bool| {
        let mut spec = json!({"selectors": [{"cel": {"expression": expr}}]});
        if config {
            spec["config"] = json!([{"opaque": {"driver": DRV, "parameters": {"class": name}}}]);
        }
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec})
    };
    json!([
        class("gpu", format!("device.driver == \"{DRV}\""), false),
        class(
            "big",
            format!("device.capacity[\"{DRV}\"].?memory.orValue(quantity(\"0\")).compareTo(quantity(\"40Gi\")) >= 0"),
            true
        ),
        class(
            "strict",
            format!("device.attributes[\"{DRV}\"].cores > 8"),
            false
        ),
        class("shared", "device.allowMultipleAllocations".to_string(), true),
        class(
            "fast",
            format!("has(device.attributes[\"{DRV}\"].cores) && device.attributes[\"{DRV}\"].cores > 8"),
            false
        ),
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "any"}, "spec": {}}
    ])
}

/// Node selection for a slice (or, with per-device selection, for a device).
fn node_sel(r: &mut Rng, spec: &mut J, per_device_ok: bool) {
    match r.n(if per_device_ok { 12 } else { 10 }) {
        0..=4 => spec["nodeName"] = json!("node-a"),
        5 => spec["nodeName"] = json!("node-b"),
        6 | 7 => spec["allNodes"] = json!(true),
        8 | 9 => {
            spec["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": r.pick(&["In", "NotIn"]), "values": [r.pick(&["z1", "z2"])]}
            ]}]})
        }
        _ => spec["perDeviceNodeSelection"] = json!(true),
    }
}

fn capacity_policy(r: &mut Rng) -> J {
    match r.n(4) {
        0 => json!({"value": r.pick(&["40Gi", "80Gi"])}),
        1 => json!({"value": "80Gi", "requestPolicy": {"default": "10Gi",
            "validRange": {"min": "10Gi", "max": r.pick(&["40Gi", "80Gi"]), "step": r.pick(&["5Gi", "10Gi"])}}}),
        2 => json!({"value": "80Gi", "requestPolicy": {"default": "20Gi",
            "validValues": ["10Gi", "20Gi", "40Gi"]}}),
        _ => {
            json!({"value": r.pick(&["4", "8"]), "requestPolicy": {"default": "1", "validRange": {"min": "1"}}})
        }
    }
}

fn alloc_case(r: &mut Rng) -> J {
    // "risky" cases use the full selector grammar in claims (runtime errors are expected there);
    // the others only guarded selectors, so that most of them reach the search.
    let risky = r.coin(15);
    let mut slices = Vec::new();
    let npools = 1 + r.n(3);
    // devices by pool, for pre-allocated claims
    let mut known: Vec<(String, String, bool)> = Vec::new();
    for p in 0..npools {
        let pool = format!("pool-{p}");
        // 0 plain, 1 partitionable (shared counters), 2 consumable capacity, 3 mixed
        let kind = *r.pick(&[0, 0, 1, 1, 2, 2, 3]);
        let counters = kind == 1 || (kind == 3 && r.coin(50));
        let second_set = counters && r.coin(60);
        // a few pools are invalid (duplicate device names or an unknown counter set)
        let invalid = r.coin(3);
        let nslices = 1 + r.n(2);
        let incomplete = r.coin(5);
        let generation = r.int(2);
        let mut total = nslices + usize::from(counters);
        if incomplete {
            total += 1;
        }
        let mut node_spec = json!({});
        node_sel(r, &mut node_spec, true);
        let per_device = node_spec.get("perDeviceNodeSelection").is_some();
        // an obsolete older generation of the same pool sometimes
        if r.coin(8) {
            let mut spec = node_spec.clone();
            spec["driver"] = json!(DRV);
            spec["pool"] =
                json!({"name": pool, "generation": generation - 1, "resourceSliceCount": 1});
            spec["devices"] = json!([{"name": "old-0", "attributes": rand_attrs(r)}]);
            if per_device {
                spec["devices"][0]["allNodes"] = json!(true);
            }
            slices.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": format!("{pool}-old")}, "spec": spec}));
        }
        for s in 0..nslices {
            let mut devs = Vec::new();
            for d in 0..(1 + r.n(4)) {
                let name = format!("d{s}-{d}");
                let mut dev = json!({"name": name, "attributes": rand_attrs(r)});
                let shared = kind == 2 || (kind == 3 && r.coin(40));
                if shared {
                    dev["allowMultipleAllocations"] = json!(true);
                    let mut caps = serde_json::Map::new();
                    caps.insert("memory".into(), capacity_policy(r));
                    if r.coin(40) {
                        caps.insert("slots".into(), json!({"value": r.pick(&["2", "4"])}));
                    }
                    dev["capacity"] = J::Object(caps);
                } else {
                    dev["capacity"] = rand_caps(r);
                }
                if counters && r.coin(85) {
                    let mut cs = vec![
                        json!({"counterSet": "cs", "counters": {"mem": {"value": r.pick(&["10Gi", "20Gi", "40Gi"])}}}),
                    ];
                    if (second_set && r.coin(40)) || (invalid && d == 0) {
                        cs.push(json!({"counterSet": "cs2", "counters": {"engines": {"value": r.pick(&["1", "2"])}}}));
                    }
                    dev["consumesCounters"] = J::Array(cs);
                }
                if r.coin(6) {
                    dev["taints"] = json!([{"key": r.pick(&["k1", "k2"]), "value": "v", "effect": r.pick(&["NoSchedule", "NoExecute", "None"])}]);
                }
                if per_device {
                    node_sel(r, &mut dev, false);
                }
                known.push((pool.clone(), name, shared));
                devs.push(dev);
            }
            if invalid && !counters {
                let d0 = devs[0].clone();
                devs.push(d0);
            }
            let mut spec = node_spec.clone();
            spec["driver"] = json!(DRV);
            spec["pool"] =
                json!({"name": pool, "generation": generation, "resourceSliceCount": total});
            spec["devices"] = J::Array(devs);
            slices.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": format!("{pool}-s{}", r.n(3) * 10 + s)}, "spec": spec}));
        }
        if counters {
            let mut spec = node_spec.clone();
            if per_device {
                spec = json!({"allNodes": true});
            }
            spec["driver"] = json!(DRV);
            spec["pool"] =
                json!({"name": pool, "generation": generation, "resourceSliceCount": total});
            let mut sets = vec![
                json!({"name": "cs", "counters": {"mem": {"value": r.pick(&["40Gi", "60Gi", "80Gi"])}}}),
            ];
            if second_set {
                sets.push(json!({"name": "cs2", "counters": {"engines": {"value": r.pick(&["1", "2", "3"])}}}));
            }
            spec["sharedCounters"] = J::Array(sets);
            slices.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": format!("{pool}-counters")}, "spec": spec}));
        }
    }
    let mut claims = Vec::new();
    // at most three requests per pod: the search is exponential in them, upstream as here
    let nclaims = if r.coin(35) { 2 } else { 1 };
    let mut budget = *r.pick(&[1, 2, 2, 3]).max(&nclaims);
    for c in 0..nclaims {
        let mut requests = Vec::new();
        let mut names: Vec<String> = Vec::new();
        let nreq = 1 + r.n(budget - (nclaims - 1 - c));
        budget -= nreq;
        for q in 0..nreq {
            let name = format!("r{q}");
            names.push(name.clone());
            let tol = if r.coin(30) {
                json!([{"key": r.pick(&["k1", "k2"]), "operator": r.pick(&["Exists", "Equal"]), "value": "v", "effect": r.pick(&["NoSchedule", "NoExecute"])}])
            } else {
                json!([])
            };
            let capacity = |r: &mut Rng| json!({"requests": {"memory": r.pick(&["1Gi", "10Gi", "10Gi", "15Gi", "30Gi", "50Gi"])}});
            if r.coin(35) {
                let nsub = 2 + r.n(2);
                let subs: Vec<J> = (0..nsub)
                    .map(|i| {
                        // the first subrequests are often too demanding, so the search falls through
                        let demanding = i + 1 < nsub && r.coin(60);
                        let class = if risky && r.coin(30) {
                            "strict"
                        } else {
                            *r.pick(&["gpu", "big", "fast", "shared", "any"])
                        };
                        let mut sub = json!({"name": format!("s{i}"), "deviceClassName": class,
                            "selectors": claim_selectors(r, risky), "tolerations": tol});
                        if demanding && r.coin(50) {
                            sub["count"] = json!(3 + r.n(4));
                        } else if demanding {
                            sub["selectors"] = json!([{"cel": {"expression": format!("device.attributes[\"{DRV}\"].?cores.orValue(0) >= {}", 24 + r.n(20))}}]);
                        } else {
                            sub["count"] = json!(1 + r.n(2));
                        }
                        if r.coin(5) {
                            sub["allocationMode"] = json!("All");
                            sub.as_object_mut().expect("sub").remove("count");
                        }
                        if class == "shared" || r.coin(10) {
                            sub["capacity"] = capacity(r);
                        }
                        names.push(format!("{name}/s{i}"));
                        sub
                    })
                    .collect();
                requests.push(json!({"name": name, "firstAvailable": subs}));
            } else {
                let class = if risky && r.coin(30) {
                    "strict"
                } else {
                    *r.pick(&["gpu", "gpu", "big", "fast", "shared", "any"])
                };
                let mut ex = json!({"deviceClassName": class, "selectors": claim_selectors(r, risky), "tolerations": tol});
                if r.coin(8) {
                    ex["allocationMode"] = json!("All");
                } else {
                    ex["count"] = json!(*r.pick(&[1, 1, 1, 1, 2, 2, 3, 4]));
                }
                if r.coin(6) {
                    ex["adminAccess"] = json!(true);
                }
                if class == "shared" || r.coin(5) {
                    ex["capacity"] = capacity(r);
                }
                requests.push(json!({"name": name, "exactly": ex}));
            }
        }
        let mut constraints = Vec::new();
        for _ in 0..*r.pick(&[0, 0, 0, 0, 1, 1, 2]) {
            let attr = r
                .pick(&[
                    "gpu.example.com/model",
                    "gpu.example.com/pcieRoot",
                    "gpu.example.com/ecc",
                    "gpu.example.com/cores",
                    "gpu.example.com/driverVersion",
                    "other.example.com/zone",
                ])
                .to_string();
            let reqs: Vec<String> = match r.n(3) {
                0 => vec![],
                1 => vec![r.pick(&names).clone()],
                _ => vec![r.pick(&names).clone(), r.pick(&names).clone()],
            };
            if r.coin(60) {
                constraints.push(json!({"requests": reqs, "matchAttribute": attr}));
            } else {
                constraints.push(json!({"requests": reqs, "distinctAttribute": attr}));
            }
        }
        let config = match r.n(4) {
            0 => {
                json!([{"requests": [r.pick(&names)], "opaque": {"driver": DRV, "parameters": {"a": 1}}}])
            }
            1 => json!([{"opaque": {"driver": DRV, "parameters": {"all": true}}},
                        {"requests": [r.pick(&names), r.pick(&names)], "opaque": {"driver": DRV, "parameters": {"b": 2}}}]),
            _ => json!([]),
        };
        claims.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": format!("c{c}"), "namespace": "default"},
            "spec": {"devices": {"requests": requests, "constraints": constraints, "config": config}}}));
    }
    let mut allocated = Vec::new();
    if !known.is_empty() && r.coin(35) {
        let mut results = Vec::new();
        for i in 0..1 + r.n(3) {
            let (pool, dev, shared) = r.pick(&known).clone();
            let mut res =
                json!({"request": format!("x{i}"), "driver": DRV, "pool": pool, "device": dev});
            if shared {
                res["shareID"] = json!(format!("5f0e6a52-0000-4000-8000-00000000000{i}"));
                res["consumedCapacity"] = json!({"memory": r.pick(&["10Gi", "20Gi", "40Gi"])});
            } else if r.coin(10) {
                res["adminAccess"] = json!(true);
            }
            results.push(res);
        }
        allocated.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "old", "namespace": "default"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results}}}}));
    }
    let zone = *r.pick(&["z1", "z2"]);
    json!({"classes": classes(), "slices": slices, "claims": claims, "allocated": allocated, "node": {"name": "node-a", "labels": {"zone": zone}}})
}

/// The oracle binary, built once per test run (both tests use it).
fn oracle() -> Option<PathBuf> {
    static BIN: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    BIN.get_or_init(build_oracle).clone()
}

fn build_oracle() -> Option<PathBuf> {
    if Command::new("go").arg("version").output().is_err() {
        eprintln!("SKIPPING differential test: `go` is not installed (needed to build e2e/oracle)");
        return None;
    }
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dra-oracle");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../e2e/oracle/build.sh");
    let st = Command::new("bash")
        .arg(&script)
        .arg(&out)
        .status()
        .expect("run e2e/oracle/build.sh");
    assert!(st.success(), "building the Go oracle failed");
    Some(out)
}

fn run_oracle(bin: &PathBuf, cases: &J) -> Vec<J> {
    let mut child = Command::new(bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("oracle");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(cases.to_string().as_bytes())
            .expect("write cases");
    }
    let out = child.wait_with_output().expect("oracle output");
    assert!(out.status.success(), "oracle failed");
    serde_json::from_slice(&out.stdout).expect("oracle JSON")
}

/// Our answer to one evaluation: kind, message and runtime cost (none for compile errors).
fn rust_eval(e: &J) -> (String, String, Option<u64>) {
    let expr = e["expression"].as_str().expect("expression");
    let d = &e["device"];
    let attrs = serde_json::from_value(d["Attributes"].clone()).expect("attributes");
    let caps = serde_json::from_value(d["Capacity"].clone()).expect("capacity");
    let prog = match cel::compile(expr) {
        Ok(p) => p,
        Err(m) => return ("compile_error".into(), m, None),
    };
    let multi = d["AllowMultipleAllocations"].as_bool().unwrap_or(false);
    let dev = cel::device_value(DRV, Some(&attrs), Some(&caps), multi).expect("device");
    let (whole, cost) = prog.eval_cost(&dev);
    // The allocator's way: the fused program reading the slice data in place.
    let raw = cel::RawDevice {
        driver: DRV,
        attributes: Some(&attrs),
        capacity: Some(&caps),
        allow_multiple_allocations: multi,
    };
    cel::device_check(&raw).expect("device values convert");
    let (in_place, raw_cost) = prog.eval_raw_cost(raw);
    assert_eq!(
        (&whole, cost),
        (&in_place, raw_cost),
        "{expr}: whole device value vs slice data in place (result, cost)"
    );
    match whole {
        Ok(b) => (b.to_string(), String::new(), Some(cost)),
        Err(m) => ("error".into(), m, Some(cost)),
    }
}

fn rust_alloc(c: &J) -> J {
    let classes: Vec<DeviceClass> = serde_json::from_value(c["classes"].clone()).expect("classes");
    let slices: Vec<ResourceSlice> = serde_json::from_value(c["slices"].clone()).expect("slices");
    let claims: Vec<ResourceClaim> = serde_json::from_value(c["claims"].clone()).expect("claims");
    let allocated: Vec<ResourceClaim> =
        serde_json::from_value(c["allocated"].clone()).expect("allocated");
    let a = Allocator::new(&classes, &slices, AllocatedState::from_claims(&allocated));
    let node = SimNode {
        name: c["node"]["name"].as_str().expect("node name").to_string(),
        labels: serde_json::from_value(c["node"]["labels"].clone()).expect("node labels"),
    };
    let outcome = a.allocate(&node, &claims);
    // The slice store's way (every slice's facts computed before the search) answers the same.
    let stored = Allocator::with_cache(
        &classes,
        &slices,
        AllocatedState::from_claims(&allocated),
        Arc::new(DeviceCache::with_facts(
            &slices,
            Arc::new(SliceFacts::build(&slices)),
        )),
    );
    assert_eq!(
        stored.allocate(&node, &claims),
        outcome,
        "slice facts built up front"
    );
    match outcome {
        Ok(Some(res)) => json!({"status": "ok", "results": res}),
        Ok(None) => json!({"status": "unsatisfiable"}),
        Err(e) => json!({"status": "error", "error": e}),
    }
}

/// The comparable part of an allocation: per claim and in order, each result's request, pool,
/// device, adminAccess, whether it is a share, consumed capacity and tolerations; the config
/// entries (source, requests, parameters) and the node selector. ShareIDs are random UIDs on both
/// sides, so only their presence is compared.
fn essence(a: &J) -> J {
    let results: Vec<J> = a["results"]
        .as_array()
        .map(|v| {
            v.iter()
                .map(|r| {
                    let devs: Vec<J> = r["devices"]["results"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|x| {
                            json!([
                                x["request"],
                                x["driver"],
                                x["pool"],
                                x["device"],
                                x["adminAccess"].as_bool().unwrap_or(false),
                                x.get("shareID").is_some_and(|s| !s.is_null()),
                                x.get("consumedCapacity").cloned().unwrap_or(J::Null),
                                x.get("tolerations").cloned().unwrap_or(J::Null),
                            ])
                        })
                        .collect();
                    let cfg: Vec<J> = r["devices"]["config"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|x| {
                            json!([
                                x["source"],
                                x["requests"].as_array().cloned().unwrap_or_default(),
                                x["opaque"]["parameters"]
                            ])
                        })
                        .collect();
                    json!({"devices": devs, "config": cfg, "nodeSelector": r.get("nodeSelector").cloned().unwrap_or(J::Null)})
                })
                .collect()
        })
        .unwrap_or_default();
    json!({"status": a["status"], "results": results})
}

/// What a case exercised, for the health check of the generator.
#[derive(Default, Debug)]
struct Coverage {
    ok: usize,
    unsatisfiable: usize,
    error: usize,
    shares: usize,
    fell_through: usize,
    all_mode: usize,
    admin: usize,
    multi_claim_ok: usize,
    error_text_differs: usize,
}

fn cover(cov: &mut Coverage, case: &J, want: &J) {
    match want["status"].as_str() {
        Some("ok") => cov.ok += 1,
        Some("unsatisfiable") => cov.unsatisfiable += 1,
        _ => cov.error += 1,
    }
    let results = want["results"].as_array().cloned().unwrap_or_default();
    if results.len() > 1 {
        cov.multi_claim_ok += 1;
    }
    let devs: Vec<&J> = results
        .iter()
        .flat_map(|r| r["devices"]["results"].as_array().into_iter().flatten())
        .collect();
    if devs
        .iter()
        .any(|d| d.get("shareID").is_some_and(|s| !s.is_null()))
    {
        cov.shares += 1;
    }
    if devs.iter().any(|d| {
        d["request"]
            .as_str()
            .is_some_and(|r| r.contains('/') && !r.ends_with("/s0"))
    }) {
        cov.fell_through += 1;
    }
    if devs
        .iter()
        .any(|d| d["adminAccess"].as_bool() == Some(true))
    {
        cov.admin += 1;
    }
    if want["status"] == "ok" && case.to_string().contains("\"allocationMode\":\"All\"") {
        cov.all_mode += 1;
    }
}

const ALLOC_CASES: usize = 2400;

#[test]
fn differential_against_go_oracle() {
    let Some(bin) = oracle() else { return };
    let mut r = Rng(0x9e3779b97f4a7c15);
    let mut cases = Vec::new();
    let mut n_evals = 0;
    for _ in 0..ALLOC_CASES {
        let mut c = alloc_case(&mut r);
        let mut evals: Vec<J> = (0..2)
            .map(|_| json!({"expression": selector(&mut r, 3), "device": eval_device(&mut r)}))
            .collect();
        // one format-library call on its own, so that its answer is the selector's
        if r.coin(25) {
            evals.push(
                json!({"expression": named_format_atom(&mut r), "device": eval_device(&mut r)}),
            );
        }
        n_evals += evals.len();
        c["evals"] = J::Array(evals);
        cases.push(c);
    }
    let cases = J::Array(cases);
    let answers = run_oracle(&bin, &cases);
    assert_eq!(answers.len(), ALLOC_CASES, "one answer per case");
    // SIM_DIFF_DUMP=<file> keeps the cases and the oracle's answers for debugging
    if let Ok(path) = std::env::var("SIM_DIFF_DUMP") {
        std::fs::write(
            &path,
            json!({"cases": cases, "answers": answers}).to_string(),
        )
        .expect("write SIM_DIFF_DUMP");
    }
    let mut mismatches = Vec::new();
    let mut agreement = std::collections::BTreeMap::<String, usize>::new();
    // outcomes of the evaluations that call the format library
    let mut named_format = std::collections::BTreeMap::<String, usize>::new();
    let mut cov = Coverage::default();
    let mut costs_compared = 0;
    let mut costs_varied = 0;
    for (i, (c, want)) in cases
        .as_array()
        .expect("cases")
        .iter()
        .zip(answers.iter())
        .enumerate()
    {
        for (j, e) in c["evals"].as_array().expect("evals").iter().enumerate() {
            let (kind, msg, cost) = rust_eval(e);
            let w = &want["evals"][j];
            let wkind = w["result"].as_str().unwrap_or("");
            let wmsg = w["message"].as_str().unwrap_or("");
            // cel-go's actual cost, wherever it reports one (every evaluation that ran). Go
            // iterates maps in a random order: where a comprehension over a map stops early, its
            // cost varies between the oracle's runs, and ours must lie within their range.
            if let Some(lo) = w["cost"].as_u64() {
                let hi = w["cost_max"].as_u64().unwrap_or(lo);
                costs_compared += 1;
                costs_varied += usize::from(lo != hi);
                if !cost.is_some_and(|c| (lo..=hi).contains(&c)) {
                    let go = if lo == hi {
                        lo.to_string()
                    } else {
                        format!("{lo}..={hi}")
                    };
                    mismatches.push(format!(
                        "case {i} eval {j}: {}\n  runtime cost: go {go}, rust {cost:?} ({wkind} / {kind})",
                        e["expression"]
                    ));
                }
            }
            *agreement.entry(format!("eval:{wkind}")).or_default() += 1;
            if uses_named_format(e["expression"].as_str().unwrap_or("")) {
                *named_format.entry(wkind.to_string()).or_default() += 1;
            }
            let same_key_error = wmsg.contains("no such key") == msg.contains("no such key");
            if kind != wkind || !same_key_error {
                mismatches.push(format!(
                    "case {i} eval {j}: {}\n  go:   {wkind} {wmsg}\n  rust: {kind} {msg}",
                    e["expression"]
                ));
            }
        }
        let got = rust_alloc(c);
        cover(&mut cov, c, want);
        if essence(&got) != essence(want) {
            mismatches.push(format!(
                "case {i} allocation:\n  go:   {}\n  rust: {}\n  go error: {}\n  rust error: {}",
                essence(want),
                essence(&got),
                want["error"],
                got["error"]
            ));
        } else if want["status"] == "error" && want["error"] != got["error"] {
            cov.error_text_differs += 1;
            if cov.error_text_differs <= 5 {
                eprintln!(
                    "case {i}: error text differs\n  go:   {}\n  rust: {}",
                    want["error"], got["error"]
                );
            }
        }
    }
    eprintln!(
        "differential: {n_evals} CEL evaluations ({costs_compared} with runtime costs compared, {costs_varied} of them varying with Go's map order) + {ALLOC_CASES} allocations; outcomes {agreement:?}; format library {} evaluations {named_format:?}; coverage {cov:?}; {} mismatches",
        named_format.values().sum::<usize>(),
        mismatches.len()
    );
    assert!(
        mismatches.is_empty(),
        "{} mismatches:\n{}",
        mismatches.len(),
        mismatches
            .iter()
            .take(15)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    // the oracle must keep reporting costs (all but compile errors and conversion failures)
    assert!(
        costs_compared * 2 >= n_evals,
        "only {costs_compared} of {n_evals} evaluations had a cost from the oracle"
    );
    // the generator must keep exercising the interesting paths
    assert!(
        cov.ok * 100 >= ALLOC_CASES * 30,
        "too few successful allocations: {cov:?}"
    );
    assert!(
        cov.unsatisfiable * 100 >= ALLOC_CASES * 10,
        "too few unsatisfiable cases: {cov:?}"
    );
    assert!(
        cov.shares >= 100,
        "too few consumable-capacity shares: {cov:?}"
    );
    assert!(
        cov.fell_through >= 100,
        "too few firstAvailable fall-throughs: {cov:?}"
    );
    assert!(
        ["true", "false", "error", "compile_error"]
            .iter()
            .all(|k| named_format.get(*k).copied().unwrap_or(0) >= 100),
        "too few format-library evaluations of some outcome: {named_format:?}"
    );
    assert!(
        cov.multi_claim_ok >= 100 && cov.admin >= 20 && cov.all_mode >= 20,
        "{cov:?}"
    );
}
