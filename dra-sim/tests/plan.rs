//! The migration planner on its worked example (`examples/plan/`): which pods fit where, the
//! claims it writes, and that what it writes reads back through the simulator's own loader and
//! simulates to the same placements.
use dra_sim::cli::{SimulateArgs, build_scenario, run_pods, write_files};
use dra_sim::input::{self, Objects};
use dra_sim::plan::{Plan, PoolSelection, make_plan};
use dra_sim::workloads::PodOutcome;
use serde_json::Value;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn dump() -> PathBuf {
    root().join(DUMP)
}

/// The example's plan; the dump is named as from the repository root, as in the expected files.
fn example_plan() -> Plan {
    let text = std::fs::read_to_string(dump()).expect("the dump");
    let mut objs = Objects::default();
    input::load_str(DUMP, &text, &mut objs).expect("the dump loads");
    let pool = PoolSelection::selector("nvidia.com/gpu.present=true").unwrap();
    make_plan(&objs, &pool).expect("plans")
}

const DUMP: &str = "examples/plan/cluster-dump.yaml";

/// Compares `got` with the expected file `examples/plan/<name>`; `UPDATE_EXPECTED=1` rewrites it.
fn expect_file(name: &str, got: &str) {
    let path = root().join("examples/plan").join(name);
    if std::env::var_os("UPDATE_EXPECTED").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        want == got,
        "examples/plan/{name} differs from the planner's output (UPDATE_EXPECTED=1 rewrites \
         it after checking the change):\n--- want\n{want}\n--- got\n{got}"
    );
}

#[test]
fn the_example_report_and_manifests_are_as_expected() {
    let plan = example_plan();
    expect_file("expected-report.txt", &dra_sim::plan::render_report(&plan));
    for f in &plan.files {
        expect_file(&format!("expected/{}", f.name), &f.text);
    }
    let written: Vec<String> = std::fs::read_dir(root().join("examples/plan/expected"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(written.len(), plan.files.len(), "{written:?}");
}

/// (pod, node, devices) of every placed pod, in order.
fn placements(pods: &[PodOutcome]) -> Vec<(String, String, Vec<String>)> {
    pods.iter()
        .filter_map(|p| {
            let node = p.node.clone()?;
            let devices = p
                .claims
                .iter()
                .flat_map(|c| c.allocation.devices.iter())
                .flat_map(|d| d.results.iter().flatten())
                .map(|r| r.device.clone())
                .collect();
            Some((p.pod.clone(), node, devices))
        })
        .collect()
}

fn p(pod: &str, node: &str, devices: &[&str]) -> (String, String, Vec<String>) {
    (
        pod.into(),
        node.into(),
        devices.iter().map(|d| d.to_string()).collect(),
    )
}

#[test]
fn the_example_places_every_pod_but_the_eight_gpu_job() {
    let plan = example_plan();
    let want = vec![
        p(
            "default/mig-probe",
            "gpu-h100-mig",
            &["gpu-0-mig-1g10gb-19-0"],
        ),
        p(
            "default/notebook",
            "gpu-a100-mig",
            &["gpu-0-mig-3g20gb-9-4"],
        ),
        p("default/web-0", "gpu-h100", &["gpu-0"]),
        p("default/web-1", "gpu-h100", &["gpu-1"]),
        p("default/web-2", "gpu-h100", &["gpu-2"]),
        p("inference/ts-infer-0", "gpu-l4-ts", &["gpu-0"]),
        p("inference/ts-infer-1", "gpu-l4-ts", &["gpu-0"]),
        p("inference/ts-infer-2", "gpu-l4-ts", &["gpu-0"]),
        p("ml/train-0", "gpu-h100", &["gpu-3", "gpu-4"]),
    ];
    assert_eq!(placements(&plan.pods), want);
    let pending: Vec<&PodOutcome> = plan.pods.iter().filter(|p| p.node.is_none()).collect();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].pod, "ml/big-train-0");
    // every GPU node refused it, each with the allocator's counts
    let refused: Vec<&str> = pending[0].refused.iter().map(|r| r.node.as_str()).collect();
    assert_eq!(
        refused,
        ["gpu-a100-mig", "gpu-h100", "gpu-h100-mig", "gpu-l4-ts"]
    );
    assert!(
        pending[0]
            .refused
            .iter()
            .all(|r| !r.unsatisfiable.is_empty())
    );
    // the pods of controllers in the dump are planned through them, not twice
    assert_eq!(plan.pods.len(), 10);
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("web-7c9d8f6b5-x2x4k") && n.contains("Deployment web")),
        "{:?}",
        plan.notes
    );
}

