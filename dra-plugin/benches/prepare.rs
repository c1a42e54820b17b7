//! Prepare/unprepare latency over the real DRA socket, and the plugin's peak memory.
//!
//! Starts `dra-plugin run` (simulated backend, offline claims, real fsync'd checkpoint and CDI
//! writes) as a child process, drives N concurrent claims through R prepare/unprepare rounds each
//! over one shared HTTP/2 connection (as the kubelet keeps one per plugin; a bare hyper connection,
//! so the load generator costs little of the cores it shares), and prints p50/p99 per call,
//! in two modes: `loop` (each claim's client prepares and unprepares back to back: the plugin
//! saturated, so latency is N over throughput) and `burst` (all N prepares issued at once, then all
//! N unprepares, as when N pods land on the node together),
//! CPU per pair (plugin and load generator, which share this machine's cores) and the child's peak
//! RSS (VmHWM). Each case starts with one burst that is not counted (the plugin's first calls
//! size its checkpoint files, start blocking threads and fault in its memory); its slowest
//! prepare is printed as `cold`. The load generator runs on one thread, as the kubelet's calls
//! come over one connection, so that it leaves the other core to the plugin. Figures, not
//! assertions. BENCH_ROUNDS=R (200), BENCH_ONLY=<label text>, BENCH_MODE=loop|burst, BENCH_DIST=1
//! (percentiles), BENCH_CLIENT_THREADS=N (a multi-threaded load generator),
//! DRA_PLUGIN_BIN=<another build, e.g. with frame pointers for profiling>.
//! `ref` is this machine's speed on fixed work before and after the counted rounds (see
//! [`machine_speed`]): on a shared VM it moves by half or more within minutes. It does not sort
//! runs by p99 well; the plugin's CPU per pair, for the same work, does.
//! CDI specs go to tmpfs when `/dev/shm` exists (as `/var/run/cdi` on a node), the fsync'd
//! checkpoint to the disk the temp dir is on.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use dra_plugin::grpc::client::get_info;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kubelet_proto::dra_v1::{self as v1, dra_plugin_client::DraPluginClient};

/// One HTTP/2 connection shared by every simulated pod, without the request queue and worker
/// task a `tonic::transport::Channel` adds: the load generator shares this machine's cores with
/// the plugin, so it should cost as little as the kubelet's grpc-go client does.
#[derive(Clone)]
struct H2(SendRequest<tonic::body::Body>);

impl tower::Service<http::Request<tonic::body::Body>> for H2 {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, hyper::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(req))
    }
}

async fn h2_connect(sock: &Path) -> H2 {
    let io = TokioIo::new(tokio::net::UnixStream::connect(sock).await.unwrap());
    let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .unwrap();
    tokio::spawn(conn);
    H2(send)
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// N clients back to back: throughput-bound, latency is N / throughput.
    Loop,
    /// N calls at once per round, as when N pods land on the node together.
    Burst,
}

struct Run {
    label: &'static str,
    profiles: &'static [&'static str],
    layout: &'static str,
    gates: &'static str,
    /// Device names, one per concurrent claim.
    devices: Vec<String>,
}

#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "p is in [0, 1], so the rounded rank is in 0..len"
)]
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// User + system CPU the process has used so far (from /proc, in clock ticks of 10 ms).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// Wall time per unit of fixed work like the plugin's, single-threaded: a JSON round trip of a
/// ResourceClaim (parse to a value, serialize; allocation-heavy like request handling), and create,
/// write, rename and unlink of a 1 KiB file in `dir` (the file system calls of a CDI spec). Wall,
/// not CPU, time: a vCPU the host takes away still counts as CPU time inside the VM.
fn machine_speed(dir: &Path) -> (Duration, Duration) {
    const N: u32 = 400;
    let claim = claim_json("bench-0", "00000000-0000-0000-0000-000000000000", "gpu-0").to_string();
    let t = Instant::now();
    for _ in 0..N {
        let v: serde_json::Value = serde_json::from_str(std::hint::black_box(&claim)).unwrap();
        std::hint::black_box(serde_json::to_vec(&v).unwrap());
    }
    let cpu = t.elapsed() / N;
    let (tmp, path) = (dir.join(".speed.tmp"), dir.join("speed.json"));
    let block = [b' '; 1024];
    let t = Instant::now();
    for _ in 0..N {
        std::fs::write(&tmp, block).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        std::fs::remove_file(&path).unwrap();
    }
    (cpu, t.elapsed() / N)
}

