//! YAML inputs: the repository's examples and device classes, mutated line by line and byte by
//! byte, with YAML's own hazards (anchors and aliases, tags, merge keys, deep nesting, odd
//! scalars) spliced in.
use super::harness::{Rng, mutate};
use dra_sim::input::{Objects, load_str};
use std::path::Path;

/// Small documents of every kind the simulator reads, for when the repository's are not there.
const BUILTIN: &[&str] = &[
    "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: c\nspec:\n  devices:\n    requests:\n    - name: gpu\n      exactly:\n        deviceClassName: gpu.nvidia.com\n        selectors:\n        - cel:\n            expression: device.attributes['gpu.nvidia.com'].productName != ''\n",
    "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata:\n  name: gpu.nvidia.com\nspec:\n  selectors:\n  - cel:\n      expression: device.driver == 'gpu.nvidia.com'\n",
    "apiVersion: v1\nkind: Node\nmetadata:\n  name: n\n  labels: {a: b}\n",
];

const TOKENS: &[&str] = &[
    "&a ",
    "*a",
    "<<: *a\n",
    "!!binary AAAA",
    "!!str ",
    "!!int ",
    "!!float .nan",
    "? k\n: v\n",
    "~",
    "null",
    ".inf",
    "-.inf",
    "0x1F",
    "0o17",
    "1e999",
    "-0",
    "'",
    "\"\\u0000\"",
    "|\n  x\n",
    ">-\n  y\n",
    "---\n",
    "...\n",
    "- ",
    "  ",
    "\t",
    "[",
    "]",
    "{",
    "}",
    ": ",
    "#",
    "%YAML 1.2\n",
    "apiVersion: resource.k8s.io/v1beta1\n",
    "kind: ResourceClaimTemplate\n",
];

/// Billion laughs in small, and nesting as deep as YAML parsers refuse.
const HAZARDS: &[&str] = &[
    "a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c]\n",
    "a: &a {b: *a}\n",
    "kind: ResourceClaim\napiVersion: resource.k8s.io/v1\nmetadata: {name: &n x}\nspec: {devices: {requests: [{name: *n, exactly: {deviceClassName: *n}}]}}\n",
];

fn seeds() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out: Vec<String> = ["examples/claims", "deviceclasses"]
        .iter()
        .filter_map(|d| std::fs::read_dir(root.join(d)).ok())
        .flat_map(|it| it.filter_map(Result::ok))
        .filter(|e| e.path().extension().is_some_and(|x| x == "yaml"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .collect();
    out.sort();
    out.extend(BUILTIN.iter().chain(HAZARDS).map(|s| s.to_string()));
    out
}

/// Lines of `s` shuffled about: one duplicated, dropped or re-indented.
fn mutate_lines(r: &mut Rng, s: &str) -> String {
    let mut lines: Vec<String> = s.lines().map(str::to_string).collect();
    if lines.is_empty() {
        return s.to_string();
    }
    let i = r.n(lines.len());
    match r.n(3) {
        0 => lines.insert(i, lines[i].clone()),
        1 => {
            lines.remove(i);
        }
        _ => {
            lines[i] = format!(
                "{}{}",
                r.pick(&["", " ", "  ", "    ", "\t"]),
                lines[i].trim_start()
            )
        }
    }
    lines.join("\n")
}

pub fn inputs(r: &mut Rng, n: usize) -> Vec<String> {
    let seeds = seeds();
    (0..n)
        .map(|_| {
            let (s, other) = (r.pick(&seeds).clone(), r.pick(&seeds).clone());
            match r.n(5) {
                0 => mutate_lines(r, &s),
                1 => format!("{}{}", "[".repeat(r.n(2000)), "]".repeat(r.n(2000))),
                _ => mutate(r, &s, TOKENS, &other),
            }
        })
        .collect()
}

/// Loads every document; what loads must give the claims of a pod.
pub fn check(text: &str) {
    let mut objs = Objects::default();
    if load_str("fuzz.yaml", text, &mut objs).is_ok() {
        let _ = objs.standalone_claims();
    }
}
