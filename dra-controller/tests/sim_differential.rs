//! Differential test: ≥2,000 random cases (CEL selectors over random devices, and allocations with
//! firstAvailable / All / constraints / counters / taints / already-allocated claims) answered by
//! our simulator and by the Go oracle built against k8s.io/dynamic-resource-allocation v0.37.2
//! (e2e/oracle). Skips with a message when `go` is not installed.
use dra_controller::sim::alloc::{AllocatedState, Allocator, SimNode};
use dra_controller::sim::cel;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value as J, json};
use std::path::PathBuf;
use std::process::{Command, Stdio};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn n(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
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
        m.insert("cores".into(), json!({"int": r.n(5) as i64 * 16 - 8}));
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
    match r.n(22) {
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
                r.n(60) as i64 - 10
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
        19 => format!(
            "device.capacity[\"other.example.com\"].slots.asInteger() > {}",
            r.n(10)
        ),
        20 => format!(
            "isQuantity(\"{}\") && isSemver(\"{}\")",
            r.pick(&["1Gi", "1GB", "1.5"]),
            r.pick(&["1.0.0", "v1.0.0", "1.0"])
        ),
        _ => format!("device.attributes[\"{DRV}\"].all(k, v, k != \"\")"),
    }
}

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

fn sel_list(r: &mut Rng, max: usize) -> J {
    let n = r.n(max + 1);
    J::Array(
        (0..n)
            .map(|_| json!({"cel": {"expression": selector(r, 1)}}))
            .collect(),
    )
}

fn alloc_case(r: &mut Rng) -> J {
    let classes = json!([
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu"},
         "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRV}\"")}}]}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "big"},
         "spec": {"selectors": [{"cel": {"expression": format!("device.capacity[\"{DRV}\"].?memory.orValue(quantity(\"0\")).compareTo(quantity(\"40Gi\")) >= 0")}}],
                  "config": [{"opaque": {"driver": DRV, "parameters": {"k": "v"}}}]}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "strict"},
         "spec": {"selectors": [{"cel": {"expression": format!("device.attributes[\"{DRV}\"].cores > 8")}}]}}
    ]);
    let mut slices = Vec::new();
    let npools = 1 + r.n(2);
    for p in 0..npools {
        let pool = format!("pool-{p}");
        let counters = r.coin(35);
        let nslices = 1 + r.n(2);
        let incomplete = r.coin(8);
        let generation = r.n(2) as i64;
        let node = *r.pick(&["node-a", "node-a", "node-b", "*"]);
        let mut total = nslices + usize::from(counters);
        if incomplete {
            total += 1;
        }
        for s in 0..nslices {
            let mut devs = Vec::new();
            for d in 0..(1 + r.n(4)) {
                let mut dev = json!({"name": format!("d{s}-{d}"), "attributes": rand_attrs(r), "capacity": rand_caps(r)});
                if counters && r.coin(80) {
                    dev["consumesCounters"] = json!([{"counterSet": "cs", "counters": {"mem": {"value": r.pick(&["10Gi", "20Gi", "40Gi"])}}}]);
                }
                if r.coin(15) {
                    dev["taints"] = json!([{"key": r.pick(&["k1", "k2"]), "value": "v", "effect": r.pick(&["NoSchedule", "NoExecute", "None"])}]);
                }
                devs.push(dev);
            }
            let mut spec = json!({"driver": DRV, "pool": {"name": pool, "generation": generation, "resourceSliceCount": total}, "devices": devs});
            if node == "*" {
                spec["allNodes"] = json!(true);
            } else {
                spec["nodeName"] = json!(node);
            }
            slices.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": format!("{pool}-s{}", r.n(3) * 10 + s)}, "spec": spec}));
        }
        if counters {
            let mut spec = json!({"driver": DRV, "pool": {"name": pool, "generation": generation, "resourceSliceCount": total},
                "sharedCounters": [{"name": "cs", "counters": {"mem": {"value": r.pick(&["40Gi", "60Gi", "80Gi"])}}}]});
            if node == "*" {
                spec["allNodes"] = json!(true);
            } else {
                spec["nodeName"] = json!(node);
            }
            slices.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": format!("{pool}-counters")}, "spec": spec}));
        }
    }
    let mut claims = Vec::new();
    for c in 0..(1 + r.n(2)) {
        let mut requests = Vec::new();
        let nreq = 1 + r.n(3);
        for q in 0..nreq {
            let name = format!("r{q}");
            let tol = if r.coin(30) {
                json!([{"key": "k1", "operator": r.pick(&["Exists", "Equal"]), "value": "v"}])
            } else {
                json!([])
            };
            if r.coin(30) {
                let subs: Vec<J> = (0..1 + r.n(3))
                    .map(|i| json!({"name": format!("s{i}"), "deviceClassName": r.pick(&["gpu", "big", "strict"]), "selectors": sel_list(r, 1), "count": 1 + r.n(2), "tolerations": tol}))
                    .collect();
                requests.push(json!({"name": name, "firstAvailable": subs}));
            } else {
                let mut ex = json!({"deviceClassName": r.pick(&["gpu", "big", "strict", "gpu"]), "selectors": sel_list(r, 1), "tolerations": tol});
                if r.coin(12) {
                    ex["allocationMode"] = json!("All");
                } else {
                    ex["count"] = json!(1 + r.n(3));
                }
                if r.coin(10) {
                    ex["adminAccess"] = json!(true);
                }
                requests.push(json!({"name": name, "exactly": ex}));
            }
        }
        let mut constraints = Vec::new();
        if r.coin(35) {
            let attr = r
                .pick(&[
                    "gpu.example.com/model",
                    "gpu.example.com/pcieRoot",
                    "other.example.com/zone",
                ])
                .to_string();
            let reqs: Vec<String> = if r.coin(50) {
                vec![]
            } else {
                vec!["r0".into()]
            };
            if r.coin(60) {
                constraints.push(json!({"requests": reqs, "matchAttribute": attr}));
            } else {
                constraints.push(json!({"requests": reqs, "distinctAttribute": attr}));
            }
        }
        let config = if r.coin(30) {
            json!([{"requests": ["r0"], "opaque": {"driver": DRV, "parameters": {"a": 1}}}])
        } else {
            json!([])
        };
        claims.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": format!("c{c}"), "namespace": "default"},
            "spec": {"devices": {"requests": requests, "constraints": constraints, "config": config}}}));
    }
    let mut allocated = Vec::new();
    if r.coin(30) {
        allocated.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "old", "namespace": "default"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": [{"request": "x", "driver": DRV, "pool": "pool-0", "device": format!("d0-{}", r.n(3))}]}}}}));
    }
    json!({"classes": classes, "slices": slices, "claims": claims, "allocated": allocated, "node": {"name": "node-a", "labels": {}}})
}

