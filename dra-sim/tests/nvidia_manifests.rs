//! NVIDIA's own manifests (`sigs.k8s.io/dra-driver-nvidia-gpu@v0.5.0`: `demo/specs/**` and
//! `tests/bats/specs/*`), each run as a whole file through `simulate`, against the outcome NVIDIA's
//! manifests and bats tests expect. The files are not copied here: `tools/nvidia-manifests.sh`
//! downloads the module from the Go module proxy and sets `NVIDIA_DRA_DRIVER_DIR`; without it the
//! test asks `go mod download` itself. In CI (`CI=true`) a missing module fails the test.
//!
//! One file over 600 lines on purpose: one table of cases, a row per file of NVIDIA's module.
use dra_sim::cli::{SimulateArgs, build_scenario, run_pods, run_scenario};
use dra_sim::input::Objects;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const MODULE: &str = "sigs.k8s.io/dra-driver-nvidia-gpu@v0.5.0";

/// The simulated node a manifest needs.
#[derive(Clone, Copy, Debug)]
enum Node {
    /// The embedded default: H100 80GB x8 with dynamic MIG.
    H100,
    /// H100 80GB x8 with PassthroughSupport: a gpu-vfio device per GPU.
    H100Vfio,
    /// A100 40GB x8, MIG off (gpu-test6 selects A100s by product name and `index`).
    A100,
    /// A100 40GB x8 with NVIDIA's quickstart `half-balanced` MIG layout on every GPU.
    A100HalfBalanced,
    /// H100 NVL x8 with dynamic MIG (the `1g.12gb` profile).
    H100Nvl,
    /// H100 80GB x8 with `ConsumableShares` and NVIDIA's `--consumable-shares` set to this.
    H100Shares(&'static str),
}

/// What a file gives.
#[derive(Debug)]
enum Expect {
    /// Not a Kubernetes manifest (a README, a script, a mig-parted config): loading fails so.
    NotManifest(&'static str),
    /// Refused while loading, with this text (a retired API version, a removed field).
    Refused(&'static str),
    /// Every pod scheduled; per pod the kinds of its devices (`gpu`, `mig-1g10gb`), sorted.
    Pods(&'static [(&'static str, &'static [&'static str])]),
    /// Every pod gets the same single GPU (one shared claim, or consumable shares).
    Shared(&'static [&'static str]),
    /// Every pod stays Pending, the reason containing this text ("" for "does not fit").
    Unschedulable(&'static str),
    /// Nothing to simulate: the objects are ignored kinds; the ignored list names this kind.
    NothingToSimulate(&'static str),
    /// NVIDIA expects something our plugin's device model does not publish yet; `now` is what
    /// the simulator says today (checked, so a change is noticed).
    Pending {
        why: &'static str,
        now: &'static Expect,
    },
}
use Expect::*;

struct Case {
    file: &'static str,
    node: Node,
    /// Files applied together with it (a pod and its template in two files).
    with: &'static [&'static str],
    /// `envsubst` values for templated files, as NVIDIA's bats tests set them.
    vars: &'static [(&'static str, &'static str)],
    expect: Expect,
}

const fn case(file: &'static str, node: Node, expect: Expect) -> Case {
    Case {
        file,
        node,
        with: &[],
        vars: &[],
        expect,
    }
}

const VFIO: &str = "vfio.gpu.nvidia.com devices with fabric-manager partition attributes are not modelled by the simulated node";
const CHANNELS: &str = "compute-domain channel devices come from the compute-domain plugin on IMEX nodes; the simulated node has none";
const ONE_GPU: &[&str] = &["gpu"];

