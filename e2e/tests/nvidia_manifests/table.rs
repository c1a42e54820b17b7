//! The table: every YAML file of NVIDIA's v0.5.0 `demo/specs` and `tests/bats/specs`, the node
//! setup it runs on and NVIDIA's outcome (from the file's comments, the demo READMEs and the bats
//! test that applies it), or why it is not applied.
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::setup::Setup;

/// Whether pods of one file may hold the same device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Share {
    /// No device in two claims.
    Distinct,
    /// Every pod got the same devices.
    Same,
    /// One pod (its containers share its claims).
    One,
    /// Claims of their own that share devices: some device in two or more, none in more than N.
    UpTo(usize),
}

#[derive(Clone, Debug)]
pub enum Expect {
    /// `pods` pods Running, each with devices of these types (sorted), shared as said.
    Run {
        pods: usize,
        types: &'static [&'static str],
        share: Share,
    },
    /// `pods` pods the scheduler does not place, its message containing `reason`.
    Pending { pods: usize, reason: &'static str },
    /// `pods` pods scheduled whose claims the kubelet cannot prepare (an Event containing `reason`).
    NotPrepared { pods: usize, reason: &'static str },
    /// A document the API server refuses (error containing the text); no pod.
    ApplyFails(&'static str),
    /// Not applied: a document's API is not served (checked through discovery).
    Unserved(&'static str),
    /// Not applied, for the reason given.
    Listed(&'static str),
}

pub struct Row {
    /// Paths under the module directory, comma-separated when applied together; `×N` after a path
    /// applies N copies with `__INDEX__` replaced by 0..N.
    pub files: &'static str,
    pub setup: Setup,
    pub expect: Expect,
    /// Why this is NVIDIA's outcome.
    pub why: &'static str,
    /// `${NAME}` → value, as the `envsubst` of the bats test that applies a template.
    pub vars: &'static [(&'static str, &'static str)],
}

impl Row {
    /// `(path, copies)` of each file of the row.
    pub fn file_list(&self) -> Vec<(&'static str, usize)> {
        self.files
            .split(", ")
            .map(|f| match f.split_once('×') {
                Some((p, n)) => (p, n.parse().unwrap_or(1)),
                None => (f, 1),
            })
            .collect()
    }
}

fn row(files: &'static str, setup: Setup, expect: Expect, why: &'static str) -> Row {
    Row {
        files,
        setup,
        expect,
        why,
        vars: &[],
    }
}

fn run(pods: usize, types: &'static [&'static str], share: Share) -> Expect {
    Expect::Run { pods, types, share }
}

fn pending(pods: usize, reason: &'static str) -> Expect {
    Expect::Pending { pods, reason }
}

const G: &[&str] = &["gpu"];
const GG: &[&str] = &["gpu", "gpu"];
const M: &[&str] = &["mig"];
/// The structured allocator's message when no device set satisfies a pod's claims.
const NO_FIT: &str = "cannot allocate all claims";

pub fn rows() -> Vec<Row> {
    let mut v = quickstart_rows();
    v.extend(bats_rows());
    v.extend(demo_rows());
    v.extend(not_applied_rows());
    v
}

fn quickstart_rows() -> Vec<Row> {
    use Setup::Standard as S;
    use Share::*;
    let mut v = Vec::new();
    // v1 and v1beta1 hold the same apps; the 1.37 API server serves both APIs.
    for (file, expect, why) in [
        (
            "gpu-test1.yaml",
            run(2, G, Distinct),
            "two pods, a GPU each",
        ),
        (
            "gpu-test2.yaml",
            run(1, G, One),
            "two containers share one claim's GPU",
        ),
        (
            "gpu-test3.yaml",
            run(2, G, Same),
            "two pods share one ResourceClaim's GPU",
        ),
        (
            "gpu-test4.yaml",
            run(4, &["mig"; 4], Distinct),
            "4 replicas × (2×1g.5gb, 2g.10gb, 3g.20gb) of one parent: the half-balanced A100s 0-3",
        ),
        (
            "gpu-test5.yaml",
            run(1, GG, Distinct),
            "one claim: a TimeSlicing GPU and an MPS GPU",
        ),
        (
            "gpu-test6.yaml",
            pending(4, "index"),
            "selects A100s by attribute `index`, which v0.5 does not publish: CEL runtime error",
        ),
        (
            "gpu-test-mps.yaml",
            run(1, G, One),
            "two containers on one MPS-shared GPU",
        ),
        (
            "imex-test1.yaml",
            pending(8, "imex.nvidia.com"),
            "class imex.nvidia.com (the IMEX driver's, before ComputeDomains) is not v0.5's",
        ),
    ] {
        for dir in ["v1", "v1beta1"] {
            let files = leak(format!("demo/specs/quickstart/{dir}/{file}"));
            v.push(row(files, S, expect.clone(), why));
        }
    }
    v.extend([
        row(
            "demo/specs/quickstart/v1/gpu-test-vfiopci.yaml",
            Setup::Vfio,
            run(1, &["vfio"], One),
            "a gpu-vfio device (PassthroughSupport), its GPU bound to vfio-pci for the pod",
        ),
        row(
            "demo/specs/quickstart/v1/gpu-test-vfio-config.yaml",
            Setup::Vfio,
            Expect::ApplyFails("gpu-test-vfiopci"),
            "NVIDIA's file puts its Pod in namespace gpu-test-vfiopci, which no document creates \
             (its Namespace and template are gpu-test-vfio): kubectl apply refuses the Pod",
        ),
        row(
            "demo/specs/quickstart/gpu-test7.yaml",
            S,
            run(1, GG, Distinct),
            "two claims from one template: two GPUs",
        ),
        row(
            "demo/specs/quickstart/gpu-test8.yaml",
            S,
            run(1, GG, Distinct),
            "count: 2",
        ),
    ]);
    v
}

fn bats_rows() -> Vec<Row> {
    use Setup::Standard as S;
    use Share::*;
    let (dynmig, shares) = (Setup::DynMig, Setup::Shares("4"));
    let mut v: Vec<Row> = [
        (
            "gpu-simple-full.yaml",
            S,
            run(1, G, One),
            "test_gpu_basic: 1 pod, 1 full GPU",
        ),
        (
            "gpu-2pods-2gpus.yaml",
            S,
            run(2, G, Distinct),
            "test_gpu_basic: UUIDs differ",
        ),
        (
            "gpu-2pods-1gpu.yaml",
            S,
            run(2, G, Same),
            "test_gpu_basic: one RC, UUIDs equal",
        ),
        (
            "gpu-1pod-2cnt-1gpu.yaml",
            S,
            run(1, G, One),
            "test_gpu_basic: 2 containers, 1 GPU",
        ),
        (
            "gpu-two-claims-one-pod.yaml",
            S,
            run(1, GG, Distinct),
            "test_gpu_robustness: two RCTs, two GPUs",
        ),
        (
            "gpu-cel-nomatch.yaml",
            S,
            pending(1, NO_FIT),
            "test_gpu_robustness: stays Pending",
        ),
        (
            "gpu-pod-fail-restart.yaml",
            S,
            run(1, G, One),
            "test_gpu_robustness: a GPU (then exits 0; fake containers run nothing)",
        ),
        (
            "gpu-timeslicing.yaml",
            S,
            run(1, G, One),
            "test_gpu_sharing: TimeSlicing Short",
        ),
        (
            "gpu-mps.yaml",
            S,
            run(1, G, One),
            "test_gpu_sharing: MPS, UUIDs equal",
        ),
        (
            "gpu-cuda-demo-suite.yaml",
            S,
            run(1, G, One),
            "test_gpu_cuda_workloads: one GPU",
        ),
        (
            "gpu-cuda-busgrind.yaml",
            S,
            run(1, G, One),
            "test_gpu_cuda_workloads: one GPU",
        ),
        (
            "gpu-job-rct.yaml",
            S,
            run(1, G, One),
            "Job, parallelism 1: one pod at a time (fake containers never exit, so no second)",
        ),
        (
            "gpu-job-rct-parallel.yaml",
            S,
            run(2, G, Distinct),
            "test_gpu_cuda_workloads: 2 pods at once, distinct GPUs",
        ),
        (
            "gpu-anymig.yaml",
            S,
            run(1, M, One),
            "test_gpu_mig: any MIG device",
        ),
        (
            "gpu-simple-mig.yaml",
            dynmig,
            run(1, M, One),
            "test_gpu_dynmig: > 10 SMs, > 10Gi",
        ),
        (
            "gpu-multiple-mig.yaml",
            dynmig,
            run(1, &["mig", "mig"], Distinct),
            "test_gpu_dynmig: two MIG devices, UUIDs differ",
        ),
        (
            "gpu-simple-mig-ts.yaml",
            dynmig,
            run(1, M, One),
            "test_gpu_dynmig: MIG + TimeSlicing",
        ),
        (
            "gpu-consumable-shares-integer.yaml",
            shares,
            run(2, G, Same),
            "test_gpu_consumable_shares (consumableShares=4): 1 share each, UUIDs equal",
        ),
        (
            "gpu-consumable-shares-memory.yaml",
            shares,
            run(2, G, Same),
            "test_gpu_consumable_shares (consumableShares=4): 2Gi each, UUIDs equal",
        ),
        (
            "gpu-mps.yaml",
            shares,
            Expect::NotPrepared {
                pods: 1,
                reason: "MPS cannot be combined with consumable shares",
            },
            "test_gpu_consumable_shares: the driver refuses MPS on a shared device",
        ),
    ]
    .into_iter()
    .map(|(f, s, e, why)| row(leak(format!("tests/bats/specs/{f}")), s, e, why))
    .collect();
    v.push(row(
        "tests/bats/specs/rc-shared-gpu.yaml, tests/bats/specs/pods-shared-gpu.yaml×3",
        S,
        run(3, G, Same),
        "test_gpu_stress: pods rendered from the template share the RC's GPU",
    ));
    v.push(Row {
        vars: &[
            ("TEST_K8S_RESOURCE_API_VERSION", "v1"),
            (
                "TEST_DEVCLASSNAME_CD_CHANNEL",
                "exactly: {deviceClassName: compute-domain-default-channel.nvidia.com}",
            ),
        ],
        ..row(
            "tests/bats/specs/rc-opaque-cfg-unknown-field.yaml.tmpl",
            Setup::ComputeDomain,
            Expect::NotPrepared {
                pods: 1,
                reason: "unexpectedField",
            },
            "test_cd_misc (setup_suite's values): the channel's prepare fails on the opaque \
             config's unknown field",
        )
    });
    v
}

fn demo_rows() -> Vec<Row> {
    use Share::*;
    let shares = Setup::Shares;
    vec![
        row(
            "demo/specs/extended-resources/gpu-full.yaml",
            Setup::Standard,
            run(1, G, One),
            "nvidia.com/gpu: 1 through gpu.nvidia.com's extendedResourceName",
        ),
        row(
            "demo/specs/extended-resources/mig-1g-12gb.yaml",
            Setup::DynMig,
            run(1, M, One),
            "its own DeviceClass maps nvidia.com/mig-1g.12gb to an H100 NVL 1g.12gb (dynamic MIG)",
        ),
        row(
            "demo/specs/consumable-shares/integer-sharing.yaml",
            shares("4"),
            run(4, G, UpTo(4)),
            // Not "all 4 on the first GPU" (the simulator's sequential outcome): NVIDIA promises
            // up to 4 per GPU, and the scheduler, binding the 4 pods at once with the GPU's shares
            // exactly used up, put the last one on the next GPU in one of our runs.
            "1 share per claim, \"up to 4 replicas share each GPU\"",
        ),
        row(
            "demo/specs/consumable-shares/memory-sharing.yaml",
            shares("memory"),
            run(2, G, Same),
            "4Gi each: both replicas on the first GPU",
        ),
        row(
            "demo/specs/consumable-shares/unlimited-sharing.yaml",
            shares("unlimited"),
            run(2, G, Same),
            "no quota: both replicas on the first GPU",
        ),
        row(
            "demo/specs/fabric-manager-partitioning/resourceClaimTemplates.yaml, \
             demo/specs/fabric-manager-partitioning/pod.yaml",
            Setup::Vfio,
            pending(1, NO_FIT),
            "partitionN comes from Fabric Manager on an NVSwitch fabric; on a node without one \
             NVIDIA skips Fabric Manager as well, so no two GPUs match on partition2",
        ),
        row(
            "demo/specs/mig+mps/sharing-demo-job.yaml",
            Setup::Standard,
            Expect::ApplyFails("source"),
            "a v1alpha2-era Job: pod resourceClaims[].source is no longer a field",
        ),
        row(
            "demo/specs/mig+mps/sharing-demo-job-1.yaml",
            Setup::Standard,
            Expect::ApplyFails("source"),
            "a v1alpha2-era Job: pod resourceClaims[].source is no longer a field",
        ),
        row(
            "demo/specs/selectors/pods.yaml",
            Setup::Standard,
            Expect::ApplyFails("source"),
            "v1alpha2-era Pods: resourceClaims[].source is no longer a field",
        ),
    ]
}

/// Files that are not applied, with the reason.
fn not_applied_rows() -> Vec<Row> {
    let imex = "ComputeDomain channels: need IMEX daemons on an NVLink (MNNVL) fabric";
    let mut v = vec![
        listed("demo/specs/imex/channel-injection.yaml", imex),
        listed("demo/specs/imex/channel-injection-all.yaml", imex),
        listed(
            "demo/specs/quickstart/mig-parted-config.yaml",
            "a mig-parted config, not a Kubernetes object (nv-0 is its half-balanced)",
        ),
        listed(
            "demo/specs/mig+mps/sharing-demo-mig-parted-config.yaml",
            "a mig-parted config, not a Kubernetes object",
        ),
        unserved(
            "demo/specs/quickstart/v1beta1/gpu-test-vfiopci.yaml",
            "resource.k8s.io/v1alpha3 is no longer served",
        ),
        unserved(
            "tests/bats/specs/nvb.tmpl.yaml",
            "kubeflow.org MPIJob (test_cd_mnnvl_workload, MNNVL hardware)",
        ),
    ];
    for f in [
        "imex/nvbandwidth-test-job.yaml",
        "imex/nvbandwidth-test-job-1.yaml",
        "imex/nvbandwidth-test-job-2.yaml",
        "imex/nvbandwidth-test-no-compute-domain-job.yaml",
    ] {
        v.push(unserved(
            leak(format!("demo/specs/{f}")),
            "kubeflow.org MPIJob",
        ));
    }
    for f in [
        "selectors/claims.yaml",
        "selectors/parameters.yaml",
        "mig+mps/sharing-demo-claims.yaml",
        "mig+mps/sharing-demo-claims-1.yaml",
        "mig+mps/sharing-demo-parameters.yaml",
        "mig+mps/sharing-demo-parameters-1.yaml",
    ] {
        let why = "classic DRA (resource.k8s.io/v1alpha2, gpu.resource.nvidia.com)";
        v.push(unserved(leak(format!("demo/specs/{f}")), why));
    }
    v
}

fn listed(files: &'static str, why: &'static str) -> Row {
    row(files, Setup::Standard, Expect::Listed(why), "")
}

fn unserved(files: &'static str, why: &'static str) -> Row {
    row(files, Setup::Standard, Expect::Unserved(why), "")
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Every `*.yaml` under `demo/specs` and `tests/bats/specs` has a row, and every row's file
/// exists: a new upstream file cannot go unnoticed.
pub fn check_complete(module: &Path, rows: &[Row]) -> Result<()> {
    let mut files = Vec::new();
    for dir in ["demo/specs", "tests/bats/specs"] {
        walk(&module.join(dir), &mut files)?;
    }
    let named: Vec<&str> = rows
        .iter()
        .flat_map(|r| r.file_list())
        .map(|(f, _)| f)
        .collect();
    for f in &named {
        if !module.join(f).is_file() {
            bail!("table row {f}: no such file in {}", module.display());
        }
    }
    let missing: Vec<String> = files
        .iter()
        .filter_map(|p| p.strip_prefix(module).ok())
        .map(|p| p.display().to_string())
        .filter(|p| !named.contains(&p.as_str()))
        .collect();
    if !missing.is_empty() {
        bail!("files of NVIDIA's module without a row: {missing:?}");
    }
    Ok(())
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            walk(&p, out)?;
        } else if p.to_string_lossy().contains(".yaml") {
            out.push(p);
        }
    }
    Ok(())
}
