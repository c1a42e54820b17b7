//! The table `simulate` prints for workloads: one row per allocated device of each pod, then the
//! pods that stay Pending with the reason per node.
use super::schedule::PodOutcome;
use crate::cli::render_unsatisfiable;
use std::fmt::Write;

pub fn render_pods_table(outcomes: &[PodOutcome]) -> String {
    let mut s = String::new();
    let placed: Vec<&PodOutcome> = outcomes.iter().filter(|o| o.node.is_some()).collect();
    let pod_w = width(placed.iter().map(|o| o.pod.len()), 3);
    let claim_w = width(
        placed
            .iter()
            .flat_map(|o| o.claims.iter().map(|c| c.claim.len() + 9)),
        5,
    );
    let node_w = width(
        placed
            .iter()
            .filter_map(|o| o.node.as_ref().map(String::len)),
        4,
    );
    if !placed.is_empty() {
        let _ = writeln!(
            s,
            "{:<pod_w$} {:<node_w$} {:<claim_w$} {:<22} {:<16} DEVICE",
            "POD", "NODE", "CLAIM", "REQUEST", "DRIVER"
        );
    }
    for o in &placed {
        let node = o.node.as_deref().unwrap_or_default();
        if o.claims.is_empty() {
            let _ = writeln!(s, "{:<pod_w$} {:<node_w$} (no claims)", o.pod, node);
        }
        for c in &o.claims {
            let claim = if c.shared {
                format!("{} (shared)", c.claim)
            } else {
                c.claim.clone()
            };
            let results = c
                .allocation
                .devices
                .iter()
                .flat_map(|d| d.results.iter().flatten());
            for r in results {
                let _ = writeln!(
                    s,
                    "{:<pod_w$} {:<node_w$} {:<claim_w$} {:<22} {:<16} {}",
                    o.pod, node, claim, r.request, r.driver, r.device
                );
            }
        }
    }
    for o in outcomes.iter().filter(|o| o.node.is_none()) {
        let why = o
            .error
            .as_ref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        let _ = writeln!(s, "pod {} ({}): unschedulable{why}", o.pod, o.owner);
        for r in &o.refused {
            let why = r
                .error
                .as_ref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default();
            let _ = writeln!(s, "  node {}{why}", r.node);
            render_unsatisfiable(&mut s, &r.unsatisfiable, "    ");
        }
    }
    s
}

fn width(lens: impl Iterator<Item = usize>, min: usize) -> usize {
    lens.max().unwrap_or(min).max(min)
}