#[test]
fn the_pool_is_read_from_the_gpu_feature_discovery_labels() {
    let plan = example_plan();
    let nodes: Vec<(&str, &str, u32)> = plan
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.product.as_deref().unwrap_or("-"), n.gpus))
        .collect();
    assert_eq!(
        nodes,
        [
            ("gpu-a100-mig", "NVIDIA A100-SXM4-40GB", 2),
            ("gpu-h100", "NVIDIA H100 80GB HBM3", 8),
            ("gpu-h100-mig", "NVIDIA H100 80GB HBM3", 1),
            ("gpu-l4-ts", "NVIDIA L4", 1),
        ]
    );
    assert_eq!(
        plan.settings["gpu-l4-ts"],
        "--feature-gates TimeSlicingSettings=true,ConsumableShares=true --consumable-shares 4"
    );
    // the time-sliced L4 publishes its GPU with 4 shares
    let l4 = plan
        .slices
        .iter()
        .filter(|s| s.spec.node_name.as_deref() == Some("gpu-l4-ts"))
        .flat_map(|s| s.spec.devices.iter().flatten())
        .find(|d| d.name == "gpu-0")
        .expect("gpu-0 on gpu-l4-ts");
    assert_eq!(l4.allow_multiple_allocations, Some(true));
    assert_eq!(l4.capacity.as_ref().unwrap()["shares"].value.0, "4");
}

#[test]
fn the_gpus_fill_and_what_is_left() {
    let plan = example_plan();
    let row = |node: &str, gpu: &str| {
        let g = plan
            .gpus
            .iter()
            .find(|g| g.node == node && g.gpu == gpu)
            .unwrap();
        (g.percent, g.used.clone())
    };
    assert_eq!(row("gpu-l4-ts", "gpu-0"), (75, "3 of 4 shares".into()));
    assert_eq!(row("gpu-h100", "gpu-4"), (100, "whole GPU".into()));
    assert_eq!(row("gpu-h100", "gpu-5"), (0, "free".into()));
    assert_eq!(
        row("gpu-h100-mig", "gpu-0"),
        (14, "1 of 7 MIG devices: 1g.10gb x1".into())
    );
    assert_eq!(plan.free.whole_gpus.get("gpu-h100"), Some(&3));
    assert_eq!(plan.free.whole_gpus.len(), 1);
    assert_eq!(plan.free.mig_devices["gpu-h100-mig"]["1g.10gb"], 6);
    assert_eq!(plan.free.mig_devices["gpu-a100-mig"]["3g.20gb"], 1);
    assert_eq!(plan.free.mig_devices["gpu-a100-mig"]["1g.5gb"], 4);
    assert_eq!(plan.free.shares["gpu-l4-ts/gpu-0"], "1 of 4");
}

/// The documents of a planned file, as JSON.
fn docs(plan: &Plan, file: &str) -> Vec<Value> {
    use serde::Deserialize;
    let f = plan.files.iter().find(|f| f.name == file).expect(file);
    serde_yaml::Deserializer::from_str(&f.text)
        .map(|d| serde_json::to_value(serde_yaml::Value::deserialize(d).unwrap()).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn at<'a>(v: &'a Value, pointer: &str) -> &'a Value {
    v.pointer(pointer)
        .unwrap_or_else(|| panic!("{pointer} in {v:#}"))
}

