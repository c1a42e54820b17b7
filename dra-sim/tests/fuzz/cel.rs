//! CEL inputs: mutated selectors (every kind of syntax the environment knows), deep nesting of
//! every construct up to the length Kubernetes allows, and long chains.
use super::harness::{Rng, mutate};
use dra_sim::cel::{self, MAX_EXPRESSION_LENGTH, RawDevice, Value};
use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
use std::collections::BTreeMap;
use std::sync::OnceLock;

const SEEDS: &[&str] = &[
    "device.driver == 'gpu.example.com'",
    "device.attributes['gpu.example.com'].cores > 4 && has(device.attributes['gpu.example.com'].model)",
    "device.capacity['gpu.example.com'].memory.compareTo(quantity('10Gi')) >= 0",
    "device.attributes['gpu.example.com'].?model.orValue('') .matches('^[a-z]+$')",
    "[1, 2, 3].all(x, x > 0) || {'a': 1}.exists(k, v, v == 1)",
    "[1, 2].map(x, x * 2).filter(y, y > 2).size() == 1",
    "lists.range(5).transformList(i, x, x + i).sum() == 20",
    "cel.bind(g, device.attributes['gpu.example.com'], g.cores + 1 > 2)",
    "'%s %d %.3f %e %x %o %b'.format(['a', 1, 1.5, 2.0, 255, 8, true]) != ''",
    "semver('1.2.3').isGreaterThan(semver('v1.0', true)) ? true : false",
    "ip('10.0.0.1').family() == 4 && cidr('::/0').containsIP('::1')",
    "url('https://a.b/c?d=e#f').getQuery()['d'][0] == 'e'",
    "format.named('dns1123Label').value().validate('A').hasValue()",
    "b'\\xff\\x00' + bytes('é') != b''",
    "\"\\u00e9\\U0001F600\\x41\\101\\n\" != r'\\n'",
    "-9223372036854775808 < 18446744073709551615u && 1e300 * 1e300 > 0.0",
    "[dyn(1), dyn('a')].sortBy(x, string(x))[0] == 1",
    "optional.of(1).or(optional.none()).value() == 1 && [?optional.none(), 1].size() == 1",
    "{'a': 1}[?'b'].orValue(2) == 2 && sets.contains([1, 2], [2])",
    "type(1) == int && dyn(null) == null && uint(1.5) == 1u",
];

const TOKENS: &[&str] = &[
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ".",
    ",",
    ":",
    "?",
    "!",
    "-",
    "+",
    "*",
    "/",
    "%",
    "&&",
    "||",
    "==",
    "!=",
    "<",
    ">=",
    " in ",
    ".?",
    "[?",
    "?.",
    "'",
    "\"",
    "'''",
    "r'",
    "b'",
    "\\",
    "\\u",
    "\\U0010FFFF",
    "\\x",
    "\\777",
    "1",
    "1u",
    "1.5e",
    "0x",
    "9223372036854775808",
    "null",
    "true",
    "device",
    "has(",
    "all(",
    ".exists_one(x,",
    ".map(x,",
    "cel.bind(",
    "dyn(",
    "optional.",
    ".orValue(",
    "quantity(",
    "// c\n",
    "\n",
    "\t",
];

/// Nested forms: each `(` stands for one more level.
const NESTINGS: &[(&str, &str, &str)] = &[
    ("(", "true", ")"),
    ("[", "", "]"),
    ("{'a': ", "1", "}"),
    ("!", "true", ""),
    ("-", "1", ""),
    ("- ", "1", ""),
    ("dyn(", "1", ")"),
    ("[1].all(x, ", "true", ")"),
    ("true ? ", "true", " : false"),
    ("optional.of(", "1", ")"),
    ("1 + ", "1", ""),
    ("true && ", "true", ""),
    ("a.", "b", ""),
    ("x[", "0", "]"),
];

/// `depth` levels of a nesting, within the length Kubernetes allows.
fn nested(r: &mut Rng, depth: usize) -> String {
    let (open, mid, close) = *r.pick(NESTINGS);
    let depth = depth.min(MAX_EXPRESSION_LENGTH / (open.len() + close.len()).max(1));
    format!("{}{mid}{}", open.repeat(depth), close.repeat(depth))
}

pub fn inputs(r: &mut Rng, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| match r.n(10) {
            0 => {
                let d = *r.pick(&[10, 100, 200, 249, 250, 251, 300, 1000, 5000, 10_000]);
                nested(r, d)
            }
            1 => {
                let (a, b) = (*r.pick(SEEDS), *r.pick(SEEDS));
                format!("{a} {} {b}", r.pick(&["&&", "||", "==", "+", "?", ":"]))
            }
            _ => {
                let (s, other) = (*r.pick(SEEDS), *r.pick(SEEDS));
                let mut s = mutate(r, s, TOKENS, other);
                while s.len() > MAX_EXPRESSION_LENGTH {
                    s.pop();
                }
                s
            }
        })
        .collect()
}

struct Device {
    attrs: BTreeMap<String, DeviceAttribute>,
    caps: BTreeMap<String, DeviceCapacity>,
    value: Value,
}

fn device() -> &'static Device {
    static D: OnceLock<Device> = OnceLock::new();
    D.get_or_init(|| {
        let attrs: BTreeMap<String, DeviceAttribute> = serde_json::from_value(serde_json::json!({
            "model": {"string": "a100"}, "cores": {"int": 8}, "ecc": {"bool": true},
            "driverVersion": {"version": "1.2.3"}, "other.example.com/zone": {"string": "z1"}}))
        .expect("attributes");
        let caps: BTreeMap<String, DeviceCapacity> =
            serde_json::from_value(serde_json::json!({"memory": {"value": "40Gi"}}))
                .expect("capacity");
        let value =
            cel::device_value("gpu.example.com", Some(&attrs), Some(&caps), false).expect("device");
        Device { attrs, caps, value }
    })
}

/// Compiles; a program runs against the whole device value and the device read in place, which
/// must agree.
pub fn check(expr: &str) {
    let Ok(prog) = cel::compile(expr) else {
        return;
    };
    let d = device();
    let whole = prog.eval_cost(&d.value);
    let raw = RawDevice {
        driver: "gpu.example.com",
        attributes: Some(&d.attrs),
        capacity: Some(&d.caps),
        allow_multiple_allocations: false,
    };
    assert_eq!(whole, prog.eval_raw_cost(raw), "whole device vs in place");
}
