//! The CEL-only half of the differential test: expressions from `cel_grammar.rs` over random
//! devices, answered by our CEL environment and by cel-go through the oracle; the outcome (true,
//! false, runtime error, compile error) must be the same. 10,000 cases by default;
//! `SIM_DIFF_CASES=200000` runs a longer, differently seeded set. `SIM_DIFF_CEL_DUMP=<file>`
//! writes every case with cel-go's answer (one a line: outcome, message, expression),
//! `SIM_DIFF_MISMATCHES=<file>` every disagreement, and `SIM_DIFF_CEL_EXPRS=<file>` replaces the
//! grammar by the expressions in the file (one a line), printing both answers to each.
use super::{J, Rng, cel_grammar, eval_device, oracle, run_oracle, rust_eval};
use serde_json::json;
use std::collections::BTreeMap;

/// CEL-only cases per run; `SIM_DIFF_CASES` asks for more (or fewer).
fn cel_cases() -> usize {
    std::env::var("SIM_DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// What a run found: outcomes by kind (cel-go's), and the disagreements.
#[derive(Default)]
struct Tally {
    outcomes: BTreeMap<String, usize>,
    mismatches: Vec<String>,
    dump: Vec<String>,
}

impl Tally {
    /// Compares one case's answers; `w` is cel-go's.
    fn add(&mut self, e: &J, w: &J) {
        let (kind, msg, _) = rust_eval(e);
        let wkind = w["result"].as_str().unwrap_or("");
        let wmsg = w["message"].as_str().unwrap_or("");
        let expr = e["expression"].as_str().unwrap_or("");
        *self.outcomes.entry(wkind.to_string()).or_default() += 1;
        self.dump.push(format!("{wkind}\t{wmsg:?}\t{expr}"));
        if kind == wkind {
            return;
        }
        self.mismatches.push(format!(
            "{expr}\n  device: {}\n  go:   {wkind} {wmsg}\n  rust: {kind} {msg}",
            e["device"]
        ));
    }
}

/// The CEL-only grammar against cel-go: the outcome of every expression; seeded per run size,
/// sent in batches (the oracle reads all of a batch before answering).
#[test]
fn cel_expressions_against_go_oracle() {
    let Some(bin) = oracle() else { return };
    let n = cel_cases();
    let mut r = Rng(0x2545f4914f6cdd1d ^ n as u64);
    let evals = cases(&mut r, n);
    let n = evals.len();
    let mut t = Tally::default();
    for batch in evals.chunks(20_000) {
        let answers = run_oracle(&bin, &json!([{"evals": batch, "cost_runs": 1}]));
        let answers = answers[0]["evals"].as_array().expect("evals");
        for (e, w) in batch.iter().zip(answers) {
            t.add(e, w);
            if std::env::var_os("SIM_DIFF_CEL_EXPRS").is_some() {
                let (kind, msg, cost) = rust_eval(e);
                let same = if w["result"] == kind.as_str() {
                    "ok "
                } else {
                    "BAD"
                };
                eprintln!(
                    "{same} {}\n    go:   {} {} {}\n    rust: {kind} {msg} {cost:?}",
                    e["expression"], w["result"], w["message"], w["cost"]
                );
            }
        }
    }
    eprintln!(
        "CEL differential: {n} expressions, outcomes {:?}, {} mismatches",
        t.outcomes,
        t.mismatches.len()
    );
    write_if_asked("SIM_DIFF_CEL_DUMP", &t.dump);
    write_if_asked("SIM_DIFF_MISMATCHES", &t.mismatches);
    let shown: Vec<&str> = t.mismatches.iter().take(15).map(String::as_str).collect();
    assert!(
        t.mismatches.is_empty(),
        "{} mismatches:\n{}",
        t.mismatches.len(),
        shown.join("\n")
    );
    // every outcome must be well represented, or the grammar has drifted
    for k in ["true", "false", "error", "compile_error"] {
        let got = t.outcomes.get(k).copied().unwrap_or(0);
        assert!(got * 10 >= n, "too few {k}: {:?}", t.outcomes);
    }
}

/// `n` cases from the grammar, or those in `SIM_DIFF_CEL_EXPRS` over one device with every
/// attribute.
fn cases(r: &mut Rng, n: usize) -> Vec<J> {
    let Ok(path) = std::env::var("SIM_DIFF_CEL_EXPRS") else {
        return (0..n)
            .map(|_| json!({"expression": cel_grammar::pred(r, 3), "device": eval_device(r)}))
            .collect();
    };
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    let device = json!({"Driver": "gpu.example.com", "AllowMultipleAllocations": false,
        "Attributes": {"model": {"string": "a100"}, "cores": {"int": 8}, "ecc": {"bool": true},
            "driverVersion": {"version": "1.2.3"}, "pcieRoot": {"string": "p0"},
            "other.example.com/zone": {"string": "z1"}},
        "Capacity": {"memory": {"value": "40Gi"}, "other.example.com/slots": {"value": "4"}}});
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| json!({"expression": l, "device": device}))
        .collect()
}

fn write_if_asked(var: &str, lines: &[String]) {
    if let Ok(path) = std::env::var(var) {
        std::fs::write(&path, lines.join("\n")).unwrap_or_else(|e| panic!("write {path}: {e}"));
    }
}