#[test]
fn the_claims_ask_for_what_the_device_plugin_gave() {
    let plan = example_plan();
    let names: Vec<&str> = plan.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "01-pod-default-mig-probe.yaml",
            "02-pod-default-notebook.yaml",
            "03-deployment-default-web.yaml",
            "04-deployment-inference-ts-infer.yaml",
            "05-job-ml-train.yaml",
            "06-job-ml-big-train.yaml",
        ]
    );
    // Deployment web: a template of one whole GPU, no sharing (it selects H100 nodes only)
    let web = docs(&plan, "03-deployment-default-web.yaml");
    assert_eq!(at(&web[0], "/kind"), "ResourceClaimTemplate");
    assert_eq!(at(&web[0], "/metadata/name"), "web-gpu");
    let req = at(&web[0], "/spec/spec/devices/requests/0");
    assert_eq!(at(req, "/name"), "gpu");
    assert_eq!(at(req, "/exactly/deviceClassName"), "gpu.nvidia.com");
    assert_eq!(at(req, "/exactly/count"), 1);
    assert!(web[0].pointer("/spec/spec/devices/config").is_none());
    let spec = at(&web[1], "/spec/template/spec");
    assert_eq!(
        at(spec, "/resourceClaims/0"),
        &serde_json::json!({"name": "gpu", "resourceClaimTemplateName": "web-gpu"})
    );
    let resources = at(spec, "/containers/0/resources");
    assert_eq!(resources, &serde_json::json!({"claims": [{"name": "gpu"}]}));
    assert_eq!(at(&web[1], "/spec/replicas"), 3);
    // what the API server set is gone
    assert!(web[1].pointer("/status").is_none());
    assert!(web[1].pointer("/metadata/uid").is_none());
    assert!(web[1].pointer("/metadata/annotations").is_none());

    // the time-sliced Deployment: a TimeSlicing GpuConfig for its request
    let ts = docs(&plan, "04-deployment-inference-ts-infer.yaml");
    let config = at(&ts[0], "/spec/spec/devices/config/0");
    assert_eq!(at(config, "/requests/0"), "gpu");
    assert_eq!(at(config, "/opaque/driver"), "gpu.nvidia.com");
    assert_eq!(
        at(config, "/opaque/parameters"),
        &serde_json::json!({
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}},
        })
    );

    // the MIG pod: mig.nvidia.com with a selector on the profile; its nodeName is gone
    let mig = docs(&plan, "01-pod-default-mig-probe.yaml");
    let req = at(&mig[0], "/spec/spec/devices/requests/0/exactly");
    assert_eq!(at(req, "/deviceClassName"), "mig.nvidia.com");
    assert_eq!(
        at(req, "/selectors/0/cel/expression"),
        "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
    );
    assert!(mig[1].pointer("/spec/nodeName").is_none());

    // the Job: count 2, and no generated selector or controller labels left
    let train = docs(&plan, "05-job-ml-train.yaml");
    assert_eq!(
        at(&train[0], "/spec/spec/devices/requests/0/exactly/count"),
        2
    );
    assert!(train[1].pointer("/spec/selector").is_none());
    assert!(train[1].pointer("/metadata/labels").is_none());
    assert!(train[1].pointer("/spec/template/metadata/labels").is_none());
    // nothing asks the device plugin any more
    for f in &plan.files {
        assert!(!f.text.contains("nvidia.com/gpu:"), "{}", f.name);
        assert!(!f.text.contains("nvidia.com/mig-"), "{}", f.name);
    }
}