/// Every file of the module's demo/specs and tests/bats/specs, with NVIDIA's expected outcome.
fn cases() -> Vec<Case> {
    use Node::*;
    vec![
        case(
            "demo/specs/consumable-shares/README.md",
            H100,
            NotManifest(""),
        ),
        // each file's comment names the --consumable-shares mode it is written for
        case(
            "demo/specs/consumable-shares/integer-sharing.yaml",
            H100Shares("4"),
            Shared(&[
                "gpu-share-integer/integer-sharing-0",
                "gpu-share-integer/integer-sharing-1",
                "gpu-share-integer/integer-sharing-2",
                "gpu-share-integer/integer-sharing-3",
            ]),
        ),
        case(
            "demo/specs/consumable-shares/memory-sharing.yaml",
            H100Shares("memory"),
            Shared(&[
                "gpu-share-memory/memory-sharing-0",
                "gpu-share-memory/memory-sharing-1",
            ]),
        ),
        case(
            "demo/specs/consumable-shares/unlimited-sharing.yaml",
            H100Shares("unlimited"),
            Shared(&[
                "gpu-share-unlimited/unlimited-sharing-0",
                "gpu-share-unlimited/unlimited-sharing-1",
            ]),
        ),
        // `nvidia.com/gpu: 1` through gpu.nvidia.com's extendedResourceName (KEP-5004)
        case(
            "demo/specs/extended-resources/gpu-full.yaml",
            H100,
            Pods(&[("extended-resource-gpu-full/gpu-full-pod", ONE_GPU)]),
        ),
        // the file's own DeviceClass maps nvidia.com/mig-1g.12gb to the H100 NVL's 1g.12gb profile
        case(
            "demo/specs/extended-resources/mig-1g-12gb.yaml",
            H100Nvl,
            Pods(&[(
                "extended-resource-mig-1g12gb/mig-1g12gb-pod",
                &["mig-1g12gb"],
            )]),
        ),
        Case {
            with: &["demo/specs/fabric-manager-partitioning/resourceClaimTemplates.yaml"],
            ..case(
                "demo/specs/fabric-manager-partitioning/pod.yaml",
                H100,
                Pending {
                    why: VFIO,
                    now: &Unschedulable(""),
                },
            )
        },
        case(
            "demo/specs/fabric-manager-partitioning/resourceClaimTemplates.yaml",
            H100,
            Pending {
                why: VFIO,
                now: &Unschedulable(""),
            },
        ),
        case("demo/specs/imex/README.sh", H100, NotManifest("")),
        // the ComputeDomain controller makes the channel templates these pods name
        case(
            "demo/specs/imex/channel-injection-all.yaml",
            H100,
            Unschedulable("ResourceClaimTemplate default/tpl-imex-channels is not in the input"),
        ),
        case(
            "demo/specs/imex/channel-injection.yaml",
            H100,
            Unschedulable("ResourceClaimTemplate default/imex-channel-0 is not in the input"),
        ),
        case(
            "demo/specs/imex/nvbandwidth-test-job-1.yaml",
            H100,
            NothingToSimulate("MPIJob"),
        ),
        case(
            "demo/specs/imex/nvbandwidth-test-job-2.yaml",
            H100,
            NothingToSimulate("MPIJob"),
        ),
        case(
            "demo/specs/imex/nvbandwidth-test-job.yaml",
            H100,
            NothingToSimulate("MPIJob"),
        ),
        case(
            "demo/specs/imex/nvbandwidth-test-no-compute-domain-job.yaml",
            H100,
            NothingToSimulate("MPIJob"),
        ),
        case("demo/specs/mig+mps/README.md", H100, NotManifest("")),
        case(
            "demo/specs/mig+mps/sharing-demo-claims-1.yaml",
            H100,
            Refused("resource.k8s.io/v1alpha2 ResourceClaim is no longer served"),
        ),
        case(
            "demo/specs/mig+mps/sharing-demo-claims.yaml",
            H100,
            Refused("resource.k8s.io/v1alpha2 ResourceClaim is no longer served"),
        ),
        case(
            "demo/specs/mig+mps/sharing-demo-envs.sh",
            H100,
            NotManifest(""),
        ),
        // `resourceClaims[].source` was the v1alpha2-era pod field
        case(
            "demo/specs/mig+mps/sharing-demo-job-1.yaml",
            H100,
            Refused("field spec.template.spec.resourceClaims[0].source: unknown field"),
        ),
        case(
            "demo/specs/mig+mps/sharing-demo-job.yaml",
            H100,
            Refused("field spec.template.spec.resourceClaims[0].source: unknown field"),
        ),
        case(
            "demo/specs/mig+mps/sharing-demo-mig-parted-config.yaml",
            H100,
            NotManifest("field apiVersion: not set"),
        ),
        case(
            "demo/specs/mig+mps/sharing-demo-parameters-1.yaml",
            H100,
            NothingToSimulate("MigDeviceClaimParameters"),
        ),
        case(
            "demo/specs/mig+mps/sharing-demo-parameters.yaml",
            H100,
            NothingToSimulate("GpuClaimParameters"),
        ),
        case("demo/specs/quickstart/README.md", H100, NotManifest("")),
        case(
            "demo/specs/quickstart/gpu-test7.yaml",
            H100,
            Pods(&[("gpu-test7/gpu-pod", &["gpu", "gpu"])]),
        ),
        case(
            "demo/specs/quickstart/gpu-test8.yaml",
            H100,
            Pods(&[("gpu-test8/gpu-pod", &["gpu", "gpu"])]),
        ),
        case(
            "demo/specs/quickstart/mig-parted-config.yaml",
            H100,
            NotManifest("field apiVersion: not set"),
        ),
        case(
            "demo/specs/quickstart/v1/gpu-test-mps.yaml",
            H100,
            Pods(&[("gpu-test-mps/test-pod", ONE_GPU)]),
        ),
        // NVIDIA's manifest puts the pod in gpu-test-vfiopci and its template in gpu-test-vfio
        case(
            "demo/specs/quickstart/v1/gpu-test-vfio-config.yaml",
            H100,
            Unschedulable(
                "ResourceClaimTemplate gpu-test-vfiopci/single-gpu-full-vfioconfig is not in the input",
            ),
        ),
        case(
            "demo/specs/quickstart/v1/gpu-test-vfiopci.yaml",
            H100Vfio,
            Pods(&[("gpu-test-vfio/pod1", &["vfio"])]),
        ),
        case(
            "demo/specs/quickstart/v1/gpu-test1.yaml",
            H100,
            Pods(&[("gpu-test1/pod1", ONE_GPU), ("gpu-test1/pod2", ONE_GPU)]),
        ),
        case(
            "demo/specs/quickstart/v1/gpu-test2.yaml",
            H100,
            Pods(&[("gpu-test2/pod", ONE_GPU)]),
        ),
        case(
            "demo/specs/quickstart/v1/gpu-test3.yaml",
            H100,
            Shared(&["gpu-test3/pod1", "gpu-test3/pod2"]),
        ),
        case(
            "demo/specs/quickstart/v1/gpu-test4.yaml",
            A100HalfBalanced,
            Pods(&[
                ("gpu-test4/pod-0", MIG_SET),
                ("gpu-test4/pod-1", MIG_SET),
                ("gpu-test4/pod-2", MIG_SET),
                ("gpu-test4/pod-3", MIG_SET),
            ]),
        ),
        case(
            "demo/specs/quickstart/v1/gpu-test5.yaml",
            H100,
            Pods(&[("gpu-test5/pod0", &["gpu", "gpu"])]),
        ),
        // the file selects A100s by an `index` attribute that NVIDIA's v0.5 plugin does not
        // publish (deviceinfo.go) either: the selector fails on both drivers
        case(
            "demo/specs/quickstart/v1/gpu-test6.yaml",
            A100,
            Unschedulable("no such key: index"),
        ),
        // imex.nvidia.com was the IMEX driver's class, replaced by ComputeDomains
        case(
            "demo/specs/quickstart/v1/imex-test1.yaml",
            H100,
            Unschedulable("imex.nvidia.com"),
        ),
        case(
            "demo/specs/quickstart/v1beta1/gpu-test-mps.yaml",
            H100,
            Pods(&[("gpu-test-mps/test-pod", ONE_GPU)]),
        ),
        case(
            "demo/specs/quickstart/v1beta1/gpu-test-vfiopci.yaml",
            H100,
            Refused("resource.k8s.io/v1alpha3 ResourceClaimTemplate is no longer served"),
        ),
        case(
            "demo/specs/quickstart/v1beta1/gpu-test1.yaml",
            H100,
            Pods(&[("gpu-test1/pod1", ONE_GPU), ("gpu-test1/pod2", ONE_GPU)]),
        ),
        case(
            "demo/specs/quickstart/v1beta1/gpu-test2.yaml",
            H100,
            Pods(&[("gpu-test2/pod", ONE_GPU)]),
        ),
        case(
            "demo/specs/quickstart/v1beta1/gpu-test3.yaml",
            H100,
            Shared(&["gpu-test3/pod1", "gpu-test3/pod2"]),
        ),
        case(
            "demo/specs/quickstart/v1beta1/gpu-test4.yaml",
            A100HalfBalanced,
            Pods(&[
                ("gpu-test4/pod-0", MIG_SET),
                ("gpu-test4/pod-1", MIG_SET),
                ("gpu-test4/pod-2", MIG_SET),
                ("gpu-test4/pod-3", MIG_SET),
            ]),
        ),
        case(
            "demo/specs/quickstart/v1beta1/gpu-test5.yaml",
            H100,
            Pods(&[("gpu-test5/pod0", &["gpu", "gpu"])]),
        ),
        // the file selects A100s by an `index` attribute that NVIDIA's v0.5 plugin does not
        // publish (deviceinfo.go) either: the selector fails on both drivers
        case(
            "demo/specs/quickstart/v1beta1/gpu-test6.yaml",
            A100,
            Unschedulable("no such key: index"),
        ),
        case(
            "demo/specs/quickstart/v1beta1/imex-test1.yaml",
            H100,
            Unschedulable("imex.nvidia.com"),
        ),
        case("demo/specs/selectors/README.md", H100, NotManifest("")),
        case(
            "demo/specs/selectors/claims.yaml",
            H100,
            Refused("resource.k8s.io/v1alpha2 ResourceClaimTemplate is no longer served"),
        ),
        case(
            "demo/specs/selectors/parameters.yaml",
            H100,
            NothingToSimulate("GpuClaimParameters"),
        ),
        case(
            "demo/specs/selectors/pods.yaml",
            H100,
            Refused("field spec.resourceClaims[0].source: unknown field"),
        ),
        case(
            "tests/bats/specs/gpu-1pod-2cnt-1gpu.yaml",
            H100,
            Pods(&[("default/pod1", ONE_GPU)]),
        ),
        case(
            "tests/bats/specs/gpu-2pods-1gpu.yaml",
            H100,
            Shared(&["default/pod1", "default/pod2"]),
        ),
        case(
            "tests/bats/specs/gpu-2pods-2gpus.yaml",
            H100,
            Pods(&[("default/pod1", ONE_GPU), ("default/pod2", ONE_GPU)]),
        ),
        case(
            "tests/bats/specs/gpu-anymig.yaml",
            H100,
            Pods(&[("default/pod-anymig", &["mig-1g10gb"])]),
        ),
        case(
            "tests/bats/specs/gpu-cel-nomatch.yaml",
            H100,
            Unschedulable(""),
        ),
        // test_gpu_consumable_shares.bats installs with consumableShares=4 for both files
        case(
            "tests/bats/specs/gpu-consumable-shares-integer.yaml",
            H100Shares("4"),
            Shared(&["default/pod-share-integer-0", "default/pod-share-integer-1"]),
        ),
        case(
            "tests/bats/specs/gpu-consumable-shares-memory.yaml",
            H100Shares("4"),
            Shared(&["default/pod-share-memory-0", "default/pod-share-memory-1"]),
        ),
        case(
            "tests/bats/specs/gpu-cuda-busgrind.yaml",
            H100,
            Pods(&[("default/pod-cuda-busgrind", ONE_GPU)]),
        ),
        case(
            "tests/bats/specs/gpu-cuda-demo-suite.yaml",
            H100,
            Pods(&[("default/pod-cuda-demo", ONE_GPU)]),
        ),
        case(
            "tests/bats/specs/gpu-job-rct-parallel.yaml",
            H100,
            Pods(&[
                ("default/gpu-deploy-parallel-0", ONE_GPU),
                ("default/gpu-deploy-parallel-1", ONE_GPU),
            ]),
        ),
        // completions 2, parallelism 1: one pod at a time
        case(
            "tests/bats/specs/gpu-job-rct.yaml",
            H100,
            Pods(&[("default/gpu-job-rct-0", ONE_GPU)]),
        ),
        case(
            "tests/bats/specs/gpu-mps.yaml",
            H100,
            Pods(&[("default/pod-mps", ONE_GPU)]),
        ),
        // fewer than 30 SMs (1g.10gb, 16) and more than 50 (4g.40gb / 7g.80gb; first fit 3g.40gb? no: 60)
        case(
            "tests/bats/specs/gpu-multiple-mig.yaml",
            H100,
            Pods(&[("default/pod-2mig", &["mig-1g10gb", "mig-3g40gb"])]),
        ),
        case(
            "tests/bats/specs/gpu-pod-fail-restart.yaml",
            H100,
            Pods(&[("default/pod-restart-gpu", ONE_GPU)]),
        ),
        case(
            "tests/bats/specs/gpu-simple-full.yaml",
            H100,
            Pods(&[("default/pod-full-gpu", ONE_GPU)]),
        ),
        case(
            "tests/bats/specs/gpu-simple-mig-ts.yaml",
            H100,
            Pods(&[("default/pod-mig1g", &["mig-1g10gb"])]),
        ),
        case(
            "tests/bats/specs/gpu-simple-mig.yaml",
            H100,
            Pods(&[("default/pod-mig1g", &["mig-1g20gb"])]),
        ),
        case(
            "tests/bats/specs/gpu-timeslicing.yaml",
            H100,
            Pods(&[("default/pod-timeslicing", ONE_GPU)]),
        ),
        case(
            "tests/bats/specs/gpu-two-claims-one-pod.yaml",
            H100,
            Pods(&[("default/pod-two-claims", &["gpu", "gpu"])]),
        ),
        Case {
            vars: &[
                ("NVB_SFX", ""),
                ("NVB_NUM_NODES", "2"),
                ("NVB_GPUS_PER_NODE", "4"),
                ("NVB_NUM_RANKS", "8"),
                ("NVB_REPS_PER_BENCHMARK", "5"),
                ("NVB_BUFSIZE_PER_BENCHMARK_REP", "1024"),
            ],
            ..case(
                "tests/bats/specs/nvb.tmpl.yaml",
                H100,
                NothingToSimulate("MPIJob"),
            )
        },
        Case {
            with: &["tests/bats/specs/rc-shared-gpu.yaml"],
            vars: &[("__INDEX__", "0")],
            ..case(
                "tests/bats/specs/pods-shared-gpu.yaml",
                H100,
                Pods(&[("default/stress-pod-0", ONE_GPU)]),
            )
        },
        Case {
            vars: &[
                ("TEST_K8S_RESOURCE_API_VERSION", "v1"),
                (
                    "TEST_DEVCLASSNAME_CD_CHANNEL",
                    "exactly: {deviceClassName: compute-domain-default-channel.nvidia.com}",
                ),
            ],
            ..case(
                "tests/bats/specs/rc-opaque-cfg-unknown-field.yaml.tmpl",
                H100,
                Pending {
                    why: CHANNELS,
                    now: &Unschedulable(""),
                },
            )
        },
        // without a pod, the claim alone is simulated as one pod's
        case(
            "tests/bats/specs/rc-shared-gpu.yaml",
            H100,
            Pods(&[("(claims)", ONE_GPU)]),
        ),
    ]
}

