//! `eval`: one CEL selector against every device, as the allocator evaluates it.
use super::*;

#[derive(Serialize)]
struct EvalRow {
    driver: String,
    pool: String,
    device: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    matches: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

pub async fn eval(args: EvalArgs) -> Result<()> {
    if args.selector.len() > crate::cel::MAX_EXPRESSION_LENGTH {
        return Err(Error::invalid(format!(
            "selector: Too long: may not be more than {} bytes",
            crate::cel::MAX_EXPRESSION_LENGTH
        )));
    }
    let prog = crate::cel::compile(&args.selector).map_err(Error::Invalid)?;
    let mut objs = Objects::default();
    if !args.profile.is_empty() {
        let p: Vec<&str> = args.profile.iter().map(|s| s.as_str()).collect();
        objs.slices =
            gpu_dra_api::slices::simulated_node_slices(SIM_NODE, &p, None, args.dynamic_mig)
                .map_err(|e| {
                    Error::invalid(format!("--profile {}: {e}", args.profile.join(",")))
                })?;
    } else if !args.slices.is_empty() {
        input::load_paths(&args.slices, &mut objs)?;
    } else {
        return Err(Error::invalid(
            "eval needs --slices <files|dirs> or --profile <profile>",
        ));
    }
    let mut rows = Vec::new();
    for s in &objs.slices {
        for d in s.spec.devices.iter().flatten() {
            // as the allocator reads devices: in place, conversion checked first
            let raw = crate::cel::RawDevice::of(&s.spec.driver, d);
            let r = crate::cel::device_check(&raw).and_then(|()| prog.eval_raw(raw));
            let (matches, error) = match r {
                Ok(b) => (Some(b), None),
                Err(e) => (None, Some(crate::cel::enhance_runtime_error(&e))),
            };
            rows.push(EvalRow {
                driver: s.spec.driver.clone(),
                pool: s.spec.pool.name.clone(),
                device: d.name.clone(),
                matches,
                error,
            });
        }
    }
    match args.output {
        Output::Json => emit(&format!("{}\n", serde_json::to_string_pretty(&rows)?)),
        Output::Yaml => emit(&serde_yaml::to_string(&rows)?),
        Output::Table => {
            let mut t = String::new();
            let w = rows
                .iter()
                .map(|r| r.device.len())
                .max()
                .unwrap_or(6)
                .max(6);
            let pw = rows.iter().map(|r| r.pool.len()).max().unwrap_or(4).max(4);
            t.push_str(&format!(
                "{:<16} {:<pw$} {:<w$} RESULT\n",
                "DRIVER", "POOL", "DEVICE"
            ));
            for r in &rows {
                let res = match (&r.matches, &r.error) {
                    (Some(b), _) => b.to_string(),
                    (_, Some(e)) => format!("error: {e}"),
                    _ => String::new(),
                };
                t.push_str(&format!(
                    "{:<16} {:<pw$} {:<w$} {res}\n",
                    r.driver, r.pool, r.device
                ));
            }
            emit(&t);
        }
    }
    Ok(())
}
