//! Allocator cases ported from the facts of the upstream structured allocator test table
//! (k8s.io/dynamic-resource-allocation/structured, allocator_testing.go), written as our own
//! table: each case names the upstream scenario it follows, builds the objects with small helpers
//! and states the expected outcome — the devices per claim in result order, "unsatisfiable", or an
//! error containing a given text.
//!
//! One file over 600 lines on purpose: it is one table of cases, read top to bottom against the
//! upstream table it follows.
use dra_sim::alloc::{AllocatedState, Allocator, DeviceCache, SimNode, SliceFacts};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value as J, json};
use std::sync::Arc;

const DRV: &str = "driver.example.com";
const NODE: &str = "node-1";

fn class(name: &str, expr: Option<&str>) -> J {
    let spec = match expr {
        Some(e) => json!({"selectors": [{"cel": {"expression": e}}]}),
        None => json!({}),
    };
    json!({"metadata": {"name": name}, "spec": spec})
}

fn classes() -> Vec<J> {
    vec![
        class("gpu", Some(&format!("device.driver == '{DRV}'"))),
        class("empty", None),
        class(
            "mig",
            Some(&format!(
                "device.attributes['{DRV}'].?kind.orValue('') == 'mig'"
            )),
        ),
        json!({"metadata": {"name": "with-config"}, "spec": {
            "selectors": [{"cel": {"expression": format!("device.driver == '{DRV}'")}}],
            "config": [{"opaque": {"driver": DRV, "parameters": {"from": "class"}}}]}}),
    ]
}

fn dev(name: &str) -> J {
    json!({"name": name})
}

fn dev_attr(name: &str, attrs: J) -> J {
    json!({"name": name, "attributes": attrs})
}

fn slice(
    name: &str,
    pool: &str,
    generation: i64,
    count: i64,
    node: Option<&str>,
    devices: Vec<J>,
) -> J {
    let mut spec = json!({"driver": DRV, "pool": {"name": pool, "generation": generation, "resourceSliceCount": count}, "devices": devices});
    match node {
        Some(n) => spec["nodeName"] = json!(n),
        None => spec["allNodes"] = json!(true),
    }
    json!({"metadata": {"name": name}, "spec": spec})
}

fn local(devices: Vec<J>) -> J {
    slice("slice-1", "pool-1", 1, 1, Some(NODE), devices)
}

fn req(name: &str, class: &str, count: i64) -> J {
    json!({"name": name, "exactly": {"deviceClassName": class, "count": count}})
}

fn req_sel(name: &str, class: &str, count: i64, expr: &str) -> J {
    json!({"name": name, "exactly": {"deviceClassName": class, "count": count, "selectors": [{"cel": {"expression": expr}}]}})
}

fn req_all(name: &str, class: &str) -> J {
    json!({"name": name, "exactly": {"deviceClassName": class, "allocationMode": "All"}})
}

fn claim(name: &str, requests: Vec<J>) -> J {
    json!({"metadata": {"name": name, "namespace": "default"}, "spec": {"devices": {"requests": requests}}})
}

fn claim_with(name: &str, requests: Vec<J>, extra: J) -> J {
    let mut c = claim(name, requests);
    for (k, v) in extra.as_object().expect("object") {
        c["spec"]["devices"][k] = v.clone();
    }
    c
}

fn allocated(name: &str, results: Vec<J>) -> J {
    json!({"metadata": {"name": name, "namespace": "default"}, "spec": {"devices": {"requests": []}},
           "status": {"allocation": {"devices": {"results": results}}}})
}

fn result(device: &str) -> J {
    json!({"request": "x", "driver": DRV, "pool": "pool-1", "device": device})
}

