//! `sim-bench --cluster PODS`: the whole-cluster run (see `dra_sim::cluster`), PODS pods onto
//! N nodes × 8 H100 with dynamic MIG slices (every MIG placement published), pod after pod with
//! allocations carried over; once with a mix of whole GPUs and MIG slices, once with whole GPUs
//! only. Rows for docs/perf.md: total seconds, pods per second, placed / unschedulable, Filter
//! calls, and the peak RSS of the process.
use dra_sim::alloc::{AllocatedState, DeviceCache, SliceFacts};
use dra_sim::cluster::{ClusterRun, RunStats, pod_kinds, pod_sequence};
use dra_sim::{cli, input};
use std::sync::Arc;
use std::time::Instant;

/// What the caller prints rows from.
struct Measured {
    seconds: f64,
    stats: RunStats,
    threads: usize,
}

pub fn run(nodes: usize, pods: usize, go_per_filter_s: Option<f64>) -> anyhow::Result<()> {
    // Filter on every core, as the scheduler runs it on 16 goroutines
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut classes = input::Objects::default();
    for (name, text) in cli::EMBEDDED_CLASSES {
        input::load_str(name, text, &mut classes)?;
    }
    let start = Instant::now();
    let (slices, node_objs) = super::bench_nodes(nodes)?;
    // the slice facts are built when the slices load (the informer's work), not per run
    let facts = Arc::new(SliceFacts::build(&slices));
    println!(
        "cluster: {nodes} nodes x 8 H100 (dynamic MIG), {} slices loaded in {:.2} s",
        slices.len(),
        start.elapsed().as_secs_f64()
    );
    for whole_only in [false, true] {
        let kinds = pod_kinds(whole_only);
        let seq = pod_sequence(pods, kinds.len());
        let cache = Arc::new(DeviceCache::with_facts(&slices, facts.clone()));
        let mut run = ClusterRun::new(
            &classes.classes,
            &slices,
            cache,
            &node_objs,
            AllocatedState::default(),
        )
        .with_threads(threads);
        let claims: Vec<Vec<_>> = kinds.iter().map(|(_, c)| vec![c.clone()]).collect();
        let start = Instant::now();
        for &k in &seq {
            run.schedule(&claims[k]);
        }
        let m = Measured {
            seconds: start.elapsed().as_secs_f64(),
            stats: run.stats,
            threads,
        };
        let mix = if whole_only {
            "whole GPUs only (70% 1 GPU, 30% 2 GPUs)"
        } else {
            "mixed (40% 1 GPU, 15% 2 GPUs, 25% MIG 1g.10gb, 20% MIG 3g.40gb)"
        };
        report(nodes, pods, mix, &m, go_per_filter_s);
    }
    let rss = peak_rss_mib();
    println!("cluster: peak RSS {rss:.0} MiB");
    super::perf_row(
        &format!("sim: whole-cluster run, {pods} pods onto {nodes} nodes × 8 H100, peak RSS"),
        "—",
        format!("{rss:.0} MiB"),
    );
    Ok(())
}

fn report(nodes: usize, pods: usize, mix: &str, m: &Measured, go_per_filter_s: Option<f64>) {
    let s = &m.stats;
    let rate = pods as f64 / m.seconds;
    let per_call = m.seconds / s.filter_calls.max(1) as f64 * 1e6;
    println!(
        "cluster: {mix}: {:.1} s on {} Filter threads, {rate:.0} pods/s, {} placed, {} unschedulable, {} Filter calls ({per_call:.1} µs each), {} Filter errors",
        m.seconds, m.threads, s.placed, s.unschedulable, s.filter_calls, s.filter_errors
    );
    let mut value = format!(
        "{:.1} s on {} Filter threads, {rate:.0} pods/s, {} placed, {} unschedulable, {} Filter calls",
        m.seconds, m.threads, s.placed, s.unschedulable, s.filter_calls
    );
    if let Some(go) = go_per_filter_s {
        // not a run: the Go allocator's Filter cost per node, from its one-pod run over the same
        // nodes (figure 2), times the Filter calls this run made
        let est = go * s.filter_calls as f64;
        println!(
            "cluster: Go allocator ESTIMATE for the same Filter calls: {est:.0} s ({:.3} ms per call × {} calls; not a run)",
            go * 1e3,
            s.filter_calls
        );
        value.push_str(&format!(
            "; Go allocator est. {est:.0} s, not run: its one-pod Filter over the same {nodes} nodes ÷ {nodes} ({:.3} ms) × the same calls",
            go * 1e3
        ));
    }
    super::perf_row(
        &format!(
            "sim: whole-cluster run, {pods} pods onto {nodes} nodes × 8 H100, dynamic MIG, {mix}"
        ),
        "< 60 s",
        value,
    );
}

/// The process's peak resident set (VmHWM), in MiB.
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}
