//! Simulator benchmarks, each side by side with the Go oracle (e2e/oracle, upstream
//! k8s.io/dynamic-resource-allocation v0.37.2) in one run, printing the ratio:
//! 1. CEL evaluations per second on a fixed selector set over simulated H100 devices, each
//!    evaluation reading the ResourceSlice device in place and checking it converts (cel-go
//!    converts the device on every evaluation too);
//! 2. one pod's allocation (the inference-gpu claim) over N nodes × 8 H100 GPUs with dynamic MIG
//!    counters (default N = 5000), a fresh allocator per pod like one scheduling cycle. Three Rust
//!    figures: "cold" (every per-device and per-slice result computed anew for each pod, nothing
//!    carried over); "slice store" (the slices' own facts — CEL conversion checks, parsed
//!    counters, counter references, duplicate names, see `SliceFacts` — computed once when the
//!    slices load, as a scheduler would when its informer receives a slice, and everything that
//!    depends on classes or claims computed anew per pod; the Go allocator converts and validates
//!    every slice again for every pod and node); and "warm" (class-selector outcomes kept between
//!    pods too). On both sides the first pod after loading is timed on its own ("first pod") and
//!    the per-pod figures average at least three pods (and 3 s) after it: the Rust side's first
//!    pass over objects nobody has read since they were built took up to twice as long as the
//!    next on this VM, and a Go pod took 3 to 8 s depending on whether a garbage collection of
//!    the whole heap fell inside it.
//!    The Go side reads the same objects from one streamed file (a JSON tree in memory would not
//!    fit at 5,000 nodes); it needs about 7 GiB at 5,000 nodes, the Rust side about 14 GiB.
//!
//! 3. with `--cluster PODS`, only the whole-cluster run (sim-bench-parts/cluster.rs): PODS pods
//!    scheduled one after another onto the N nodes as kube-scheduler would, allocations carried
//!    over. The Go allocator is not run there (the oracle has no per-node loop over a changing
//!    state); `--go-per-filter-s S` (the Go allocator's one-pod seconds ÷ nodes, from figure 2)
//!    adds an estimate, labelled as one: S × the same number of Filter calls (`make bench-sim`
//!    takes S from its first command's Go figure). A third run of the mix remembers each node's
//!    Filter outcomes until the node changes (`ClusterRun::remember_outcomes`).
//!
//! Usage: sim-bench [--nodes N] [--pods P] [--oracle PATH] [--warm-only|--cold-only]
//!        [--cluster PODS [--go-per-filter-s S]]   (builds the oracle with
//! e2e/oracle/build.sh when --oracle is not given; set SIM_BENCH_NO_GO=1 to run the Rust side
//! only; --warm-only / --cold-only run just that loop, for profiling; --pods P: at least P timed
//! pods after the first on both sides, default 3: a collection of the whole Go heap falls into
//! some pods and not others, so more pods average it in at its real rate)
// The same allocator as the dra-controller binary, so the figures are the CLI's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "sim-bench-parts/cluster.rs"]
mod cluster;

use dra_sim::alloc::{AllocatedState, Allocator, DeviceCache, SimNode, SliceFacts};
use dra_sim::{cel, cli, input};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SELECTORS: &[&str] = &[
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
    "device.attributes['gpu.nvidia.com'].?profile.orValue('') == '3g.40gb'",
    "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
    "device.attributes['gpu.nvidia.com'].productName.lowerAscii().contains('h100')",
    "cel.bind(g, device.attributes['gpu.nvidia.com'], g.cudaComputeCapability.isGreaterThan(semver('8.0.0')) && g.driverVersion.major() >= 500)",
];

fn oracle(arg: Option<String>) -> Option<PathBuf> {
    if std::env::var("SIM_BENCH_NO_GO").is_ok() {
        return None;
    }
    if let Some(p) = arg {
        return Some(PathBuf::from(p));
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = root.join("target/sim-bench-oracle");
    let ok = Command::new("bash")
        .arg(root.join("e2e/oracle/build.sh"))
        .arg(&out)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        eprintln!(
            "sim-bench: could not build the Go oracle (is `go` installed?); Rust figures only"
        );
        return None;
    }
    Some(out)
}