/// NVIDIA's gpu-test4: two 1g.5gb, a 2g.10gb and a 3g.20gb, all on one GPU.
const MIG_SET: &[&str] = &["mig-1g5gb", "mig-1g5gb", "mig-2g10gb", "mig-3g20gb"];

/// Per pod: its name and either its devices (driver-unique names) or why it stays Pending.
type Outcome = Vec<(String, Result<Vec<String>, String>)>;

fn simulate(dir: &Path, c: &Case, tmp: &Path) -> Result<(Outcome, Objects), String> {
    let mut files = vec![render(dir, c.file, c.vars, tmp)];
    files.extend(c.with.iter().map(|f| render(dir, f, c.vars, tmp)));
    let (profile, layout, dynamic) = match c.node {
        Node::H100 => ("h100-80gb:8", None, true),
        Node::H100Vfio => ("h100-80gb:8", None, false),
        Node::A100 => ("a100-40gb:8", None, false),
        Node::A100HalfBalanced => ("a100-40gb:8", Some("1g.5gb,1g.5gb,2g.10gb,3g.20gb"), false),
        Node::H100Nvl => ("h100-nvl:8", None, true),
        Node::H100Shares(_) => ("h100-80gb:8", None, false),
    };
    let args = SimulateArgs {
        files,
        profile: vec![profile.into()],
        mig_layout: layout.map(String::from),
        dynamic_mig: dynamic,
        feature_gates: match c.node {
            Node::H100Vfio => "PassthroughSupport=true".into(),
            Node::H100Shares(_) => "ConsumableShares=true".into(),
            _ => String::new(),
        },
        consumable_shares: match c.node {
            Node::H100Shares(mode) => mode.parse().expect("a --consumable-shares value"),
            _ => Default::default(),
        },
        ..Default::default()
    };
    let sc = build_scenario(&args, Objects::default(), vec![]).map_err(|e| e.to_string())?;
    let outcome = if sc.objs.workloads.is_empty() {
        let node = run_scenario(&sc).into_iter().next().expect("one node");
        let devices = node
            .claims
            .iter()
            .flat_map(|c| devices(&c.allocation))
            .collect();
        vec![(
            "(claims)".into(),
            if node.fits {
                Ok(devices)
            } else {
                Err(format!("{:?}", node.unsatisfiable))
            },
        )]
    } else {
        run_pods(&sc)
            .into_iter()
            .map(|p| {
                let got = match &p.node {
                    Some(_) => Ok(p
                        .claims
                        .iter()
                        .flat_map(|c| devices(&c.allocation))
                        .collect()),
                    None => Err(format!("{:?} {:?}", p.error, p.refused)),
                };
                (p.pod, got)
            })
            .collect()
    };
    Ok((outcome, sc.objs))
}

