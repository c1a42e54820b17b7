//! CEL speed per expression family of the differential grammar, ours beside cel-go in one run
//! (`cargo test --release --test differential -- --ignored cel_families_side_by_side
//! --nocapture`, which `make bench-sim` runs). Each family's expressions are drawn from the same
//! generators as the differential test, each over its own random device; those our checker
//! refuses are left out (cel-go refuses the same ones, and a refused expression is not
//! evaluated). Both sides evaluate the same list for about two seconds, converting or checking the
//! device on every evaluation as the allocators do; the oracle's `bench-cel` mode times cel-go.
//! Prints one `perf|` row per family for tools/perf-table.py; no timing is asserted.
use super::{J, Rng, cel_grammar as g, cel_library as l, eval_device, oracle};
use dra_sim::cel;
use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Expressions per family.
const PER_FAMILY: usize = 400;

type Gen = fn(&mut Rng) -> String;

/// The families: the grammar's kinds of atom, the library groups of the first differential
/// test, its allocation selectors, and the whole grammar mixed.
const FAMILIES: &[(&str, Gen)] = &[
    ("relations", |r| g::relation(r, 2)),
    ("operator matrix", g::operator_matrix),
    ("leading minus", g::leading_minus),
    ("`in` over lists and maps", |r| {
        let fam = if r.coin(50) { g::LISTS } else { g::MAPS };
        format!("{} in {}", g::term(r, 2), g::operand(r, fam))
    }),
    ("macros", l::macro_pred),
    ("optionals", l::optional_pred),
    ("planned constants", l::planned_pred),
    ("type()", |r| {
        format!("type({}) == {}", g::term(r, 2), g::type_name(r))
    }),
    ("logical mix", g::logical_mix),
    ("library calls", |r| {
        format!("dyn({}) == dyn({})", l::call(r, 2), l::call(r, 2))
    }),
    ("ip / cidr / url", super::net_atom),
    ("format", super::format_atom),
    ("format.named", super::named_format_atom),
    ("authz declarations", super::authz_atom),
    ("allocation selectors", |r| super::selector(r, 3)),
    ("whole grammar", |r| g::pred(r, 3)),
];

/// One expression compiled by us, with its device as the oracle and as we read it.
struct Case {
    prog: cel::Program,
    attrs: BTreeMap<String, DeviceAttribute>,
    caps: BTreeMap<String, DeviceCapacity>,
    multi: bool,
    eval: J,
}

fn cases(r: &mut Rng, gen_expr: Gen) -> Vec<Case> {
    let mut out = Vec::new();
    while out.len() < PER_FAMILY {
        let expr = gen_expr(r);
        let dev = eval_device(r);
        let Ok(prog) = cel::compile(&expr) else {
            continue;
        };
        out.push(Case {
            prog,
            attrs: serde_json::from_value(dev["Attributes"].clone()).expect("attributes"),
            caps: serde_json::from_value(dev["Capacity"].clone()).expect("capacity"),
            multi: dev["AllowMultipleAllocations"].as_bool().unwrap_or(false),
            eval: json!({"expression": expr, "device": dev}),
        });
    }
    out
}

/// Our evaluations per second over `cases`, each device checked as the allocator checks it.
fn ours(cases: &[Case]) -> f64 {
    let raws: Vec<_> = cases
        .iter()
        .map(|c| cel::RawDevice {
            driver: super::DRV,
            attributes: Some(&c.attrs),
            capacity: Some(&c.caps),
            allow_multiple_allocations: c.multi,
        })
        .collect();
    let mut n = 0u64;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        for (c, raw) in cases.iter().zip(&raws) {
            let r = cel::device_check(raw).and_then(|()| c.prog.eval_raw(*raw));
            let _ = std::hint::black_box(r);
            n += 1;
        }
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn go(bin: &std::path::Path, cases: &[Case]) -> f64 {
    use std::io::Write;
    let evals: Vec<&J> = cases.iter().map(|c| &c.eval).collect();
    let mut child = std::process::Command::new(bin)
        .arg("bench-cel")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("oracle");
    {
        let mut stdin = child.stdin.take().expect("stdin");
        let input = json!([{ "evals": evals }]).to_string();
        stdin.write_all(input.as_bytes()).expect("write evals");
    }
    let out = child.wait_with_output().expect("oracle output");
    assert!(out.status.success(), "oracle bench-cel failed");
    let r: J = serde_json::from_slice(&out.stdout).expect("oracle JSON");
    r["per_sec"].as_f64().expect("per_sec")
}

#[test]
#[ignore = "a benchmark: run with --release --ignored (make bench-sim)"]
fn cel_families_side_by_side() {
    let Some(bin) = oracle() else { return };
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    for (name, gen_expr) in FAMILIES {
        let cases = cases(&mut r, *gen_expr);
        let (rust, go) = (ours(&cases), go(&bin, &cases));
        let ratio = rust / go;
        let verdict = if ratio >= 10.0 {
            String::new()
        } else {
            format!(": MISSED, {:.1}× short", 10.0 / ratio)
        };
        println!(
            "perf|sim: CEL evaluations per second, {name} ({} expressions of the differential grammar), ours vs cel-go|≥ 10×|{rust:.0} vs {go:.0} ({ratio:.1}×{verdict})",
            cases.len()
        );
    }
}