fn claim_json(name: &str, uid: &str, device: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "bench", "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "bench-node", "device": device}]}}}
    })
}

fn write_claim(dir: &Path, i: usize, device: &str) -> v1::Claim {
    let name = format!("bench-{i}");
    let uid = format!("00000000-0000-0000-0000-{i:012}");
    let obj = claim_json(&name, &uid, device);
    std::fs::write(dir.join(format!("bench_{name}.json")), obj.to_string()).unwrap();
    v1::Claim {
        namespace: "bench".into(),
        uid,
        name,
    }
}

/// What a run gives the figures table (docs/perf.md).
struct Figures {
    prepare_p99_ms: f64,
    cpu_per_pair_us: f64,
    peak_rss_mib: f64,
}

async fn bench(run: &Run, mode: Mode, rounds: usize) -> Option<Figures> {
    // BENCH_ONLY=<text> runs the cases whose label contains it (profiling one case).
    if let Ok(only) = std::env::var("BENCH_ONLY")
        && !run.label.contains(&only)
    {
        return None;
    }
    let tmp = tempfile::tempdir().unwrap();
    // On nodes /var/run/cdi lives on tmpfs (/run); the checkpoint lives on the kubelet's disk.
    // Mirror that when this machine has a tmpfs, so the figures are a node's.
    let cdi_tmp = tempfile::tempdir_in("/dev/shm").ok();
    let cdi_dir = cdi_tmp
        .as_ref()
        .map(|t| t.path().join("cdi"))
        .unwrap_or_else(|| tmp.path().join("cdi"));
    let dir = tmp.path();
    let claims_dir = dir.join("claims");
    std::fs::create_dir_all(&claims_dir).unwrap();
    std::fs::write(dir.join("boot_id"), "bench\n").unwrap();
    let claims: Vec<v1::Claim> = run
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| write_claim(&claims_dir, i, d))
        .collect();

    // DRA_PLUGIN_BIN: another build of the plugin (e.g. with frame pointers, for profiling).
    let bin = std::env::var("DRA_PLUGIN_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_dra-plugin").to_string());
    let mut cmd = std::process::Command::new(bin);
    cmd.args([
        "run",
        "--backend",
        "simulated",
        "--node-name",
        "bench-node",
        "--metrics-port",
        "0",
        "--healthcheck-port",
        "0",
        "--mig-layout",
        run.layout,
        "--feature-gates",
        run.gates,
    ]);
    for p in run.profiles {
        cmd.args(["--profile", p]);
    }
    let arg = |p: PathBuf| p.to_string_lossy().into_owned();
    cmd.args([
        "--registrar-dir",
        &arg(dir.join("registry")),
        "--plugin-dir",
        &arg(dir.join("plugin")),
        "--cdi-root",
        &arg(cdi_dir.clone()),
    ]);
    cmd.args([
        "--offline-claims-dir",
        &arg(claims_dir),
        "--boot-id-file",
        &arg(dir.join("boot_id")),
    ]);
    cmd.env("RUST_LOG", "warn");
    let mut child = cmd.spawn().expect("start dra-plugin");
    let reg = dir.join("registry/gpu.nvidia.com-reg.sock");
    let started = Instant::now();
    while get_info(&reg).await.is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "plugin did not come up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sock = dir.join("plugin/dra.sock");
    let channel = h2_connect(&sock).await;
    let origin: http::Uri = "http://localhost".parse().unwrap();
    let speed_dir = cdi_tmp.as_ref().map_or(dir, |t| t.path());
    let (cold, _) = drive_bursts(&channel, &origin, claims.clone(), 1).await;
    let speed_before = machine_speed(speed_dir);
    let cold = cold.into_iter().max().unwrap_or_default();
    let wall = Instant::now();
    let cpu_before = cpu_time(child.id());
    let own_before = cpu_time(std::process::id());
    let (mut prep, mut unprep) = match mode {
        Mode::Loop => drive_loop(&channel, &origin, claims, rounds).await,
        Mode::Burst => drive_bursts(&channel, &origin, claims, rounds).await,
    };
    let wall = wall.elapsed();
    let speed_after = machine_speed(speed_dir);
    let plugin_cpu = cpu_time(child.id()) - cpu_before;
    let client_cpu = cpu_time(std::process::id()) - own_before;
    prep.sort();
    unprep.sort();
    if std::env::var("BENCH_DIST").is_ok() {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        for p in [0.5, 0.75, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1.0] {
            eprintln!(
                "  prepare p{:<5} {:.2} ms",
                p * 100.0,
                ms(percentile(&prep, p))
            );
        }
    }
    let rss = peak_rss_kib(child.id());
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let _ = child.wait();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "{:<44} {:<5} concurrent={:<3} pairs={:<5} prepare p50={:.2}ms p99={:.2}ms  unprepare p50={:.2}ms p99={:.2}ms  throughput={:.0} pairs/s  CPU/pair plugin={:.0}us client={:.0}us  peak RSS={:.1} MiB  cold={:.2}ms  ref cpu={:.1}/{:.1}us fs={:.1}/{:.1}us",
        run.label,
        match mode {
            Mode::Loop => "loop",
            Mode::Burst => "burst",
        },
        run.devices.len(),
        prep.len(),
        ms(percentile(&prep, 0.5)),
        ms(percentile(&prep, 0.99)),
        ms(percentile(&unprep, 0.5)),
        ms(percentile(&unprep, 0.99)),
        prep.len() as f64 / wall.as_secs_f64(),
        plugin_cpu.as_secs_f64() * 1e6 / prep.len() as f64,
        client_cpu.as_secs_f64() * 1e6 / prep.len() as f64,
        rss as f64 / 1024.0,
        ms(cold),
        us(speed_before.0),
        us(speed_after.0),
        us(speed_before.1),
        us(speed_after.1),
    );
    Some(Figures {
        prepare_p99_ms: ms(percentile(&prep, 0.99)),
        cpu_per_pair_us: plugin_cpu.as_secs_f64() * 1e6 / prep.len() as f64,
        peak_rss_mib: rss as f64 / 1024.0,
    })
}