fn devices(a: &k8s_openapi::api::resource::v1::AllocationResult) -> Vec<String> {
    a.devices
        .iter()
        .flat_map(|d| d.results.iter().flatten())
        .map(|r| r.device.clone())
        .collect()
}

/// The file, with `vars` substituted as `envsubst` does, written under `tmp` when it has any.
fn render(dir: &Path, file: &str, vars: &[(&str, &str)], tmp: &Path) -> PathBuf {
    let path = dir.join(file);
    if vars.is_empty() {
        return path;
    }
    let mut text = std::fs::read_to_string(&path).expect("read a templated manifest");
    for (k, v) in vars {
        text = text.replace(&format!("${{{k}}}"), v).replace(k, v);
    }
    let out = tmp.join(file.replace('/', "_").trim_end_matches(".tmpl"));
    std::fs::write(&out, text).expect("write the rendered manifest");
    out
}

/// `gpu-3` → `gpu`; `gpu-0-mig-1g10gb-19-0` → `mig-1g10gb`; `gpu-vfio-0` → `vfio`.
fn kind_of(device: &str) -> String {
    match device.split_once("-mig-") {
        Some((_, rest)) => format!("mig-{}", rest.split('-').next().unwrap_or_default()),
        None if device.starts_with("gpu-vfio-") => "vfio".into(),
        None => "gpu".into(),
    }
}

