//! ComputeDomainCliques: the cliques planned from daemon pods, the ComputeDomain status built from
//! them, and the CRD checked against NVIDIA's (`sigs.k8s.io/dra-driver-nvidia-gpu@v0.5.0` in the Go
//! module cache; skipped with a message when absent).
use std::collections::BTreeMap;
use std::path::PathBuf;

use dra_controller::controller::cdclique::{Daemon, daemons, plan, status};
use dra_controller::controller::crd::DomainStatus;
use gpu_dra_api::cdclique::{ComputeDomainClique, DaemonInfo};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

fn pod(name: &str, node: &str, ip: &str, ready: bool, clique: Option<&str>) -> Pod {
    let mut labels = json!({ "resource.nvidia.com/computeDomain": "uid1" });
    if let Some(c) = clique {
        labels["resource.nvidia.com/computeDomain.cliqueID"] = json!(c);
    }
    serde_json::from_value(json!({
        "metadata": { "name": name, "uid": format!("uid-{name}"), "labels": labels },
        "spec": { "nodeName": node, "containers": [] },
        "status": { "podIP": ip, "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }] },
    }))
    .unwrap()
}

fn entry(node: &str, ip: &str, index: i32) -> DaemonInfo {
    DaemonInfo {
        node_name: node.into(),
        ip_address: ip.into(),
        clique_id: "cl.1".into(),
        index,
        status: "Ready".into(),
    }
}

#[test]
fn daemons_take_the_pod_label_else_the_node_clique() {
    let nodes = BTreeMap::from([("b".to_string(), "cl.2".to_string())]);
    let d = daemons(
        &[
            pod("pa", "a", "10.0.0.1", true, Some("cl.1")),
            pod("pb", "b", "10.0.0.2", false, None),
            pod("pc", "c", "10.0.0.3", true, None),
        ],
        &nodes,
    );
    let cliques: Vec<&str> = d.iter().map(|d| d.clique_id.as_str()).collect();
    assert_eq!(cliques, ["cl.1", "cl.2", ""]);
    assert!(!d[1].ready);
}

#[test]
fn indices_stay_put_and_new_nodes_fill_the_smallest_gap() {
    let existing: ComputeDomainClique = serde_json::from_value(json!({
        "metadata": { "name": "uid1.cl.1", "namespace": "drv" },
        "daemons": [entry("a", "10.0.0.1", 0), entry("b", "10.0.0.2", 1), entry("c", "10.0.0.3", 2)],
    }))
    .unwrap();
    // b left; d joins and takes index 1; c keeps 2 with its new IP.
    let pods = [
        pod("pa", "a", "10.0.0.1", true, Some("cl.1")),
        pod("pc", "c", "10.0.0.9", false, Some("cl.1")),
        pod("pd", "d", "10.0.0.4", true, Some("cl.1")),
    ];
    let d = daemons(&pods, &BTreeMap::new());
    let wanted = plan("uid1", "drv", &[existing], &d);
    assert_eq!(wanted.len(), 1);
    let c = &wanted[0];
    assert_eq!(c.metadata.name.as_deref(), Some("uid1.cl.1"));
    assert_eq!(c.metadata.namespace.as_deref(), Some("drv"));
    let got: Vec<(&str, &str, i32, &str)> = c
        .daemons
        .iter()
        .map(|d| {
            (
                d.node_name.as_str(),
                d.ip_address.as_str(),
                d.index,
                d.status.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("a", "10.0.0.1", 0, "Ready"),
            ("d", "10.0.0.4", 1, "Ready"),
            ("c", "10.0.0.9", 2, "NotReady")
        ]
    );
    let labels = c.metadata.labels.clone().unwrap();
    assert_eq!(labels["resource.nvidia.com/computeDomain"], "uid1");
    assert_eq!(labels["resource.nvidia.com/computeDomain.cliqueID"], "cl.1");
    let owners: Vec<(String, String)> = c
        .metadata
        .owner_references
        .iter()
        .flatten()
        .map(|o| (o.kind.clone(), o.name.clone()))
        .collect();
    assert_eq!(owners.len(), 3);
    assert!(owners.iter().all(|(k, _)| k == "Pod"), "{owners:?}");
}

#[test]
fn status_lists_clique_daemons_then_nodes_without_fabric() {
    let d = vec![
        Daemon {
            node: "a".into(),
            ip: "10.0.0.1".into(),
            clique_id: "cl.1".into(),
            ready: true,
            pod_name: "pa".into(),
            pod_uid: "u".into(),
        },
        Daemon {
            node: "z".into(),
            ip: "10.0.0.5".into(),
            clique_id: String::new(),
            ready: true,
            pod_name: "pz".into(),
            pod_uid: "v".into(),
        },
    ];
    let cliques = plan("uid1", "drv", &[], &d);
    let s = status(&cliques, &d, 0);
    assert_eq!(s.status, DomainStatus::Ready);
    let v = serde_json::to_value(&s.nodes).unwrap();
    assert_eq!(
        v,
        json!([
            { "name": "a", "ipAddress": "10.0.0.1", "cliqueID": "cl.1", "index": 0, "status": "Ready" },
            { "name": "z", "ipAddress": "10.0.0.5", "cliqueID": "", "index": -1, "status": "Ready" },
        ])
    );
    assert_eq!(status(&cliques, &d, 3).status, DomainStatus::NotReady);
    let mut not_ready = d.clone();
    not_ready[0].ready = false;
    let c = plan("uid1", "drv", &[], &not_ready);
    assert_eq!(status(&c, &not_ready, 0).status, DomainStatus::NotReady);
}

/// NVIDIA's v0.5.0 source in the Go module cache, when present.
fn nvidia_crd(file: &str) -> Option<Value> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let cache = std::env::var("GOMODCACHE").unwrap_or(format!("{home}/go/pkg/mod"));
    let dir = std::env::var_os("E2E_NVIDIA_DRIVER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(cache).join("sigs.k8s.io/dra-driver-nvidia-gpu@v0.5.0"));
    let path = dir
        .join("deployments/helm/dra-driver-nvidia-gpu/crds")
        .join(file);
    let text = std::fs::read_to_string(&path).ok()?;
    Some(serde_yaml::from_str(&text).expect("NVIDIA's CRD is YAML"))
}

fn schema_of(crd: &Value) -> &Value {
    &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
}

/// Every field of NVIDIA's schema exists in ours with the same type, enum, default, required set
/// and list semantics (descriptions may differ).
fn assert_covers(theirs: &Value, ours: &Value, path: &str) {
    for key in [
        "type",
        "enum",
        "default",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
    ] {
        assert_eq!(ours[key], theirs[key], "{path}: {key}");
    }
    let set = |v: &Value| {
        let mut r: Vec<String> = v
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| s.as_str().unwrap().to_string())
            .collect();
        r.sort();
        r
    };
    assert_eq!(
        set(&ours["required"]),
        set(&theirs["required"]),
        "{path}: required"
    );
    if let Some(props) = theirs["properties"].as_object() {
        for (name, sub) in props {
            assert!(
                ours["properties"].get(name).is_some(),
                "{path}.{name} is missing from our schema"
            );
            assert_covers(sub, &ours["properties"][name], &format!("{path}.{name}"));
        }
    }
    if theirs.get("items").is_some() {
        assert_covers(&theirs["items"], &ours["items"], &format!("{path}[]"));
    }
}

#[test]
fn clique_crd_matches_nvidias_schema() {
    let Some(theirs) = nvidia_crd("resource.nvidia.com_computedomaincliques.yaml") else {
        eprintln!(
            "skipped: NVIDIA's driver module is not in the Go module cache; \
             `go mod download sigs.k8s.io/dra-driver-nvidia-gpu@v0.5.0` fetches it"
        );
        return;
    };
    let ours = serde_json::to_value(gpu_dra_api::cdclique::crd()).unwrap();
    for key in ["group", "scope", "names"] {
        assert_eq!(ours["spec"][key], theirs["spec"][key], "spec.{key}");
    }
    assert_eq!(ours["metadata"]["name"], theirs["metadata"]["name"]);
    let version = |v: &Value| {
        let v = &v["spec"]["versions"][0];
        (v["name"].clone(), v["served"].clone(), v["storage"].clone())
    };
    assert_eq!(version(&ours), version(&theirs));
    assert_covers(schema_of(&theirs), schema_of(&ours), "");

    // An object NVIDIA's daemons write (every field set, and one relying on the defaults) reads
    // into our type and back without losing anything.
    let full = json!({
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainClique",
        "metadata": { "name": "uid1.cl.1", "namespace": "nvidia-dra-driver-gpu" },
        "daemons": [
            { "nodeName": "n1", "ipAddress": "10.0.0.1", "cliqueID": "cl.1", "index": 0, "status": "Ready" },
            { "nodeName": "n2", "ipAddress": "10.0.0.2", "cliqueID": "cl.1", "index": 1, "status": "NotReady" },
        ],
    });
    let parsed: ComputeDomainClique = serde_json::from_value(full.clone()).unwrap();
    let mut back = serde_json::to_value(&parsed).unwrap();
    back["apiVersion"] = full["apiVersion"].clone();
    back["kind"] = full["kind"].clone();
    assert_eq!(back["daemons"], full["daemons"]);
    let minimal: ComputeDomainClique = serde_json::from_value(json!({
        "metadata": { "name": "x" },
        "daemons": [{ "nodeName": "n1", "ipAddress": "10.0.0.1", "cliqueID": "cl.1" }],
    }))
    .unwrap();
    assert_eq!(minimal.daemons[0].status, "NotReady");
}

#[test]
fn computedomain_status_nodes_match_nvidias_schema() {
    let Some(theirs) = nvidia_crd("resource.nvidia.com_computedomains.yaml") else {
        eprintln!("skipped: NVIDIA's driver module is not in the Go module cache");
        return;
    };
    let ours = serde_json::to_value(
        <dra_controller::controller::crd::ComputeDomain as kube::CustomResourceExt>::crd(),
    )
    .unwrap();
    let nodes = |crd: &Value| schema_of(crd)["properties"]["status"]["properties"]["nodes"].clone();
    let (t, o) = (nodes(&theirs), nodes(&ours));
    for field in ["name", "ipAddress", "cliqueID", "index", "status"] {
        assert_eq!(
            o["items"]["properties"][field]["type"], t["items"]["properties"][field]["type"],
            "status.nodes[].{field}"
        );
    }
}
