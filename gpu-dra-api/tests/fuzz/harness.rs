//! A fuzzing harness that runs on stable Rust inside `cargo test`: seeded random inputs (so a
//! failure reproduces from the seed it prints), each checked on a worker thread under
//! `catch_unwind`, with a generous per-input watchdog that turns a hang into a failure naming
//! the input. Shared by the fuzz tests of `gpu-dra-api` (opaque config) and `dra-sim` (CEL,
//! YAML input), which include this file by path.
//!
//! - `SIM_FUZZ_CASES=<n>` multiplies the number of inputs (default 1: a few seconds per test);
//!   `SIM_FUZZ_CASES=100` is a longer run.
//! - `SIM_FUZZ_SEED=<n>` changes the seed (default fixed, so CI is deterministic).
//! - `SIM_FUZZ_VERBOSE=1` prints each input before checking it: what a crash that cannot be
//!   caught (a stack overflow aborts the process) was working on.
//! - `SIM_FUZZ_HANG_SECS=<n>` changes the watchdog (default 120 s per input, far beyond what
//!   any input needs even in a debug build; it exists to catch loops, not to time anything).
#![allow(
    dead_code,
    reason = "each test binary uses its own part of the harness"
)]
use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, mpsc};
use std::time::Duration;

/// A xorshift generator: dependency-free and reproducible from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// A number below `n` (which must not be 0).
    pub fn n(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).expect("below n, a usize")
    }
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.n(v.len())]
    }
    pub fn coin(&mut self, pct: usize) -> bool {
        self.n(100) < pct
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// `default` inputs, times `SIM_FUZZ_CASES`.
pub fn cases(default: usize) -> usize {
    let scale = env_u64("SIM_FUZZ_CASES").unwrap_or(1);
    default.saturating_mul(usize::try_from(scale).unwrap_or(usize::MAX))
}

/// The generator for a test: `SIM_FUZZ_SEED`, mixed with the test's own salt.
pub fn rng(salt: u64) -> Rng {
    let seed = env_u64("SIM_FUZZ_SEED").unwrap_or(0x9e37_79b9_7f4a_7c15);
    eprintln!("fuzz seed {seed} (SIM_FUZZ_SEED), salt {salt}");
    // xorshift never leaves 0
    Rng((seed ^ salt.rotate_left(17)).max(1))
}

fn hang_limit() -> Duration {
    Duration::from_secs(env_u64("SIM_FUZZ_HANG_SECS").unwrap_or(120))
}

/// Stack of the worker: the main thread's size, so that what overflows here would overflow
/// in the simulator's own threads too.
const STACK: usize = 8 << 20;

/// Runs `check` on every input on a worker thread. Fails naming every input that panicked, or
/// the first one that did not finish within the watchdog's limit.
pub fn run<T, F>(name: &str, inputs: Vec<T>, check: F)
where
    T: Debug + Send + Sync + 'static,
    F: Fn(&T) + Send + 'static,
{
    let inputs = Arc::new(inputs);
    let (tx, rx) = mpsc::channel::<Option<String>>();
    let work = Arc::clone(&inputs);
    let verbose = std::env::var_os("SIM_FUZZ_VERBOSE").is_some();
    std::thread::Builder::new()
        .name(format!("fuzz-{name}"))
        .stack_size(STACK)
        .spawn(move || {
            for input in work.iter() {
                if verbose {
                    eprintln!("{input:?}");
                }
                let outcome = catch_unwind(AssertUnwindSafe(|| check(input)));
                if tx.send(outcome.err().map(|p| panic_text(&*p))).is_err() {
                    return;
                }
            }
        })
        .expect("spawn the fuzz worker");
    let mut panics = Vec::new();
    for input in inputs.iter() {
        match rx.recv_timeout(hang_limit()) {
            Ok(None) => {}
            Ok(Some(msg)) => panics.push(format!("{input:?}\n  panicked: {msg}")),
            Err(_) => panic!("{name}: no answer within {:?} for {input:?}", hang_limit()),
        }
    }
    eprintln!("{name}: {} inputs, {} panics", inputs.len(), panics.len());
    assert!(panics.is_empty(), "{name}:\n{}", panics.join("\n"));
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_string()))
        .unwrap_or_else(|| "(not a string)".into())
}

/// Byte-level and structural mutations of text, at char boundaries: insertions of `tokens`,
/// deletions, duplications, replacements by odd characters, splices with `other`.
pub fn mutate(r: &mut Rng, s: &str, tokens: &[&str], other: &str) -> String {
    let mut s = s.to_string();
    for _ in 0..1 + r.n(4) {
        let at = boundary(r, &s);
        match r.n(6) {
            0 | 1 => {
                let token = *r.pick(tokens);
                s.insert_str(at, token);
            }
            2 => {
                let end = boundary(r, &s).max(at);
                s.replace_range(at..end, "");
            }
            3 => {
                let end = boundary(r, &s).max(at);
                let dup = s[at..end].to_string();
                s.insert_str(end, &dup);
            }
            4 => {
                let end = s[at..].chars().next().map_or(at, |c| at + c.len_utf8());
                let odd = *r.pick(ODD_CHARS);
                s.replace_range(at..end, odd);
            }
            _ => {
                let cut = boundary(r, other);
                s.truncate(at);
                s.push_str(&other[cut..]);
            }
        }
    }
    s
}

/// Characters parsers trip over: quotes, escapes, controls, NUL, multi-byte and bidi.
pub const ODD_CHARS: &[&str] = &[
    "\0", "\\", "'", "\"", "`", "\n", "\r", "\t", " ", "\u{7f}", "é", "😀", "\u{202e}", "\u{feff}",
    "{", "}", "[", "]", "(", ")", ":", ",", "#", "&", "*", "!", "|", ">", "-", "?", "%", "@", "0",
];

/// A random char boundary of `s`.
fn boundary(r: &mut Rng, s: &str) -> usize {
    let mut at = r.n(s.len() + 1);
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}
