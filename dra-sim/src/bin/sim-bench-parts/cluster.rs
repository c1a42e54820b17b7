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
    /// CPU seconds of the process over the run (all threads)
    cpu: f64,
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
    // the third: the mix again, each node's Filter outcomes remembered until the node changes
    for (whole_only, remember) in [(false, false), (true, false), (false, true)] {
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
        if remember {
            run = run.remember_outcomes();
        }
        let claims: Vec<Vec<_>> = kinds.iter().map(|(_, c)| vec![c.clone()]).collect();
        let (start, cpu) = (Instant::now(), cpu_seconds());
        for &k in &seq {
            run.schedule(&claims[k]);
        }
        let m = Measured {
            seconds: start.elapsed().as_secs_f64(),
            cpu: cpu_seconds() - cpu,
            stats: run.stats,
            threads,
        };
        let mix = match (whole_only, remember) {
            (true, _) => "whole GPUs only (70% 1 GPU, 30% 2 GPUs)",
            (false, false) => "mixed (40% 1 GPU, 15% 2 GPUs, 25% MIG 1g.10gb, 20% MIG 3g.40gb)",
            (false, true) => {
                "mixed, each node's Filter outcome per pod shape remembered until the node changes"
            }
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
        "cluster: {mix}: {:.1} s on {} Filter threads ({:.1} CPU s), {rate:.0} pods/s, {} placed, {} unschedulable, {} Filter calls ({} computed, {per_call:.1} µs each), {} Filter errors",
        m.seconds,
        m.threads,
        m.cpu,
        s.placed,
        s.unschedulable,
        s.filter_calls,
        s.computed,
        s.filter_errors
    );
    let mut value = format!(
        "{:.1} s on {} Filter threads ({:.1} CPU s), {rate:.0} pods/s, {} placed, {} unschedulable, {} Filter calls",
        m.seconds, m.threads, m.cpu, s.placed, s.unschedulable, s.filter_calls
    );
    if s.computed != s.filter_calls {
        value.push_str(&format!(", {} computed", s.computed));
    }
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

/// CPU seconds (user and system) the process has used so far, from /proc/self/stat.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // fields after the command name, which is in parentheses and may hold spaces
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime, fields 14 and 15 of the line (11 and 12 here); 100 ticks a second
    (ticks(11) + ticks(12)) / 100.0
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
