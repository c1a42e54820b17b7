//! The logging contract of the real binary with its output on pipes: no escape codes, `-v` and
//! `--logging-format` as Kubernetes components take them, and a failed start as a JSON line too.
use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

/// The binary with none of the logging variables of the test's own environment.
fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dra-controller"));
    // the embedded default resolves examples/ relative to the repository root
    c.current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."));
    for var in ["RUST_LOG", "LOG_VERBOSITY", "LOGGING_FORMAT", "NO_COLOR"] {
        c.env_remove(var);
    }
    c
}

fn simulate(extra: &[&str], env: &[(&str, &str)]) -> Output {
    let o = bin()
        .args(["simulate", "examples/claims/inference-gpu.yaml"])
        .args(extra)
        .envs(env.iter().copied())
        .output()
        .expect("run dra-controller");
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
    let quiet = simulate(&[], &[]);
    no_escapes(&quiet);
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("DEBUG"));
    for o in [
        simulate(&["-v", "4"], &[]),
        simulate(&[], &[("LOG_VERBOSITY", "4")]),
    ] {
        no_escapes(&o);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("DEBUG") && err.contains("scenario loaded"),
            "{err}"
        );
    }
}

#[test]
fn json_format_is_one_object_per_line() {
    let o = simulate(&["--logging-format", "json", "--v=4"], &[]);
    no_escapes(&o);
    let lines = json_lines(&String::from_utf8_lossy(&o.stderr));
    let loaded = lines
        .iter()
        .find(|l| l["message"] == "scenario loaded")
        .expect("the scenario debug line");
    assert_eq!(loaded["level"], "DEBUG");
    assert_eq!(loaded["target"], "dra_sim::cli");
}

#[test]
fn a_failed_start_is_a_json_line_too() {
    let o = bin()
        .args(["run", "--logging-format", "json"])
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert!(!o.status.success());
    no_escapes(&o);
    let lines = json_lines(&String::from_utf8_lossy(&o.stderr));
    let last = lines.last().expect("an error line");
    assert_eq!(last["level"], "ERROR");
    assert!(
        last["error"]
            .as_str()
            .unwrap()
            .contains("building a Kubernetes client"),
        "{last}"
    );
}