fn check(expect: &Expect, got: &Result<(Outcome, Objects), String>) -> Result<(), String> {
    match (expect, got) {
        (NotManifest(text) | Refused(text), Err(e)) if e.contains(text) => Ok(()),
        (NothingToSimulate(kind), Err(e)) if e.contains("no workload") => {
            let _ = kind; // the ignored list is checked by loading again below
            Ok(())
        }
        (Pods(want), Ok((pods, _))) => check_pods(want, pods, false),
        (Shared(want), Ok((pods, _))) => {
            let want: Vec<(&str, &[&str])> = want.iter().map(|p| (*p, ONE_GPU)).collect();
            check_pods(&want, pods, true)
        }
        (Unschedulable(text), Ok((pods, _))) => pods
            .iter()
            .all(|(_, r)| matches!(r, Err(e) if e.contains(text)))
            .then_some(())
            .ok_or_else(|| format!("want every pod Pending with {text:?}, got {pods:?}")),
        (Pending { now, .. }, got) => check(now, got),
        (want, got) => Err(format!(
            "want {want:?}, got {:?}",
            got.as_ref().map(|g| &g.0)
        )),
    }
}

fn check_pods(want: &[(&str, &[&str])], pods: &Outcome, shared: bool) -> Result<(), String> {
    let names: Vec<&str> = pods.iter().map(|(n, _)| n.as_str()).collect();
    let wanted: Vec<&str> = want.iter().map(|(n, _)| *n).collect();
    if names != wanted {
        return Err(format!("want pods {wanted:?}, got {pods:?}"));
    }
    let mut seen = BTreeSet::new();
    for ((name, got), (_, kinds)) in pods.iter().zip(want) {
        let devices = got.as_ref().map_err(|e| format!("{name}: Pending: {e}"))?;
        let mut got_kinds: Vec<String> = devices.iter().map(|d| kind_of(d)).collect();
        got_kinds.sort();
        if got_kinds != *kinds {
            return Err(format!("{name}: want {kinds:?}, got {devices:?}"));
        }
        // pods share devices only through a shared claim
        let fresh = devices.iter().all(|d| seen.insert(d.clone()));
        if !shared && !fresh {
            return Err(format!("{name}: a device given twice: {devices:?}"));
        }
    }
    if shared && pods.windows(2).any(|w| w[0].1 != w[1].1) {
        return Err(format!("want one shared allocation, got {pods:?}"));
    }
    Ok(())
}

