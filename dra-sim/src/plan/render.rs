//! The plan as a person reads it: the pool, the workloads and their claims, where each pod
//! goes (the `simulate` table, reasons included), how full each GPU is and what is left.
use super::Plan;
use super::nodes::Mig;
use crate::workloads::render_pods_table;
use std::fmt::Write;

pub fn render_report(plan: &Plan) -> String {
    let mut s = String::new();
    pool(&mut s, plan);
    workloads(&mut s, plan);
    let _ = writeln!(s, "\nPLACEMENTS");
    s.push_str(&render_pods_table(&plan.pods));
    gpus(&mut s, plan);
    free(&mut s, plan);
    if !plan.notes.is_empty() {
        let _ = writeln!(s, "\nNOTES");
        for n in &plan.notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    let placed = plan.pods.len() - plan.unplaced();
    let _ = writeln!(
        s,
        "\n{placed} of {} pod(s) placed; {} workload(s), {} file(s)",
        plan.pods.len(),
        plan.workloads.len(),
        plan.files.len()
    );
    s
}

/// Rows as columns padded to the widest cell; the last column is not padded.
fn table(s: &mut String, rows: &[Vec<String>]) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|x| x.len())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == r.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[c]);
            }
        }
        let _ = writeln!(s, "{}", line.trim_end());
    }
}

fn row(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

fn pool(s: &mut String, plan: &Plan) {
    let _ = writeln!(s, "POOL");
    let mut rows = vec![row(&[
        "NODE",
        "PRODUCT",
        "GPUS",
        "MIG",
        "SHARING",
        "PLUGIN SETTINGS",
    ])];
    for n in &plan.nodes {
        let mig = match &n.mig {
            Mig::Off => "-".to_string(),
            Mig::Static(l) => format!("{} {l}", n.mig_strategy),
            Mig::Dynamic => "dynamic".into(),
        };
        let sharing = n
            .sharing
            .map_or("-".to_string(), |(st, r)| format!("{} x{r}", st.as_str()));
        let settings = plan.settings.get(&n.name).map_or("-", String::as_str);
        rows.push(vec![
            n.name.clone(),
            n.product.clone().unwrap_or_else(|| "-".into()),
            n.gpus.to_string(),
            mig,
            sharing,
            settings.to_string(),
        ]);
    }
    table(s, &rows);
    for n in &plan.nodes {
        for note in &n.notes {
            let _ = writeln!(s, "  note: {}: {note}", n.name);
        }
    }
}

fn workloads(s: &mut String, plan: &Plan) {
    let _ = writeln!(s, "\nWORKLOADS");
    let mut rows = vec![row(&[
        "WORKLOAD", "ASKS", "CLAIM", "REQUESTS", "PLACED", "FILE",
    ])];
    for w in &plan.workloads {
        rows.push(vec![
            w.workload.clone(),
            w.asks.join("; "),
            w.claim.clone(),
            w.requests.join("; "),
            format!("{}/{}", w.placed, w.pods),
            w.file.clone(),
        ]);
    }
    table(s, &rows);
    for w in &plan.workloads {
        for note in &w.notes {
            let _ = writeln!(s, "  note: {}: {note}", w.workload);
        }
    }
}

fn gpus(s: &mut String, plan: &Plan) {
    let _ = writeln!(s, "\nGPUS");
    let mut rows = vec![row(&["NODE", "GPU", "MODE", "FULL", "USED", "PODS"])];
    for g in &plan.gpus {
        rows.push(vec![
            g.node.clone(),
            g.gpu.clone(),
            g.mode.clone(),
            format!("{}%", g.percent),
            g.used.clone(),
            g.pods.join(", "),
        ]);
    }
    table(s, &rows);
}

fn free(s: &mut String, plan: &Plan) {
    let f = &plan.free;
    let _ = writeln!(s, "\nLEFT FREE");
    let whole: u32 = f.whole_gpus.values().sum();
    let per_node = f
        .whole_gpus
        .iter()
        .map(|(n, c)| format!("{n}: {c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(
        s,
        "whole GPUs: {whole}{}",
        if per_node.is_empty() {
            String::new()
        } else {
            format!(" ({per_node})")
        }
    );
    let mig: Vec<String> = f
        .mig_devices
        .iter()
        .filter(|(_, m)| !m.is_empty())
        .map(|(n, m)| {
            let list: Vec<String> = m.iter().map(|(p, c)| format!("{p} x{c}")).collect();
            format!("{n}: {}", list.join(", "))
        })
        .collect();
    let _ = writeln!(
        s,
        "MIG devices: {}",
        if mig.is_empty() {
            "none".into()
        } else {
            mig.join("; ")
        }
    );
    let shares: Vec<String> = f.shares.iter().map(|(g, x)| format!("{g}: {x}")).collect();
    let _ = writeln!(
        s,
        "shares of partly used GPUs: {}",
        if shares.is_empty() {
            "none".into()
        } else {
            shares.join("; ")
        }
    );
}