#[derive(Debug, PartialEq)]
enum Want {
    /// per claim: (request, device) in result order
    Ok(Vec<Vec<(&'static str, &'static str)>>),
    Unsatisfiable,
    Error(&'static str),
}

struct Case {
    name: &'static str,
    slices: Vec<J>,
    claims: Vec<J>,
    allocated: Vec<J>,
    want: Want,
}

fn case(name: &'static str, slices: Vec<J>, claims: Vec<J>, want: Want) -> Case {
    Case {
        name,
        slices,
        claims,
        allocated: vec![],
        want,
    }
}

fn run_case(c: &Case) -> (Want, Option<Vec<J>>) {
    let classes: Vec<DeviceClass> = serde_json::from_value(J::Array(classes())).expect("classes");
    let slices: Vec<ResourceSlice> =
        serde_json::from_value(J::Array(c.slices.clone())).expect("slices");
    let claims: Vec<ResourceClaim> =
        serde_json::from_value(J::Array(c.claims.clone())).expect("claims");
    let allocated: Vec<ResourceClaim> =
        serde_json::from_value(J::Array(c.allocated.clone())).expect("allocated");
    let a = Allocator::new(&classes, &slices, AllocatedState::from_claims(&allocated));
    let node = SimNode {
        name: NODE.into(),
        labels: [("zone".to_string(), "a".to_string())].into(),
    };
    let outcome = a.allocate(&node, &claims);
    // The same answer, errors included, with every slice's facts computed before the search
    // (the slice store of `sim-bench`) instead of when the search reaches them.
    let facts = Arc::new(SliceFacts::build(&slices));
    let stored = Allocator::with_cache(
        &classes,
        &slices,
        AllocatedState::from_claims(&allocated),
        Arc::new(DeviceCache::with_facts(&slices, facts)),
    );
    assert_eq!(
        stored.allocate(&node, &claims),
        outcome,
        "{}: with slice facts built up front",
        c.name
    );
    match outcome {
        Ok(None) => (Want::Unsatisfiable, None),
        Err(e) => {
            // report the whole message; the comparison below checks containment
            (Want::Error(Box::leak(e.into_boxed_str())), None)
        }
        Ok(Some(res)) => {
            let json: Vec<J> = res
                .iter()
                .map(|r| serde_json::to_value(r).expect("result json"))
                .collect();
            let devs = res
                .iter()
                .map(|r| {
                    r.devices
                        .as_ref()
                        .and_then(|d| d.results.as_ref())
                        .into_iter()
                        .flatten()
                        .map(|x| {
                            (
                                &*Box::leak(x.request.clone().into_boxed_str()),
                                &*Box::leak(x.device.clone().into_boxed_str()),
                            )
                        })
                        .collect()
                })
                .collect();
            (Want::Ok(devs), Some(json))
        }
    }
}

fn check(c: &Case) -> Option<Vec<J>> {
    let (got, json) = run_case(c);
    match (&c.want, &got) {
        (Want::Error(w), Want::Error(g)) => {
            assert!(
                g.contains(w),
                "{}: error {g:?} does not contain {w:?}",
                c.name
            )
        }
        _ => assert_eq!(got, c.want, "{}", c.name),
    }
    json
}

fn gpus(n: usize) -> Vec<J> {
    (0..n).map(|i| dev(&format!("gpu-{i}"))).collect()
}

#[test]
fn basic_cases() {
    let cases = vec![
        case(
            "simple",
            vec![local(gpus(1))],
            vec![claim("c", vec![req("r", "gpu", 1)])],
            Want::Ok(vec![vec![("r", "gpu-0")]]),
        ),
        case(
            "other-node",
            vec![slice("s", "pool-1", 1, 1, Some("node-2"), gpus(1))],
            vec![claim("c", vec![req("r", "gpu", 1)])],
            Want::Unsatisfiable,
        ),
        case(
            "no-slices",
            vec![],
            vec![claim("c", vec![req("r", "gpu", 1)])],
            Want::Unsatisfiable,
        ),
        case(
            "not-enough-suitable-devices",
            vec![local(gpus(1))],
            vec![claim("c", vec![req("r", "gpu", 2)])],
            Want::Unsatisfiable,
        ),
        case(
            "unknown-class",
            vec![local(gpus(1))],
            vec![claim("c", vec![req("r", "nope", 1)])],
            Want::Error("could not retrieve device class nope"),
        ),
        case(
            "empty-class",
            vec![local(gpus(1))],
            vec![claim("c", vec![req("r", "empty", 1)])],
            Want::Ok(vec![vec![("r", "gpu-0")]]),
        ),
        case(
            "devices-split-across-different-slices",
            vec![
                slice("s-b", "pool-1", 1, 2, Some(NODE), vec![dev("b")]),
                slice("s-a", "pool-1", 1, 2, Some(NODE), vec![dev("a")]),
            ],
            vec![claim("c", vec![req("r", "gpu", 2)])],
            // slices are visited by name
            Want::Ok(vec![vec![("r", "a"), ("r", "b")]]),
        ),
        case(
            "obsolete-slice",
            vec![
                slice("old", "pool-1", 1, 1, Some(NODE), vec![dev("old-dev")]),
                slice("new", "pool-1", 2, 1, Some(NODE), vec![dev("new-dev")]),
            ],
            vec![claim("c", vec![req("r", "gpu", 1)])],
            Want::Ok(vec![vec![("r", "new-dev")]]),
        ),
        case(
            "small-and-large-backtrack-requests",
            vec![local(vec![
                dev_attr("large", json!({"size": {"int": 2}})),
                dev_attr("small", json!({"size": {"int": 1}})),
            ])],
            vec![claim(
                "c",
                vec![
                    req("any", "gpu", 1),
                    req_sel(
                        "big",
                        "gpu",
                        1,
                        &format!("device.attributes['{DRV}'].size == 2"),
                    ),
                ],
            )],
            Want::Ok(vec![vec![("any", "small"), ("big", "large")]]),
        ),
        case(
            "small-and-large-backtrack-claims",
            vec![local(vec![
                dev_attr("large", json!({"size": {"int": 2}})),
                dev_attr("small", json!({"size": {"int": 1}})),
            ])],
            vec![
                claim("c1", vec![req("any", "gpu", 1)]),
                claim(
                    "c2",
                    vec![req_sel(
                        "big",
                        "gpu",
                        1,
                        &format!("device.attributes['{DRV}'].size == 2"),
                    )],
                ),
            ],
            Want::Ok(vec![vec![("any", "small")], vec![("big", "large")]]),
        ),
        case(
            "all-devices-single",
            vec![local(gpus(2))],
            vec![claim("c", vec![req_all("r", "gpu")])],
            Want::Ok(vec![vec![("r", "gpu-0"), ("r", "gpu-1")]]),
        ),
        case(
            "all-devices-of-the-incomplete-pool",
            vec![slice("s", "pool-1", 1, 2, Some(NODE), gpus(1))],
            vec![claim("c", vec![req_all("r", "gpu")])],
            Want::Error("is currently being updated"),
        ),
        case(
            "all-devices-plus-another",
            vec![local(gpus(2))],
            vec![claim(
                "c",
                vec![req_all("all", "gpu"), req("one", "gpu", 1)],
            )],
            Want::Unsatisfiable,
        ),
        case(
            "too-many-devices-single-request",
            vec![local(gpus(33))],
            vec![claim("c", vec![req("r", "gpu", 33)])],
            Want::Error("exceeds the claim limit of 32"),
        ),
        case(
            "many-devices-okay",
            vec![local(gpus(32))],
            vec![claim("c", vec![req("r", "gpu", 1)])],
            Want::Ok(vec![vec![("r", "gpu-0")]]),
        ),
        case(
            "invalid-CEL-one-device",
            vec![local(gpus(1))],
            vec![claim(
                "c",
                vec![req_sel(
                    "r",
                    "gpu",
                    1,
                    &format!("device.attributes['{DRV}'].missing == 1"),
                )],
            )],
            Want::Error("CEL runtime error: no such key: missing"),
        ),
        case(
            "duplicate-device-names-invalid-pool",
            vec![local(vec![dev("x"), dev("x")])],
            vec![claim("c", vec![req("r", "gpu", 1)])],
            Want::Error("invalid resource pools were encountered"),
        ),
    ];
    let n = cases.len();
    for c in &cases {
        check(c);
    }
    assert!(n >= 17);
}

#[test]
fn already_allocated_and_admin_access() {
    let mut c = case(
        "already-allocated-devices",
        vec![local(gpus(2))],
        vec![claim("c", vec![req("r", "gpu", 1)])],
        Want::Ok(vec![vec![("r", "gpu-1")]]),
    );
    c.allocated = vec![allocated("old", vec![result("gpu-0")])];
    check(&c);

    let mut c = case(
        "all-devices-some-allocated",
        vec![local(gpus(2))],
        vec![claim("c", vec![req_all("r", "gpu")])],
        Want::Unsatisfiable,
    );
    c.allocated = vec![allocated("old", vec![result("gpu-0")])];
    check(&c);

    let admin = json!({"name": "r", "exactly": {"deviceClassName": "gpu", "allocationMode": "All", "adminAccess": true}});
    let mut c = case(
        "all-devices-some-allocated-admin-access",
        vec![local(gpus(2))],
        vec![claim("c", vec![admin])],
        Want::Ok(vec![vec![("r", "gpu-0"), ("r", "gpu-1")]]),
    );
    c.allocated = vec![allocated("old", vec![result("gpu-0")])];
    let json = check(&c).expect("allocated");
    assert_eq!(json[0]["devices"]["results"][0]["adminAccess"], json!(true));
}

#[test]
fn constraints() {
    let devs = || {
        vec![local(vec![
            dev_attr("a1", json!({"model": {"string": "a"}, "numa": {"int": 0}})),
            dev_attr("b1", json!({"model": {"string": "b"}, "numa": {"int": 1}})),
            dev_attr("a2", json!({"model": {"string": "a"}, "numa": {"int": 1}})),
        ])]
    };
    let m = |attr: &str| json!({"constraints": [{"matchAttribute": format!("{DRV}/{attr}")}]});
    let d = |attr: &str| json!({"constraints": [{"distinctAttribute": format!("{DRV}/{attr}")}]});
    check(&case(
        "with-constraint",
        devs(),
        vec![claim_with("c", vec![req("r", "gpu", 2)], m("model"))],
        Want::Ok(vec![vec![("r", "a1"), ("r", "a2")]]),
    ));
    check(&case(
        "with-constraint-non-existent-attribute",
        devs(),
        vec![claim_with("c", vec![req("r", "gpu", 1)], m("nope"))],
        Want::Unsatisfiable,
    ));
    check(&case(
        "with-constraint-not-matching-int-attribute",
        devs(),
        vec![claim_with("c", vec![req("r", "gpu", 3)], m("numa"))],
        Want::Unsatisfiable,
    ));
    check(&case(
        "with-distinct-constraints",
        devs(),
        vec![claim_with("c", vec![req("r", "gpu", 2)], d("model"))],
        Want::Ok(vec![vec![("r", "a1"), ("r", "b1")]]),
    ));
    check(&case(
        "distinct-constraint-single-request-not-enough-distinct-values",
        devs(),
        vec![claim_with("c", vec![req("r", "gpu", 3)], d("numa"))],
        Want::Unsatisfiable,
    ));
    // constraint for one request only: the other request is free to take anything
    let one =
        json!({"constraints": [{"requests": ["pair"], "matchAttribute": format!("{DRV}/numa")}]});
    check(&case(
        "with-constraint-for-request",
        devs(),
        vec![claim_with(
            "c",
            vec![req("single", "gpu", 1), req("pair", "gpu", 2)],
            one,
        )],
        Want::Ok(vec![vec![("single", "a1"), ("pair", "b1"), ("pair", "a2")]]),
    ));
    check(&case(
        "with-constraint-not-matching-int-attribute-all-devices",
        devs(),
        vec![claim_with("c", vec![req_all("r", "gpu")], m("numa"))],
        Want::Error("constraint would not be satisfied"),
    ));
}

#[test]
fn prioritized_list() {
    let fa = |subs: Vec<J>| json!({"name": "r", "firstAvailable": subs});
    let sub = |name: &str, class: &str, count: i64| json!({"name": name, "deviceClassName": class, "count": count});
    check(&case(
        "prioritized-list-first-unavailable",
        vec![local(gpus(1))],
        vec![claim(
            "c",
            vec![fa(vec![sub("s0", "mig", 1), sub("s1", "gpu", 1)])],
        )],
        Want::Ok(vec![vec![("r/s1", "gpu-0")]]),
    ));
    check(&case(
        "prioritized-list-non-available",
        vec![local(gpus(1))],
        vec![claim(
            "c",
            vec![fa(vec![sub("s0", "gpu", 2), sub("s1", "mig", 1)])],
        )],
        Want::Unsatisfiable,
    ));
    // global backtracking: the first subrequest fits alone but starves the next request
    check(&case(
        "prioritized-list-with-backtracking",
        vec![local(gpus(2))],
        vec![claim(
            "c",
            vec![
                fa(vec![sub("s0", "gpu", 2), sub("s1", "gpu", 1)]),
                req("next", "gpu", 1),
            ],
        )],
        Want::Ok(vec![vec![("r/s1", "gpu-0"), ("next", "gpu-1")]]),
    ));
    let json = check(&case(
        "prioritized-list-class-config",
        vec![local(gpus(1))],
        vec![claim(
            "c",
            vec![fa(vec![sub("s0", "mig", 1), sub("s1", "with-config", 1)])],
        )],
        Want::Ok(vec![vec![("r/s1", "gpu-0")]]),
    ))
    .expect("allocated");
    let cfg = &json[0]["devices"]["config"][0];
    assert_eq!(cfg["source"], "FromClass");
    assert_eq!(cfg["opaque"]["parameters"]["from"], "class");
}

#[test]
fn partitionable_devices() {
    let counters = json!({"metadata": {"name": "slice-0-counters"}, "spec": {"driver": DRV, "nodeName": NODE,
        "pool": {"name": "pool-1", "generation": 1, "resourceSliceCount": 2},
        "sharedCounters": [{"name": "gpu-0-cs", "counters": {"memory": {"value": "8Gi"}}}]}});
    let consumes =
        |q: &str| json!([{"counterSet": "gpu-0-cs", "counters": {"memory": {"value": q}}}]);
    let devices = json!({"metadata": {"name": "slice-1"}, "spec": {"driver": DRV, "nodeName": NODE,
    "pool": {"name": "pool-1", "generation": 1, "resourceSliceCount": 2},
    "devices": [
        {"name": "gpu-0", "attributes": {"kind": {"string": "gpu"}}, "consumesCounters": consumes("8Gi")},
        {"name": "mig-a", "attributes": {"kind": {"string": "mig"}}, "consumesCounters": consumes("4Gi")},
        {"name": "mig-b", "attributes": {"kind": {"string": "mig"}}, "consumesCounters": consumes("4Gi")},
    ]}});
    let s = || vec![counters.clone(), devices.clone()];
    check(&case(
        "partitionable-devices-single-device",
        s(),
        vec![claim("c", vec![req("r", "gpu", 1)])],
        Want::Ok(vec![vec![("r", "gpu-0")]]),
    ));
    check(&case(
        "partitionable-devices-multiple-devices",
        s(),
        vec![claim("c", vec![req("r", "mig", 2)])],
        Want::Ok(vec![vec![("r", "mig-a"), ("r", "mig-b")]]),
    ));
    // the whole GPU and a slice of it share the counter: not both
    check(&case(
        "partitionable-devices-no-capacity-available",
        s(),
        vec![claim(
            "c",
            vec![
                req_sel(
                    "whole",
                    "gpu",
                    1,
                    &format!("device.attributes['{DRV}'].kind == 'gpu'"),
                ),
                req("part", "mig", 1),
            ],
        )],
        Want::Unsatisfiable,
    ));
    let mut c = case(
        "partitionable-devices-overallocated-capacity-pool",
        s(),
        vec![claim("c", vec![req("r", "mig", 1)])],
        Want::Unsatisfiable,
    );
    c.allocated = vec![allocated("old", vec![result("gpu-0")])];
    check(&c);
    // an unknown counter set makes the pool invalid
    let mut bad = devices.clone();
    bad["spec"]["devices"][0]["consumesCounters"][0]["counterSet"] = json!("nope");
    check(&case(
        "partitionable-devices-invalid-counter-set",
        vec![counters.clone(), bad],
        vec![claim("c", vec![req("r", "gpu", 1)])],
        Want::Error("invalid resource pools"),
    ));
    // a counter its set does not have, on the last device, behind many counters that exist
    // (long lists of counter names take another path than short ones; names over 16 bytes that
    // differ only in the middle are told apart by more than their ends)
    for (known, long) in [(1usize, false), (40, false), (3, true)] {
        let name = |i: &str| {
            if long {
                format!("aaaaaaaa-{i}-bbbbbbbb")
            } else {
                format!("c{i}")
            }
        };
        let names: Vec<String> = (0..known).map(|i| name(&format!("{i:02}"))).collect();
        let set: serde_json::Map<String, J> = names
            .iter()
            .map(|n| (n.clone(), json!({"value": "1"})))
            .collect();
        let mut counters = counters.clone();
        counters["spec"]["sharedCounters"][0]["counters"] = J::Object(set.clone());
        let devices_with = |extra: Option<&str>| {
            let devices: Vec<J> = (0..3)
                .map(|d| {
                    let mut use_ = set.clone();
                    if let (2, Some(x)) = (d, extra) {
                        use_.insert(x.to_string(), json!({"value": "1"}));
                    }
                    json!({"name": format!("dev-{d}"),
                        "consumesCounters": [{"counterSet": "gpu-0-cs", "counters": use_}]})
                })
                .collect();
            json!({"metadata": {"name": "slice-1"}, "spec": {"driver": DRV, "nodeName": NODE,
                "pool": {"name": "pool-1", "generation": 1, "resourceSliceCount": 2},
                "devices": devices}})
        };
        check(&case(
            "partitionable-devices-known-counters",
            vec![counters.clone(), devices_with(None)],
            vec![claim("c", vec![req("r", "empty", 1)])],
            Want::Ok(vec![vec![("r", "dev-0")]]),
        ));
        check(&case(
            "partitionable-devices-unknown-counter",
            vec![counters.clone(), devices_with(Some(&name("zz")))],
            vec![claim("c", vec![req("r", "empty", 1)])],
            Want::Error("invalid resource pools"),
        ));
    }
}

#[test]
fn taints() {
    let tainted = |effect: &str| {
        vec![local(vec![
            json!({"name": "gpu-0", "taints": [{"key": "k", "value": "v", "effect": effect}]}),
            json!({"name": "gpu-1", "taints": [{"key": "k", "value": "v", "effect": effect}]}),
        ])]
    };
    check(&case(
        "tainted-two-devices",
        tainted("NoSchedule"),
        vec![claim("c", vec![req("r", "gpu", 1)])],
        Want::Unsatisfiable,
    ));
    check(&case(
        "tainted-no-effect",
        tainted("None"),
        vec![claim("c", vec![req("r", "gpu", 1)])],
        Want::Ok(vec![vec![("r", "gpu-0")]]),
    ));
    let tol = json!({"name": "r", "exactly": {"deviceClassName": "gpu", "count": 2,
        "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoExecute"}]}});
    let json = check(&case(
        "tainted-two-devices-tolerated",
        tainted("NoExecute"),
        vec![claim("c", vec![tol.clone()])],
        Want::Ok(vec![vec![("r", "gpu-0"), ("r", "gpu-1")]]),
    ))
    .expect("allocated");
    assert_eq!(
        json[0]["devices"]["results"][0]["tolerations"][0]["key"],
        "k"
    );
    // a toleration for another effect does not help
    check(&case(
        "tainted-other-effect-not-tolerated",
        tainted("NoSchedule"),
        vec![claim("c", vec![tol])],
        Want::Unsatisfiable,
    ));
}