fn run_go(bin: &PathBuf, mode: &str, cases: &serde_json::Value) -> serde_json::Value {
    let mut child = Command::new(bin)
        .arg(mode)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start oracle");
    {
        let mut stdin = child.stdin.take().expect("stdin");
        serde_json::to_writer(&mut stdin, cases).expect("write cases");
        stdin.flush().expect("flush");
    }
    let out = child.wait_with_output().expect("oracle");
    assert!(out.status.success(), "oracle {mode} failed");
    serde_json::from_slice(&out.stdout).expect("oracle JSON")
}

fn main() -> anyhow::Result<()> {
    let mut nodes = 5000usize;
    let mut oracle_arg = None;
    let mut warm_only = false;
    let mut cold_only = false;
    let mut pods = 3u32;
    let mut cluster_pods = None;
    let mut go_per_filter_s = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--nodes" => nodes = args.next().expect("--nodes N").parse()?,
            "--oracle" => oracle_arg = args.next(),
            "--pods" => pods = args.next().expect("--pods N").parse()?,
            "--cluster" => cluster_pods = Some(args.next().expect("--cluster PODS").parse()?),
            "--go-per-filter-s" => go_per_filter_s = Some(args.next().expect("S").parse()?),
            // profiling aids: only the warm (or cold) allocation loop, no Go
            "--warm-only" => warm_only = true,
            "--cold-only" => cold_only = true,
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    if let Some(p) = cluster_pods {
        return cluster::run(nodes, p, go_per_filter_s);
    }
    let go = if warm_only || cold_only {
        None
    } else {
        oracle(oracle_arg)
    };

    // 1. CEL
    let slices =
        gpu_dra_api::slices::simulated_node_slices("bench-node", &["h100-80gb:8"], None, true)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    let devices: Vec<_> = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten().map(move |d| (s, d)))
        .take(64)
        .collect();
    let progs: Vec<_> = SELECTORS
        .iter()
        .map(|s| cel::compile(s).expect("selector compiles"))
        .collect();
    let mut evals = Vec::new();
    let mut pairs = Vec::new();
    for (s, d) in &devices {
        // Read in place, as the allocator does; checked per evaluation below, as cel-go converts
        // the device per evaluation.
        let raw = cel::RawDevice::of(&s.spec.driver, d);
        for (i, sel) in SELECTORS.iter().enumerate() {
            pairs.push((i, raw));
            evals.push(json!({"expression": sel, "device": {"Driver": s.spec.driver, "Attributes": d.attributes, "Capacity": d.capacity}}));
        }
    }
    let mut n = 0u64;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        for (i, raw) in &pairs {
            let r = cel::device_check(raw).and_then(|()| progs[*i].eval_raw(*raw));
            let _ = std::hint::black_box(r);
            n += 1;
        }
    }
    let rust_cel = n as f64 / start.elapsed().as_secs_f64();
    println!(
        "cel: rust {:.0} evals/s ({} selectors x {} devices)",
        rust_cel,
        SELECTORS.len(),
        devices.len()
    );
    if let Some(bin) = &go {
        let r = run_go(bin, "bench-cel", &json!([{"evals": evals}]));
        let go_cel = r["per_sec"].as_f64().unwrap_or(0.0);
        println!(
            "cel: go   {:.0} evals/s; ratio rust/go = {:.2}x (goal >= 10x)",
            go_cel,
            rust_cel / go_cel
        );
        let ratio = rust_cel / go_cel;
        let verdict = if ratio >= 10.0 {
            String::new()
        } else {
            format!(": MISSED, {:.1}× short", 10.0 / ratio)
        };
        perf_row(
            "sim: CEL selector evaluations per second, ours vs cel-go",
            "≥ 10×",
            format!("{rust_cel:.0} vs {go_cel:.0} ({ratio:.1}×{verdict})"),
        );
    }

    // 2. allocation over N nodes
    let mut classes = input::Objects::default();
    for (name, text) in cli::EMBEDDED_CLASSES {
        input::load_str(name, text, &mut classes)?;
    }
    let mut claims = input::Objects::default();
    input::load_str(
        "inference-gpu.yaml",
        include_str!("../../../examples/claims/inference-gpu.yaml"),
        &mut claims,
    )?;
    claims.claims = claims.standalone_claims();
    let (all_slices, node_objs) = bench_nodes(nodes)?;
    // cold: a fresh allocator per pod, every per-device value built anew (one scheduling cycle
    // with nothing carried over); the first pod timed on its own (see the top of the file)
    let cold_pod = || {
        let a = Allocator::new(&classes.classes, &all_slices, AllocatedState::default());
        node_objs
            .iter()
            .filter(|n| matches!(a.allocate(n, &claims.claims), Ok(Some(_))))
            .count()
    };
    let start = Instant::now();
    let mut fits = 0;
    if !warm_only {
        cold_pod();
    }
    let rust_first = start.elapsed().as_secs_f64();
    let mut iters = 0u32;
    let start = Instant::now();
    while !warm_only && (iters < pods || start.elapsed() < Duration::from_secs(3)) {
        fits = cold_pod();
        iters += 1;
    }
    let rust_pod = start.elapsed().as_secs_f64() / f64::from(iters.max(1));
    println!(
        "alloc: rust {:.4} s per pod over {} nodes x 8 H100 (dynamic MIG), {} pods, {} nodes fit (cold: fresh allocator and device cache per pod; first pod {:.4} s)",
        rust_pod, nodes, iters, fits, rust_first
    );
    if cold_only {
        return Ok(());
    }
    // store: the slices' own facts (CEL conversion checks, counters, counter references,
    // duplicate names) computed once when the slices load, as a scheduler would when its
    // informer receives a slice; per pod a fresh allocator and fresh class and selector outcomes
    let start = Instant::now();
    let facts = Arc::new(SliceFacts::build(&all_slices));
    let facts_s = start.elapsed().as_secs_f64();
    let store_pod = || {
        let cache = Arc::new(DeviceCache::with_facts(&all_slices, facts.clone()));
        let a = Allocator::with_cache(
            &classes.classes,
            &all_slices,
            AllocatedState::default(),
            cache,
        );
        node_objs
            .iter()
            .filter(|n| matches!(a.allocate(n, &claims.claims), Ok(Some(_))))
            .count()
    };
    let start = Instant::now();
    store_pod();
    let store_first = start.elapsed().as_secs_f64();
    let mut siters = 0u32;
    let start = Instant::now();
    while siters < pods || start.elapsed() < Duration::from_secs(3) {
        fits = store_pod();
        siters += 1;
    }
    let rust_store = start.elapsed().as_secs_f64() / f64::from(siters);
    println!(
        "alloc: rust {rust_store:.4} s per pod, {siters} pods, {fits} nodes fit (slice store: per-slice facts built once in {facts_s:.2} s when the slices load, then per pod a fresh allocator and fresh class and selector outcomes; first pod {store_first:.4} s)"
    );
    // warm: a fresh allocator per pod over a DeviceCache kept between pods (CEL device values and
    // class-selector outcomes), as a scheduler keeps its slice cache between cycles
    let cache = Arc::new(DeviceCache::with_facts(&all_slices, facts.clone()));
    let warmup = Allocator::with_cache(
        &classes.classes,
        &all_slices,
        AllocatedState::default(),
        cache.clone(),
    );
    for n in &node_objs {
        let _ = warmup.allocate(n, &claims.claims);
    }
    drop(warmup);
    let mut witers = 0u32;
    let start = Instant::now();
    while witers == 0 || start.elapsed() < Duration::from_secs(3) {
        let a = Allocator::with_cache(
            &classes.classes,
            &all_slices,
            AllocatedState::default(),
            cache.clone(),
        );
        for n in &node_objs {
            let _ = std::hint::black_box(a.allocate(n, &claims.claims));
        }
        witers += 1;
    }
    let rust_warm = start.elapsed().as_secs_f64() / f64::from(witers);
    drop(cache);
    drop(facts);
    println!("alloc: rust {rust_warm:.4} s per pod (warm: device cache kept between pods)");
    if let Some(bin) = &go {
        // one input file for the Go side, streamed from the same objects (a JSON tree in memory
        // would not fit at 5,000 nodes)
        #[derive(serde::Serialize)]
        struct AllocCase<'a> {
            classes: &'a [k8s_openapi::api::resource::v1::DeviceClass],
            slices: &'a [k8s_openapi::api::resource::v1::ResourceSlice],
            claims: &'a [k8s_openapi::api::resource::v1::ResourceClaim],
            allocated: [(); 0],
        }
        let path = std::env::temp_dir().join(format!("sim-bench-alloc-{nodes}.json"));
        {
            let f = std::io::BufWriter::new(std::fs::File::create(&path)?);
            serde_json::to_writer(
                f,
                &[AllocCase {
                    classes: &classes.classes,
                    slices: &all_slices,
                    claims: &claims.claims,
                    allocated: [],
                }],
            )?;
        }
        // free the Rust side's objects before the Go side loads its copy (peak memory)
        drop(all_slices);
        drop(node_objs);
        // hand the freed heap back to the OS now (mimalloc would wait for later allocations), or
        // the two sides together come close to a 24 GiB machine
        // SAFETY: mi_collect only returns free pages of mimalloc's own heaps to the OS.
        unsafe {
            libmimalloc_sys::mi_collect(true);
        }
        let out = Command::new(bin)
            .arg("bench-alloc")
            .env("BENCH_PODS", pods.to_string())
            .stdin(std::fs::File::open(&path)?)
            .output()?;
        let _ = std::fs::remove_file(&path);
        anyhow::ensure!(
            out.status.success(),
            "oracle bench-alloc failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let go_pod = r["seconds_per_pod"].as_f64().unwrap_or(0.0);
        println!(
            "alloc: go   {:.4} s per pod over {} pods ({} nodes fit; first pod {:.4} s); ratio go/rust = {:.2}x cold, {:.2}x slice store, {:.2}x warm (goal >= 10x)",
            go_pod,
            r["pods"],
            r["fits"],
            r["first_pod_seconds"].as_f64().unwrap_or(0.0),
            go_pod / rust_pod,
            go_pod / rust_store,
            go_pod / rust_warm
        );
        let shape = format!("{nodes} nodes × 8 H100, dynamic MIG");
        for (how, ours) in [
            ("from nothing per pod", rust_pod),
            ("slice facts kept", rust_store),
            ("device cache kept", rust_warm),
        ] {
            perf_row(
                &format!("sim: one pod's allocation over {shape}, {how}, ours vs the Go allocator"),
                "≥ 10×",
                format!("{ours:.3} s vs {go_pod:.3} s ({:.1}×)", go_pod / ours),
            );
        }
    }
    Ok(())
}

/// One row of docs/perf.md for tools/perf-table.py: `perf|figure|goal|value`.
/// `nodes` nodes of 8 H100 with dynamic MIG (every placement published) and their slices.
fn bench_nodes(
    nodes: usize,
) -> anyhow::Result<(
    Vec<k8s_openapi::api::resource::v1::ResourceSlice>,
    Vec<SimNode>,
)> {
    let mut slices = Vec::new();
    let mut node_objs = Vec::with_capacity(nodes);
    for i in 0..nodes {
        let name = format!("node-{i:05}");
        slices.extend(
            gpu_dra_api::slices::simulated_node_slices(&name, &["h100-80gb:8"], None, true)
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        );
        node_objs.push(SimNode {
            name,
            labels: Default::default(),
        });
    }
    Ok((slices, node_objs))
}

fn perf_row(figure: &str, goal: &str, value: String) {
    println!("perf|{figure}|{goal}|{value}");
}
