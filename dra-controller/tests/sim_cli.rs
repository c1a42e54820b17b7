//! The `eval` / `simulate` command-line contract, run as the real binary.
use std::path::PathBuf;
use std::process::{Command, Output};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dra-controller"));
    // the embedded default resolves examples/ relative to the repository root
    c.current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."));
    c
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn eval_compile_error_exits_non_zero_with_the_message() {
    let o = bin()
        .args([
            "eval",
            "--selector",
            "device.driver == ",
            "--profile",
            "h100-80gb:1",
        ])
        .output()
        .expect("run dra-controller");
    let (out, err) = text(&o);
    assert!(!o.status.success(), "stdout: {out}\nstderr: {err}");
    assert!(
        err.contains("compilation failed") && err.contains("Syntax error"),
        "stderr: {err}"
    );
    let o = bin()
        .args(["eval", "--selector", "1 + 1", "--profile", "h100-80gb:1"])
        .output()
        .expect("run dra-controller");
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("must evaluate to bool"), "stderr: {err}");
}

#[test]
fn eval_prints_a_verdict_per_device() {
    let o = bin()
        .args([
            "eval",
            "--selector",
            "device.attributes['gpu.nvidia.com'].?type.orValue('') == 'gpu'",
            "--profile",
            "h100-80gb:2",
            "-o",
            "json",
        ])
        .output()
        .expect("run dra-controller");
    let (out, err) = text(&o);
    assert!(o.status.success(), "stderr: {err}");
    assert!(
        out.contains("true") && out.contains("gpu.nvidia.com"),
        "{out}"
    );
}

#[test]
fn simulate_embedded_default_picks_the_mig_slice() {
    let o = bin()
        .args(["simulate", "examples/claims/inference-gpu.yaml"])
        .output()
        .expect("run dra-controller");
    let (out, err) = text(&o);
    assert!(o.status.success(), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("gpu/mig-slice"), "stdout: {out}");
    assert!(
        out.contains("3g40gb") || out.contains("3g.40gb"),
        "stdout: {out}"
    );
}

/// `simulate` on a file `name` holding `yaml`, which must fail; its stderr.
fn simulate_fails(name: &str, yaml: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join(name);
    std::fs::write(&f, yaml).expect("write");
    let o = bin()
        .arg("simulate")
        .arg(&f)
        .output()
        .expect("run dra-controller");
    let (out, err) = text(&o);
    assert!(!o.status.success(), "stdout: {out}");
    assert!(err.contains(name), "stderr: {err}");
    err
}

#[test]
fn malformed_yaml_names_file_document_and_field() {
    let err = simulate_fails(
        "bad-claims.yaml",
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: ok}\nspec: {devices: {requests: [{name: a, exactly: {deviceClassName: gpu.nvidia.com}}]}}\n---\n\
         apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: bad}\nspec: {devices: {requests: [{name: a, exactly: {deviceClassName: gpu.nvidia.com, count: many}}]}}\n",
    );
    assert!(
        err.contains("document 2 (ResourceClaim bad)"),
        "stderr: {err}"
    );
    assert!(
        err.contains("spec.devices.requests[0].exactly.count"),
        "stderr: {err}"
    );
}

#[test]
fn unsatisfiable_explains_the_counts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("nine-gpus.yaml");
    std::fs::write(
        &f,
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: nine, namespace: default}\n\
         spec: {devices: {requests: [{name: gpus, exactly: {deviceClassName: gpu.nvidia.com, count: 9}}]}}\n",
    )
    .expect("write");
    let o = bin()
        .arg("simulate")
        .arg(&f)
        .args(["--profile", "h100-80gb:8"])
        .output()
        .expect("run dra-controller");
    let (out, err) = text(&o);
    let all = format!("{out}{err}");
    assert!(!o.status.success(), "{all}");
    assert!(all.contains("unsatisfiable"), "{all}");
    // 8 whole GPUs pass the class selectors, the request wants 9
    assert!(all.contains("request gpus (wants 9)"), "{all}");
    assert!(all.contains("8 passed class selectors"), "{all}");
    assert!(all.contains("devices considered"), "{all}");
}

#[test]
fn a_misspelt_field_is_an_error_not_a_different_claim() {
    let err = simulate_fails(
        "typo.yaml",
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: typo}\n\
         spec: {devices: {requests: [{name: a, exactly: {deviceClassName: gpu.nvidia.com, selector: []}}]}}\n",
    );
    assert!(
        err.contains(
            "document 1 (ResourceClaim typo): field spec.devices.requests[0].exactly.selector: unknown field"
        ),
        "stderr: {err}"
    );
}

#[test]
fn plan_writes_manifests_to_stdout_and_the_report_to_stderr() {
    let o = bin()
        .args([
            "plan",
            "examples/plan/cluster-dump.yaml",
            "--pool-selector",
            "nvidia.com/gpu.present=true",
            "--out",
            "-",
        ])
        .output()
        .expect("run dra-controller");
    let (out, err) = text(&o);
    // the 8-GPU Job of the example fits nowhere: the exit status says so
    assert_eq!(o.status.code(), Some(1), "stdout: {out}\nstderr: {err}");
    assert!(err.contains("9 of 10 pod(s) placed"), "stderr: {err}");
    assert!(
        err.contains("pod ml/big-train-0 (Job/big-train): unschedulable"),
        "stderr: {err}"
    );
    assert!(
        err.contains("1 of 10 pod(s) cannot be scheduled"),
        "stderr: {err}"
    );
    assert_eq!(
        out.matches("kind: ResourceClaimTemplate").count(),
        6,
        "{out}"
    );
    assert!(out.contains("resourceClaimTemplateName: web-gpu"), "{out}");
    assert!(!out.contains("POOL"), "the report stays off stdout: {out}");
}

#[test]
fn plan_needs_a_pool() {
    let o = bin()
        .args(["plan", "examples/plan/cluster-dump.yaml"])
        .output()
        .expect("run dra-controller");
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("--pool-selector") && err.contains("--pool-nodes"),
        "{err}"
    );
}