#[test]
fn the_written_yaml_simulates_to_the_same_placements() {
    let plan = example_plan();
    let dir = std::env::temp_dir().join(format!("dra-sim-plan-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.join("out");
    write_files(&out, &plan).expect("writes");
    // a second run into the same directory is fine; someone else's manifest there is not
    write_files(&out, &plan).expect("writes again");
    std::fs::write(out.join("zz-other.yaml"), "").unwrap();
    let err = write_files(&out, &plan).unwrap_err().to_string();
    assert!(err.contains("zz-other.yaml"), "{err}");
    std::fs::remove_file(out.join("zz-other.yaml")).unwrap();

    // the pool as our plugin would publish it, and its Nodes, as files `simulate` reads
    let slices: String = plan
        .slices
        .iter()
        .map(|s| format!("---\n{}", serde_yaml::to_string(s).unwrap()))
        .collect();
    let nodes: String = plan
        .node_objects
        .iter()
        .map(|n| format!("---\n{}", serde_yaml::to_string(n).unwrap()))
        .collect();
    std::fs::write(dir.join("slices.yaml"), slices).unwrap();
    std::fs::write(dir.join("nodes.yaml"), nodes).unwrap();
    let args = SimulateArgs {
        files: vec![out.clone()],
        slices: vec![dir.join("slices.yaml")],
        nodes: vec![dir.join("nodes.yaml")],
        ..Default::default()
    };
    let sc = build_scenario(&args, Objects::default(), vec![]).expect("the output loads");
    assert_eq!(sc.objs.templates.len(), 6);
    assert_eq!(sc.objs.workloads.len(), 6);
    let pods = run_pods(&sc);
    assert_eq!(placements(&pods), placements(&plan.pods));
    let pending: Vec<&str> = pods
        .iter()
        .filter(|p| p.node.is_none())
        .map(|p| p.pod.as_str())
        .collect();
    assert_eq!(pending, ["ml/big-train-0"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Plans `text` (one file named `bad.yaml`) onto every node, for error cases.
fn plan_text(text: &str, pool: &str) -> Result<Plan, String> {
    let mut objs = Objects::default();
    input::load_str("bad.yaml", text, &mut objs).map_err(|e| e.to_string())?;
    let pool = PoolSelection::nodes(pool).unwrap();
    make_plan(&objs, &pool).map_err(|e| e.to_string())
}

const NODE: &str = "
apiVersion: v1
kind: Node
metadata:
  name: n1
  labels:
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
    nvidia.com/gpu.count: '2'
";

#[test]
fn bad_input_is_an_error_that_says_where() {
    let unknown = NODE.replace("NVIDIA-H100-80GB-HBM3", "NVIDIA-GeForce-RTX-4090");
    let err = plan_text(&unknown, "n1").unwrap_err();
    assert!(
        err.contains("Node n1")
            && err.contains("nvidia.com/gpu.product")
            && err.contains("NVIDIA-GeForce-RTX-4090"),
        "{err}"
    );
    let layout = format!("{NODE}    nvidia.com/mig.config: all-9g.99gb\n");
    let err = plan_text(&layout, "n1").unwrap_err();
    assert!(
        err.contains("Node n1") && err.contains("all-9g.99gb") && err.contains("9g.99gb"),
        "{err}"
    );
    let count = NODE.replace("'2'", "two");
    let err = plan_text(&count, "n1").unwrap_err();
    assert!(
        err.contains("nvidia.com/gpu.count") && err.contains("two"),
        "{err}"
    );
    let pod = format!(
        "{NODE}---
apiVersion: v1
kind: Pod
metadata: {{name: p}}
spec:
  containers:
  - name: c
    resources:
      limits: {{nvidia.com/gpu: '0.5'}}
"
    );
    let err = plan_text(&pod, "n1").unwrap_err();
    assert!(
        err.contains("bad.yaml: document 2 (Pod p)")
            && err.contains("spec.containers[0].resources.limits.nvidia.com/gpu"),
        "{err}"
    );
    let err = plan_text(NODE, "n2").unwrap_err();
    assert!(err.contains("node n2 is not in the input"), "{err}");
}

#[test]
fn mps_nodes_get_one_shared_claim_and_single_strategy_nodes_a_mig_request() {
    let mps = "
apiVersion: v1
kind: Node
metadata:
  name: mps-1
  labels:
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
    nvidia.com/gpu.count: '1'
    nvidia.com/gpu.replicas: '4'
    nvidia.com/gpu.sharing-strategy: mps
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: infer}
spec:
  replicas: 2
  selector: {matchLabels: {app: infer}}
  template:
    metadata: {labels: {app: infer}}
    spec:
      containers:
      - name: c
        resources:
          limits: {nvidia.com/gpu: '1'}
";
    let plan = plan_text(mps, "mps-1").unwrap();
    let d = docs(&plan, "01-deployment-default-infer.yaml");
    assert_eq!(at(&d[0], "/kind"), "ResourceClaim");
    let sharing = at(&d[0], "/spec/devices/config/0/opaque/parameters/sharing");
    assert_eq!(at(sharing, "/strategy"), "MPS");
    assert_eq!(at(sharing, "/mpsConfig/defaultActiveThreadPercentage"), 25);
    assert_eq!(
        at(
            &d[1],
            "/spec/template/spec/resourceClaims/0/resourceClaimName"
        ),
        "infer-gpu"
    );
    // both pods share the one claim's GPU
    let placed = placements(&plan.pods);
    assert_eq!(placed.len(), 2);
    assert!(
        placed
            .iter()
            .all(|(_, node, dev)| node == "mps-1" && dev == &["gpu-0"])
    );

    let single = mps
        .replace(
            "nvidia.com/gpu.replicas: '4'",
            "nvidia.com/mig.strategy: single",
        )
        .replace(
            "nvidia.com/gpu.sharing-strategy: mps",
            "nvidia.com/mig.config: all-3g.40gb",
        )
        .replace("nvidia.com/gpu.count: '1'", "nvidia.com/gpu.count: '2'");
    let plan = plan_text(&single, "mps-1").unwrap();
    assert_eq!(plan.nodes[0].gpus, 1, "single counts MIG devices");
    let d = docs(&plan, "01-deployment-default-infer.yaml");
    let req = at(&d[0], "/spec/spec/devices/requests/0/exactly");
    assert_eq!(at(req, "/deviceClassName"), "mig.nvidia.com");
    assert_eq!(
        at(req, "/selectors/0/cel/expression"),
        "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"
    );
    assert_eq!(plan.unplaced(), 0);
}

#[test]
fn several_containers_get_their_own_requests_and_init_containers_reuse_them() {
    let text = format!(
        "{NODE}---
apiVersion: v1
kind: Pod
metadata: {{name: p, namespace: team}}
spec:
  initContainers:
  - name: warmup
    resources: {{limits: {{nvidia.com/gpu: '1'}}}}
  containers:
  - name: a
    resources: {{limits: {{nvidia.com/gpu: '1', cpu: '1'}}}}
  - name: b
    resources: {{requests: {{nvidia.com/gpu: '1'}}, limits: {{nvidia.com/gpu: '1'}}}}
"
    );
    let plan = plan_text(&text, "n1").unwrap();
    let d = docs(&plan, "01-pod-team-p.yaml");
    let names: Vec<&Value> = at(&d[0], "/spec/spec/devices/requests")
        .as_array()
        .unwrap()
        .iter()
        .map(|r| at(r, "/name"))
        .collect();
    assert_eq!(names, ["a-gpu", "b-gpu"]);
    let claims = |c: &str| at(&d[1], c).clone();
    assert_eq!(
        claims("/spec/initContainers/0/resources"),
        serde_json::json!({"claims": [{"name": "gpu", "request": "a-gpu"}]})
    );
    assert_eq!(
        claims("/spec/containers/0/resources"),
        serde_json::json!({"claims": [{"name": "gpu", "request": "a-gpu"}], "limits": {"cpu": "1"}})
    );
    assert_eq!(
        claims("/spec/containers/1/resources"),
        serde_json::json!({"claims": [{"name": "gpu", "request": "b-gpu"}]})
    );
    assert_eq!(
        placements(&plan.pods),
        [p("team/p", "n1", &["gpu-0", "gpu-1"])]
    );
}