fn oracle() -> Option<PathBuf> {
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

fn rust_eval(e: &J) -> (String, String) {
    let expr = e["expression"].as_str().expect("expression");
    let d = &e["device"];
    let attrs = serde_json::from_value(d["Attributes"].clone()).expect("attributes");
    let caps = serde_json::from_value(d["Capacity"].clone()).expect("capacity");
    let prog = match cel::compile(expr) {
        Ok(p) => p,
        Err(m) => return ("compile_error".into(), m),
    };
    let dev = cel::device_value(
        DRV,
        Some(&attrs),
        Some(&caps),
        d["AllowMultipleAllocations"].as_bool().unwrap_or(false),
    )
    .expect("device");
    match prog.eval(&dev) {
        Ok(b) => (b.to_string(), String::new()),
        Err(m) => ("error".into(), m),
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
        name: "node-a".into(),
        labels: Default::default(),
    };
    match a.allocate(&node, &claims) {
        Ok(Some(res)) => json!({"status": "ok", "results": res}),
        Ok(None) => json!({"status": "unsatisfiable"}),
        Err(e) => json!({"status": "error", "error": e}),
    }
}

/// The comparable part of an allocation: per claim, (request, driver, pool, device, adminAccess)
/// in order, plus the config entries.
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
                                x["pool"],
                                x["device"],
                                x["adminAccess"].as_bool().unwrap_or(false)
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
                                x["requests"].as_array().cloned().unwrap_or_default()
                            ])
                        })
                        .collect();
                    json!({"devices": devs, "config": cfg})
                })
                .collect()
        })
        .unwrap_or_default();
    json!({"status": a["status"], "results": results})
}

#[test]
fn differential_against_go_oracle() {
    let Some(bin) = oracle() else { return };
    let mut r = Rng(0x9e3779b97f4a7c15);
    let mut cases = Vec::new();
    let mut n_evals = 0;
    let mut n_allocs = 0;
    for i in 0..1400 {
        let mut c = if i % 2 == 0 {
            n_allocs += 1;
            alloc_case(&mut r)
        } else {
            json!({})
        };
        let evals: Vec<J> = (0..2)
            .map(|_| json!({"expression": selector(&mut r, 3), "device": eval_device(&mut r)}))
            .collect();
        n_evals += evals.len();
        c["evals"] = J::Array(evals);
        cases.push(c);
    }
    assert!(n_evals + n_allocs >= 2000);
    let cases = J::Array(cases);
    let answers = run_oracle(&bin, &cases);
    let mut mismatches = Vec::new();
    let mut agreement = std::collections::BTreeMap::<String, usize>::new();
    for (i, (c, want)) in cases
        .as_array()
        .expect("cases")
        .iter()
        .zip(answers.iter())
        .enumerate()
    {
        for (j, e) in c["evals"].as_array().expect("evals").iter().enumerate() {
            let (kind, msg) = rust_eval(e);
            let w = &want["evals"][j];
            let wkind = w["result"].as_str().unwrap_or("");
            let wmsg = w["message"].as_str().unwrap_or("");
            *agreement.entry(format!("eval:{wkind}")).or_default() += 1;
            let same_key_error = wmsg.contains("no such key") == msg.contains("no such key");
            if kind != wkind || !same_key_error {
                mismatches.push(format!(
                    "case {i} eval {j}: {}\n  go:   {wkind} {wmsg}\n  rust: {kind} {msg}",
                    e["expression"]
                ));
            }
        }
        if c.get("slices").is_some() {
            let got = rust_alloc(c);
            *agreement
                .entry(format!("alloc:{}", want["status"].as_str().unwrap_or("")))
                .or_default() += 1;
            if essence(&got) != essence(want) {
                mismatches.push(format!(
                    "case {i} allocation:\n  go:   {}\n  rust: {}\n  go error: {}\n  rust error: {}",
                    essence(want),
                    essence(&got),
                    want["error"],
                    got["error"]
                ));
            }
        }
    }
    eprintln!(
        "differential: {n_evals} CEL evaluations + {n_allocs} allocations; outcomes {agreement:?}; {} mismatches",
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
}
