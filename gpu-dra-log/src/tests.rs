use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};

use clap::{Parser, Subcommand};

use super::*;

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    log: LogArgs,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    Run,
}

fn parse(args: &[&str]) -> LogArgs {
    Cli::try_parse_from(std::iter::once("bin").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
        .log
}

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| vars.get(k).cloned()
}

#[test]
fn verbosity_takes_the_kubernetes_spellings_before_or_after_the_subcommand() {
    for args in [
        &["-v", "4", "run"][..],
        &["-v4", "run"],
        &["-v=4", "run"],
        &["--v", "4", "run"],
        &["--v=4", "run"],
        &["run", "-v", "4"],
        &["run", "--v=4"],
    ] {
        assert_eq!(parse(args).verbosity, Some(4), "{args:?}");
    }
    assert_eq!(parse(&["run"]).verbosity, None);
    let json = parse(&["run", "--logging-format", "json"]);
    assert_eq!(json.logging_format, Some(Format::Json));
    assert!(Cli::try_parse_from(["bin", "run", "--logging-format", "yaml"]).is_err());
    assert!(Cli::try_parse_from(["bin", "run", "-v", "-1"]).is_err());
}

#[test]
fn verbosity_maps_like_klog_with_dependencies_one_step_quieter() {
    let own_and_deps = |v| {
        let d = directives(v);
        let deps = d.split(',').next().unwrap().to_string();
        let own = d
            .split(',')
            .find_map(|x| x.strip_prefix("dra_plugin="))
            .unwrap()
            .to_string();
        assert!(d.contains(&format!("dra_controller={own}")), "{d}");
        assert!(d.contains(&format!("dra_sim={own}")), "{d}");
        assert!(d.contains(&format!("gpu_dra_api={own}")), "{d}");
        (own, deps)
    };
    for (v, own, deps) in [
        (0, "info", "warn"),
        (1, "info", "warn"),
        (2, "debug", "info"),
        (4, "debug", "info"),
        (5, "trace", "debug"),
        (10, "trace", "debug"),
    ] {
        assert_eq!(own_and_deps(v), (own.into(), deps.into()), "-v {v}");
    }
}

#[test]
fn flags_win_over_the_environment_and_empty_variables_count_as_unset() {
    let resolve = |args: &[&str], vars: &[(&str, &str)]| {
        Config::resolve(&parse(args), env(vars), false).unwrap()
    };
    let d = resolve(&["run"], &[]);
    assert_eq!((d.verbosity, d.format, d.filter), (0, Format::Text, None));

    let e = resolve(
        &["run"],
        &[("LOG_VERBOSITY", "4"), ("LOGGING_FORMAT", "JSON")],
    );
    assert_eq!((e.verbosity, e.format), (4, Format::Json));

    let f = resolve(
        &["run", "-v", "2", "--logging-format", "text"],
        &[("LOG_VERBOSITY", "6"), ("LOGGING_FORMAT", "json")],
    );
    assert_eq!((f.verbosity, f.format), (2, Format::Text));

    let empty = resolve(
        &["run"],
        &[
            ("LOG_VERBOSITY", ""),
            ("LOGGING_FORMAT", " "),
            ("RUST_LOG", ""),
        ],
    );
    assert_eq!(
        (empty.verbosity, empty.format, empty.filter),
        (0, Format::Text, None)
    );

    let r = resolve(&["run", "-v", "5"], &[("RUST_LOG", "warn,h2=trace")]);
    assert_eq!(r.filter.as_deref(), Some("warn,h2=trace"));
}

#[test]
fn bad_environment_values_are_errors_naming_the_variable() {
    let bad = |vars: &[(&str, &str)]| {
        Config::resolve(&parse(&["run"]), env(vars), false)
            .and_then(|c| c.env_filter().map(|_| ()))
            .unwrap_err()
            .to_string()
    };
    assert!(bad(&[("LOG_VERBOSITY", "debug")]).contains("LOG_VERBOSITY"));
    assert!(bad(&[("LOGGING_FORMAT", "yaml")]).contains("LOGGING_FORMAT"));
    assert!(bad(&[("RUST_LOG", "dra_plugin=loud")]).contains("RUST_LOG"));
}