/// The module's directory: `NVIDIA_DRA_DRIVER_DIR`, else `go mod download`.
fn module_dir() -> Option<PathBuf> {
    if let Ok(d) = std::env::var("NVIDIA_DRA_DRIVER_DIR") {
        return Some(PathBuf::from(d));
    }
    let out = std::process::Command::new("go")
        .args(["mod", "download", "-json", MODULE])
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .output();
    let why = match out {
        Ok(o) if o.status.success() => {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
            match v["Dir"].as_str() {
                Some(d) => return Some(PathBuf::from(d)),
                None => format!("no Dir in {}", String::from_utf8_lossy(&o.stdout)),
            }
        }
        Ok(o) => String::from_utf8_lossy(&o.stderr).into_owned(),
        Err(e) => format!("running go: {e}"),
    };
    let message = format!("cannot download {MODULE} (set NVIDIA_DRA_DRIVER_DIR): {why}");
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{message}");
    eprintln!("skipped: {message}");
    None
}

fn all_files(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.join("demo/specs"), dir.join("tests/bats/specs")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)
            .expect("read the module's spec directories")
            .flatten()
        {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(
                    p.strip_prefix(dir)
                        .expect("below dir")
                        .display()
                        .to_string(),
                );
            }
        }
    }
    out
}

