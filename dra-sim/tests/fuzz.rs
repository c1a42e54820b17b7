//! Fuzzes the simulator's parsers on stable Rust, briefly by default: the CEL environment
//! (parse, check, plan, evaluate) and the YAML input decoder. Every input must be answered, with
//! a result or an error: no panic, no stack overflow, no hang. The knobs are in
//! `gpu-dra-api/tests/fuzz/harness.rs` (`SIM_FUZZ_CASES=100` for a longer run,
//! `SIM_FUZZ_SEED` for other inputs).
#[path = "../../gpu-dra-api/tests/fuzz/harness.rs"]
mod harness;

#[path = "fuzz/cel.rs"]
mod cel;
#[path = "fuzz/yaml.rs"]
mod yaml;

#[test]
fn cel_survives_random_selectors() {
    let mut r = harness::rng(2);
    let n = harness::cases(3000);
    harness::run("cel", cel::inputs(&mut r, n), |s: &String| cel::check(s));
}

#[test]
fn yaml_input_survives_random_documents() {
    let mut r = harness::rng(3);
    let n = harness::cases(1000);
    harness::run("yaml", yaml::inputs(&mut r, n), |s: &String| yaml::check(s));
}