#[test]
fn consumable_capacity() {
    let shared = |name: &str, policy: J| json!({"name": name, "allowMultipleAllocations": true, "capacity": {"memory": policy}});
    let cap_req = |name: &str, q: &str| json!({"name": name, "exactly": {"deviceClassName": "gpu", "count": 1, "capacity": {"requests": {"memory": q}}}});
    let plain = json!({"value": "8Gi"});
    // two shares of one device, then the next device
    let json = check(&case(
        "consumable-capacity-multi-allocatable-device-without-policy-with-capacity-request",
        vec![local(vec![
            shared("s-0", plain.clone()),
            shared("s-1", plain.clone()),
        ])],
        vec![claim(
            "c",
            vec![
                cap_req("a", "4Gi"),
                cap_req("b", "4Gi"),
                cap_req("c", "4Gi"),
            ],
        )],
        Want::Ok(vec![vec![("a", "s-0"), ("b", "s-0"), ("c", "s-1")]]),
    ))
    .expect("allocated");
    let r = &json[0]["devices"]["results"];
    assert_eq!(r[0]["consumedCapacity"]["memory"], "4Gi");
    assert!(r[0]["shareID"].is_string() && r[0]["shareID"] != r[1]["shareID"]);
    // no request: the whole capacity (or the policy default) is consumed
    check(&case(
        "consumable-capacity-multi-allocatable-device-without-policy-without-capacity-request",
        vec![local(vec![shared("s-0", plain.clone())])],
        vec![claim("c", vec![req("a", "gpu", 1), req("b", "gpu", 1)])],
        Want::Unsatisfiable,
    ));
    // a range policy rounds up to the next step: 3Gi with min 1Gi, step 2Gi -> 3Gi; 4Gi -> 5Gi
    let range = json!({"value": "8Gi", "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "step": "2Gi"}}});
    let json = check(&case(
        "consumable-capacity-multi-allocatable-device-with-range-policy-step",
        vec![local(vec![shared("s-0", range.clone())])],
        vec![claim("c", vec![cap_req("a", "4Gi"), cap_req("b", "2Gi")])],
        Want::Ok(vec![vec![("a", "s-0"), ("b", "s-0")]]),
    ))
    .expect("allocated");
    assert_eq!(
        json[0]["devices"]["results"][0]["consumedCapacity"]["memory"],
        "5Gi"
    );
    assert_eq!(
        json[0]["devices"]["results"][1]["consumedCapacity"]["memory"],
        "3Gi"
    );
    // valid values round up to the next listed value; above the largest one is rejected
    let values =
        json!({"value": "8Gi", "requestPolicy": {"default": "2Gi", "validValues": ["2Gi", "4Gi"]}});
    check(&case(
        "consumable-capacity-multi-allocatable-device-with-valid-values-policy-round-up",
        vec![local(vec![shared("s-0", values.clone())])],
        vec![claim("c", vec![cap_req("a", "3Gi")])],
        Want::Ok(vec![vec![("a", "s-0")]]),
    ));
    check(&case(
        "consumable-capacity-multi-allocatable-device-with-request-over-max-sharing-policy",
        vec![local(vec![shared("s-0", values)])],
        vec![claim("c", vec![cap_req("a", "6Gi")])],
        Want::Unsatisfiable,
    ));
    // existing shares count: 6Gi of 8Gi are taken, 4Gi go to the next device
    let mut c = case(
        "consumable-capacity-multi-allocatable-device-with-allocated-capacity-next-device",
        vec![local(vec![
            shared("s-0", plain.clone()),
            shared("s-1", plain.clone()),
        ])],
        vec![claim("c", vec![cap_req("a", "4Gi")])],
        Want::Ok(vec![vec![("a", "s-1")]]),
    );
    c.allocated = vec![allocated(
        "old",
        vec![
            json!({"request": "x", "driver": DRV, "pool": "pool-1", "device": "s-0",
        "shareID": "6f1c6a52-0000-4000-8000-000000000001", "consumedCapacity": {"memory": "6Gi"}}),
        ],
    )];
    check(&c);
    // a dedicated (not multi-allocatable) device with a capacity request is checked but not shared
    check(&case(
        "consumable-capacity-dedicated-device-with-consumable-capacity-request",
        vec![local(vec![
            json!({"name": "d-0", "capacity": {"memory": {"value": "8Gi"}}}),
        ])],
        vec![claim("c", vec![cap_req("a", "4Gi"), cap_req("b", "4Gi")])],
        Want::Unsatisfiable,
    ));
}

#[test]
fn node_selection() {
    let sel = json!({"metadata": {"name": "net"}, "spec": {"driver": DRV, "pool": {"name": "net", "generation": 1, "resourceSliceCount": 1},
        "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]},
        "devices": [dev("net-0")]}});
    let json = check(&case(
        "network-attached-device",
        vec![sel.clone()],
        vec![claim("c", vec![req("r", "gpu", 1)])],
        Want::Ok(vec![vec![("r", "net-0")]]),
    ))
    .expect("allocated");
    assert_eq!(
        json[0]["nodeSelector"]["nodeSelectorTerms"][0]["matchExpressions"][0]["key"],
        "zone"
    );
    let mut other = sel.clone();
    other["spec"]["nodeSelector"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] =
        json!(["b"]);
    check(&case(
        "unsuccessful-allocation-network-attached-device",
        vec![other],
        vec![claim("c", vec![req("r", "gpu", 1)])],
        Want::Unsatisfiable,
    ));
    let per_dev = json!({"metadata": {"name": "pd"}, "spec": {"driver": DRV, "pool": {"name": "pd", "generation": 1, "resourceSliceCount": 1},
        "perDeviceNodeSelection": true,
        "devices": [{"name": "elsewhere", "nodeName": "node-2"}, {"name": "here", "nodeName": NODE}]}});
    let json = check(&case(
        "partitionable-devices-per-device-node-selection-nodename",
        vec![per_dev],
        vec![claim("c", vec![req("r", "gpu", 1)])],
        Want::Ok(vec![vec![("r", "here")]]),
    ))
    .expect("allocated");
    assert_eq!(
        json[0]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"][0],
        NODE
    );
}

#[test]
fn claim_config() {
    let cfg = json!({"config": [{"requests": ["a"], "opaque": {"driver": DRV, "parameters": {"x": 1}}},
                               {"requests": ["a", "b"], "opaque": {"driver": DRV, "parameters": {"y": 2}}}]});
    let json = check(&case(
        "with-claim-config-for-two-requests",
        vec![local(gpus(2))],
        vec![claim_with(
            "c",
            vec![req("a", "gpu", 1), req("b", "gpu", 1)],
            cfg,
        )],
        Want::Ok(vec![vec![("a", "gpu-0"), ("b", "gpu-1")]]),
    ))
    .expect("allocated");
    let c = &json[0]["devices"]["config"];
    assert_eq!(c[0]["source"], "FromClaim");
    assert_eq!(c[0]["requests"], json!(["a"]));
    // a config that names every request is cleared to apply to all
    assert!(c[1].get("requests").is_none_or(|r| r.is_null()), "{c}");
}