/// One row of docs/perf.md for tools/perf-table.py: `perf|figure|goal|value`.
fn perf_row(figure: &str, goal: &str, value: String) {
    println!("perf|{figure}|{goal}|{value}");
}

/// Each claim its own client looping prepare, unprepare with no pause: the plugin saturated.
async fn drive_loop(
    channel: &H2,
    origin: &http::Uri,
    claims: Vec<v1::Claim>,
    rounds: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let tasks: Vec<_> = claims
        .into_iter()
        .map(|c| {
            let mut client = DraPluginClient::with_origin(channel.clone(), origin.clone());
            tokio::spawn(async move {
                let (mut prep, mut unprep) = (Vec::new(), Vec::new());
                for _ in 0..rounds {
                    prep.push(call(&mut client, &c, Call::Prepare).await);
                    unprep.push(call(&mut client, &c, Call::Unprepare).await);
                }
                (prep, unprep)
            })
        })
        .collect();
    let (mut prep, mut unprep) = (Vec::new(), Vec::new());
    for t in tasks {
        let (p, u) = t.await.unwrap();
        prep.extend(p);
        unprep.extend(u);
    }
    (prep, unprep)
}

/// Every claim's prepare issued at once, each its own call (64 pods admitted together), then
/// every unprepare at once; `rounds` times.
async fn drive_bursts(
    channel: &H2,
    origin: &http::Uri,
    claims: Vec<v1::Claim>,
    rounds: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let (mut prep, mut unprep) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for op in [Call::Prepare, Call::Unprepare] {
            let calls: Vec<_> = claims
                .iter()
                .map(|c| {
                    let mut client = DraPluginClient::with_origin(channel.clone(), origin.clone());
                    let c = c.clone();
                    tokio::spawn(async move { call(&mut client, &c, op).await })
                })
                .collect();
            let out = match op {
                Call::Prepare => &mut prep,
                Call::Unprepare => &mut unprep,
            };
            for handle in calls {
                out.push(handle.await.unwrap());
            }
        }
    }
    (prep, unprep)
}

type Client = DraPluginClient<H2>;

#[derive(Clone, Copy, Debug)]
enum Call {
    Prepare,
    Unprepare,
}

