//! The table `simulate` prints when the input is claims without workloads.
use super::NodeOutcome;
use crate::alloc::explain::StageCounts;
use std::fmt::Write;

pub fn render_table(outcomes: &[NodeOutcome]) -> String {
    let mut s = String::new();
    let fits: Vec<&NodeOutcome> = outcomes.iter().filter(|o| o.fits).collect();
    if !fits.is_empty() {
        let _ = writeln!(
            s,
            "{:<20} {:<28} {:<22} {:<16} {:<20} DEVICE",
            "NODE", "CLAIM", "REQUEST", "DRIVER", "POOL"
        );
        for o in &fits {
            for c in &o.claims {
                for r in c
                    .allocation
                    .devices
                    .iter()
                    .flat_map(|d| d.results.iter().flatten())
                {
                    let _ = writeln!(
                        s,
                        "{:<20} {:<28} {:<22} {:<16} {:<20} {}",
                        o.node, c.claim, r.request, r.driver, r.pool, r.device
                    );
                }
            }
        }
    }
    for o in outcomes.iter().filter(|o| !o.fits) {
        let _ = writeln!(
            s,
            "node {}: unsatisfiable{}",
            o.node,
            o.error
                .as_ref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        );
        render_unsatisfiable(&mut s, &o.unsatisfiable, "  ");
    }
    s
}

/// Per request, how many devices passed each stage, and the first selector errors.
pub fn render_unsatisfiable(s: &mut String, stages: &[StageCounts], indent: &str) {
    for st in stages {
        if st.request.is_empty() {
            for e in &st.errors {
                let _ = writeln!(s, "{indent}{e}");
            }
            continue;
        }
        let _ = writeln!(
            s,
            "{indent}{} request {} (wants {}): {} devices considered, {} passed class selectors, {} passed request selectors, {} not in use, {} with capacity, {} with counters available, {} tolerated taints, {} satisfy constraints",
            st.claim,
            st.request,
            st.wanted,
            st.considered,
            st.class_selectors,
            st.request_selectors,
            st.not_in_use,
            st.capacity,
            st.counters,
            st.taints,
            st.constraints
        );
        for e in &st.errors {
            let _ = writeln!(s, "{indent}  selector error: {e}");
        }
    }
    if let Some(st) = stages.first() {
        for p in &st.pool_problems {
            let _ = writeln!(s, "{indent}{p}");
        }
    }
}