#[test]
fn nvidia_manifests_give_nvidias_outcome() {
    let Some(dir) = module_dir() else { return };
    let cases = cases();
    let listed: BTreeSet<String> = cases.iter().map(|c| c.file.to_string()).collect();
    let files = all_files(&dir);
    let missing: Vec<&String> = files.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "files without an expected outcome: {missing:?}"
    );
    let tmp = std::env::temp_dir().join(format!("nvidia-manifests-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("temp dir");
    let mut failures = Vec::new();
    for c in &cases {
        let got = simulate(&dir, c, &tmp);
        if let Err(e) = check(&c.expect, &got) {
            failures.push(format!("{}: {e}", c.file));
        }
        if let (NothingToSimulate(kind), Err(_)) = (&c.expect, &got) {
            check_ignored(&dir, c, kind, &tmp, &mut failures);
        }
        if let Pending { why, .. } = &c.expect {
            eprintln!("pending: {}: {why}", c.file);
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A file with nothing to simulate lists its objects as ignored, by kind.
fn check_ignored(dir: &Path, c: &Case, kind: &str, tmp: &Path, failures: &mut Vec<String>) {
    let mut objs = Objects::default();
    let file = render(dir, c.file, c.vars, tmp);
    match dra_sim::input::load_paths(&[file], &mut objs) {
        Ok(()) if objs.ignored.iter().any(|i| i.contains(kind)) => {}
        Ok(()) => failures.push(format!(
            "{}: want {kind} ignored, got {:?}",
            c.file, objs.ignored
        )),
        Err(e) => failures.push(format!("{}: {e}", c.file)),
    }
}