#[test]
fn colour_only_on_a_terminal_without_no_color_and_never_in_json() {
    let colour = |args: &[&str], vars: &[(&str, &str)], tty| {
        Config::resolve(&parse(args), env(vars), tty)
            .unwrap()
            .colour
    };
    assert!(colour(&["run"], &[], true));
    assert!(!colour(&["run"], &[], false));
    assert!(!colour(&["run"], &[("NO_COLOR", "1")], true));
    assert!(colour(&["run"], &[("NO_COLOR", "")], true));
    assert!(!colour(&["run", "--logging-format", "json"], &[], true));
}

/// Everything the subscriber for `config` writes while `f` runs.
fn capture(config: &Config, f: impl FnOnce()) -> String {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let sink = buf.clone();
    let make = move || Sink(sink.clone());
    let sub = subscriber(config, make).unwrap();
    tracing::subscriber::with_default(sub, f);
    String::from_utf8(buf.lock().unwrap().clone()).unwrap()
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn config(verbosity: u32, format: Format, colour: bool) -> Config {
    Config {
        verbosity,
        format,
        filter: None,
        colour,
    }
}

fn emit() {
    let span = tracing::info_span!(target: "dra_plugin::grpc", "prepare", claim = "ns/c", claimUID = "u-1");
    let _in = span.enter();
    tracing::info!(target: "dra_plugin::grpc", device = "gpu-0", "prepared");
    tracing::debug!(target: "dra_plugin::grpc", "own debug");
    tracing::trace!(target: "dra_plugin::grpc", "own trace");
    tracing::warn!(target: "h2::proto", "dependency warn");
    tracing::info!(target: "h2::proto", "dependency info");
    tracing::debug!(target: "h2::proto", "dependency debug");
}

#[test]
fn levels_follow_the_verbosity() {
    let v0 = capture(&config(0, Format::Text, false), emit);
    assert!(
        v0.contains("prepared") && v0.contains("dependency warn"),
        "{v0}"
    );
    assert!(
        !v0.contains("own debug") && !v0.contains("dependency info"),
        "{v0}"
    );
    let v4 = capture(&config(4, Format::Text, false), emit);
    assert!(
        v4.contains("own debug") && v4.contains("dependency info"),
        "{v4}"
    );
    assert!(
        !v4.contains("own trace") && !v4.contains("dependency debug"),
        "{v4}"
    );
    let v5 = capture(&config(5, Format::Text, false), emit);
    assert!(
        v5.contains("own trace") && v5.contains("dependency debug"),
        "{v5}"
    );
    let mut filtered = config(5, Format::Text, false);
    filtered.filter = Some("h2=debug".into());
    let f = capture(&filtered, emit);
    assert!(
        f.contains("dependency debug") && !f.contains("prepared"),
        "{f}"
    );
}

#[test]
fn text_without_colour_has_no_escape_codes() {
    let plain = capture(&config(5, Format::Text, false), emit);
    assert!(!plain.contains('\x1b'), "{plain:?}");
    assert!(
        plain.contains("claimUID=\"u-1\"") || plain.contains("claimUID=u-1"),
        "{plain}"
    );
    let coloured = capture(&config(0, Format::Text, true), emit);
    assert!(coloured.contains('\x1b'), "{coloured:?}");
}

#[test]
fn json_is_one_object_per_line_with_level_message_target_and_fields() {
    let out = capture(&config(4, Format::Json, false), emit);
    assert!(!out.contains('\x1b'));
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), 4, "{out}");
    for l in &lines {
        for key in ["timestamp", "level", "message", "target"] {
            assert!(l[key].is_string(), "{key} missing: {l}");
        }
    }
    let prepared = &lines[0];
    assert_eq!(prepared["level"], "INFO");
    assert_eq!(prepared["message"], "prepared");
    assert_eq!(prepared["target"], "dra_plugin::grpc");
    assert_eq!(prepared["device"], "gpu-0");
    assert_eq!(prepared["span"]["claim"], "ns/c");
    assert_eq!(prepared["span"]["claimUID"], "u-1");
    assert_eq!(prepared["spans"][0]["name"], "prepare");
}