/// One call for one claim; how long it took. Panics if the claim's result is an error.
async fn call(client: &mut Client, c: &v1::Claim, op: Call) -> Duration {
    let t = Instant::now();
    let claims = vec![c.clone()];
    let error = match op {
        Call::Prepare => client
            .node_prepare_resources(v1::NodePrepareResourcesRequest { claims })
            .await
            .unwrap()
            .into_inner()
            .claims
            .remove(&c.uid)
            .map(|r| r.error),
        Call::Unprepare => client
            .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims })
            .await
            .unwrap()
            .into_inner()
            .claims
            .remove(&c.uid)
            .map(|r| r.error),
    };
    let took = t.elapsed();
    assert_eq!(error.as_deref(), Some(""), "{op:?} failed");
    took
}

fn mig_devices(gpus: u32) -> Vec<String> {
    (0..gpus)
        .flat_map(|g| (0..7).map(move |s| format!("gpu-{g}-mig-1g10gb-19-{s}")))
        .collect()
}

fn main() {
    // A burst's calls are slow or fast together: with 20 rounds one slow burst is 5% of the
    // samples and alone sets their p99 (20-round runs of one build read 3.0-7.3 ms; 200-round
    // runs of it 3.3-5.6 ms, their slowest bursts at p99.9). The slowest 1% must span more than
    // one burst for p99 to mean something: 200 rounds, 1% = two bursts.
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(200);
    println!(
        "checkpoint on {} (fsync'd); CDI specs on {}",
        std::env::temp_dir().display(),
        if Path::new("/dev/shm").is_dir() {
            "tmpfs (/dev/shm)"
        } else {
            "the same disk"
        }
    );
    let rt = match std::env::var("BENCH_CLIENT_THREADS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
    {
        Some(n) if n > 1 => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
    }
    .unwrap();
    rt.block_on(async {
        let mut mixed = mig_devices(8);
        mixed.extend((8..16).map(|g| format!("gpu-{g}")));
        let cases = [
            Run {
                label: "8x H100 80GB, whole GPUs",
                profiles: &["h100-80gb:8"],
                layout: "disabled",
                gates: "",
                devices: (0..8).map(|g| format!("gpu-{g}")).collect(),
            },
            Run {
                label: "8x H100 80GB, all-1g.10gb (56 MIG devices)",
                profiles: &["h100-80gb:8"],
                layout: "all-1g.10gb",
                gates: "",
                devices: mig_devices(8),
            },
            Run {
                label: "8x H100 all-1g.10gb + 8x L4 (64 devices)",
                profiles: &["h100-80gb:8", "l4:8"],
                layout: "all-1g.10gb",
                gates: "",
                devices: mixed,
            },
            // Dynamic MIG: every prepare creates the instance, every unprepare destroys it.
            Run {
                label: "8x H100 80GB, DynamicMIG, 1g.10gb created on demand",
                profiles: &["h100-80gb:8"],
                layout: "disabled",
                gates: "DynamicMIG=true",
                devices: mig_devices(8),
            },
        ];
        // BENCH_MODE=loop|burst runs one mode (profiling one case).
        let only_mode = std::env::var("BENCH_MODE").ok();
        let modes = [(Mode::Loop, "loop"), (Mode::Burst, "burst")];
        let mut peak_rss = 0.0_f64;
        for (i, run) in cases.iter().enumerate() {
            for (mode, name) in modes {
                if only_mode.as_deref().is_some_and(|m| m != name) {
                    continue;
                }
                let Some(f) = bench(run, mode, rounds).await else {
                    continue;
                };
                peak_rss = peak_rss.max(f.peak_rss_mib);
                // The target case: 64 concurrent claims on 8 H100 (1g.10gb) and 8 L4.
                if i == 2 {
                    perf_row(
                        &format!(
                            "plugin: prepare p99, 64 concurrent claims ({name}), {rounds} rounds"
                        ),
                        "≤ 5 ms",
                        format!("{:.2} ms", f.prepare_p99_ms),
                    );
                    perf_row(
                        &format!("plugin: CPU per prepare/unprepare pair, 64 claims ({name})"),
                        "—",
                        format!("{:.0} µs", f.cpu_per_pair_us),
                    );
                }
            }
        }
        // Only a run of every case and mode speaks for all of them.
        if only_mode.is_none() && std::env::var_os("BENCH_ONLY").is_none() {
            perf_row(
                "plugin: peak RSS over every bench case",
                "≤ 16 MiB",
                format!("{peak_rss:.1} MiB"),
            );
        }
    });
}
