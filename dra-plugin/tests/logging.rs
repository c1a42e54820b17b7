//! The logging contract of the real binary with its output on pipes, as in a pod: no escape
//! codes, `-v` and `--logging-format` as Kubernetes components take them, and refused kubelet
//! calls logged at the default level.
use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use dra_plugin::grpc::client::unix_channel;
use kubelet_proto::registration::{RegistrationStatus, registration_client::RegistrationClient};
use serde_json::Value;

/// The binary with none of the logging variables of the test's own environment.
fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dra-plugin"));
    for var in ["RUST_LOG", "LOG_VERBOSITY", "LOGGING_FORMAT", "NO_COLOR"] {
        c.env_remove(var);
    }
    c
}

fn slices(extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = bin();
    c.args([
        "slices",
        "--backend",
        "simulated",
        "--profile",
        "h100-80gb:1",
    ])
    .args(["--node-name", "n1"])
    .args(extra)
    .envs(env.iter().copied());
    let o = c.output().expect("run dra-plugin");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

fn no_escapes(o: &Output) {
    for (name, bytes) in [("stdout", &o.stdout), ("stderr", &o.stderr)] {
        assert!(
            !bytes.contains(&0x1b),
            "{name} has escape codes: {:?}",
            String::from_utf8_lossy(bytes)
        );
    }
}

/// Every line of `text` as JSON, each with a level and a message.
fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            assert!(v["level"].is_string() && v["message"].is_string(), "{l}");
            v
        })
        .collect()
}

#[test]
fn on_a_pipe_there_are_no_escape_codes_and_the_verbosity_decides_debug_lines() {
    let quiet = slices(&[], &[]);
    no_escapes(&quiet);
    let err = String::from_utf8_lossy(&quiet.stderr);
    assert!(!err.contains("DEBUG"), "{err}");

    for o in [
        slices(&["-v", "4"], &[]),
        slices(&["--v=4"], &[]),
        slices(&[], &[("LOG_VERBOSITY", "4")]),
    ] {
        no_escapes(&o);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("DEBUG") && err.contains("discovered devices"),
            "{err}"
        );
    }
    // RUST_LOG still replaces the mapping.
    let filtered = slices(&["-v", "4"], &[("RUST_LOG", "warn")]);
    assert!(!String::from_utf8_lossy(&filtered.stderr).contains("DEBUG"));
}

#[test]
fn json_format_is_one_object_per_line() {
    for o in [
        slices(&["--logging-format", "json", "-v", "4"], &[]),
        slices(&["-v", "4"], &[("LOGGING_FORMAT", "json")]),
    ] {
        no_escapes(&o);
        let lines = json_lines(&String::from_utf8_lossy(&o.stderr));
        let discovered = lines
            .iter()
            .find(|l| l["message"] == "discovered devices")
            .expect("the discovery debug line");
        assert_eq!(discovered["level"], "DEBUG");
        assert_eq!(discovered["node"], "n1");
        assert_eq!(discovered["target"], "dra_plugin::run");
        assert!(discovered["timestamp"].is_string());
    }
}

#[test]
fn a_bad_logging_variable_is_refused_before_anything_runs() {
    let o = bin()
        .args([
            "slices",
            "--backend",
            "simulated",
            "--profile",
            "h100-80gb:1",
        ])
        .args(["--node-name", "n1"])
        .env("LOGGING_FORMAT", "yaml")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("LOGGING_FORMAT"));
}

fn wait_for(path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(start.elapsed() < Duration::from_secs(30), "{path:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `run`, offline, in JSON: a refused registration and a call for a service the socket does not
/// serve are logged at WARN with socket, method and reason; the connections our own client
/// opens and drops are not. Multi-threaded: the clients' connection tasks must keep running
/// (and answer the plugin's shutdown) while this thread waits for the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_logs_refused_kubelet_calls_as_json_at_the_default_level() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("claims")).unwrap();
    std::fs::write(d.join("boot_id"), "boot-a\n").unwrap();
    let p = |s: &str| d.join(s).to_string_lossy().into_owned();
    let mut child = bin()
        .args(["--logging-format", "json", "run", "--node-name", "n1"])
        .args(["--backend", "simulated", "--profile", "h100-80gb:1"])
        .args([
            "--registrar-dir",
            &p("registry"),
            "--plugin-dir",
            &p("plugin"),
        ])
        .args([
            "--cdi-root",
            &p("cdi"),
            "--offline-claims-dir",
            &p("claims"),
        ])
        .args(["--boot-id-file", &p("boot_id")])
        .args(["--metrics-port", "0", "--healthcheck-port", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        stderr.read_to_string(&mut s).unwrap();
        s
    });
    let reg = d.join("registry/gpu.nvidia.com-reg.sock");
    wait_for(&reg);

    let info = dra_plugin::grpc::client::get_info(&reg).await.unwrap();
    assert_eq!(info.name, "gpu.nvidia.com");
    let mut rc = RegistrationClient::new(unix_channel(&reg).await.unwrap());
    let refused = rc
        .notify_registration_status(RegistrationStatus {
            plugin_registered: false,
            error: "deliberately refused".into(),
        })
        .await;
    assert!(refused.is_err());
    drop(rc);
    let dra = unix_channel(&d.join("plugin/dra.sock")).await.unwrap();
    let wrong = RegistrationClient::new(dra)
        .get_info(kubelet_proto::registration::InfoRequest {})
        .await;
    assert_eq!(wrong.unwrap_err().code(), tonic::Code::Unimplemented);

    let pid = libc::pid_t::try_from(child.id()).expect("a pid fits pid_t");
    // SAFETY: signalling the child this test started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let mut out = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    let err = reader.join().unwrap();
    assert!(status.success(), "{err}");
    assert!(!err.contains('\x1b') && !out.contains(&0x1b), "{err}");
    let lines = json_lines(&err);
    assert!(lines.iter().all(|l| l["level"] != "DEBUG"), "{err}");

    let refusal = lines
        .iter()
        .find(|l| l["message"] == "the kubelet refused the registration")
        .unwrap_or_else(|| panic!("no refusal line in\n{err}"));
    assert_eq!(refusal["level"], "WARN");
    assert_eq!(refusal["socket"], "registration");
    assert_eq!(
        refusal["method"],
        "/pluginregistration.Registration/NotifyRegistrationStatus"
    );
    assert_eq!(refusal["error"], "deliberately refused");

    let failed: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message"] == "call on a kubelet socket failed")
        .collect();
    let by = |socket: &str| {
        failed
            .iter()
            .find(|l| l["socket"] == socket)
            .unwrap_or_else(|| panic!("no failed call on {socket} in\n{err}"))
    };
    assert_eq!(by("registration")["reason"], "internal");
    assert_eq!(by("dra")["reason"], "unimplemented");
    assert_eq!(
        by("dra")["method"],
        "/pluginregistration.Registration/GetInfo"
    );
    // Nothing else warns: clients that connect, call and leave are the normal case.
    let warnings = lines.iter().filter(|l| l["level"] == "WARN").count();
    assert_eq!(warnings, 3, "{err}");
}
