//! Feature gates at startup: NVIDIA's gate set, defaults and rules
//! ([`gpu_dra_api::gates`]), read from `--feature-gates` or `FEATURE_GATES`, plus a warning for
//! every gate that is asked for but does nothing in this implementation.
use gpu_dra_api::gates::{Component, FeatureGates};
use tracing::warn;

/// Parses the gates (a broken rule is an error naming both gates) and warns about each gate that
/// has no effect here for `component`.
pub fn load(spec: &str, component: Component) -> Result<FeatureGates, gpu_dra_api::Error> {
    let gates = FeatureGates::parse(spec)?;
    for n in gates.without_effect(component) {
        warn!(gate = n.gate, value = n.value, "{n}");
    }
    Ok(gates)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn gates_flag(args: &[&str]) -> String {
        let base = ["dra-plugin", "run", "--node-name", "n1"];
        match Cli::try_parse_from(base.iter().chain(args))
            .unwrap()
            .command
        {
            Command::Run(a) => a.device.feature_gates,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn the_flag_takes_nvidias_form() {
        let spec = gates_flag(&[
            "--feature-gates",
            "TimeSlicingSettings=true,MPSSupport=false,ContextualLogging=true",
        ]);
        let g = load(&spec, Component::GpuPlugin).unwrap();
        assert!(g.enabled("TimeSlicingSettings"));
        assert!(!g.enabled("MPSSupport"));
        assert!(g.enabled("ContextualLogging"));
        let spec = gates_flag(&["--feature-gates=DynamicMIG=true,MPSSupport=true"]);
        let e = load(&spec, Component::GpuPlugin).unwrap_err().to_string();
        assert!(e.contains("DynamicMIG") && e.contains("MPSSupport"), "{e}");
        let spec = gates_flag(&["--feature-gates", "LoggingBetaOptions=false,Bogus=true"]);
        let e = load(&spec, Component::GpuPlugin).unwrap_err().to_string();
        assert!(e.contains("unrecognized feature gate: Bogus"), "{e}");
    }

    /// `FEATURE_GATES` (what NVIDIA's chart sets) is read when the flag is absent. Checked in a
    /// child process started with the variable, so no test thread changes the environment.
    #[test]
    fn the_environment_variable_takes_nvidias_form() {
        const CHILD: &str = "DRA_PLUGIN_GATES_ENV_TEST_CHILD";
        if std::env::var_os(CHILD).is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "gates::tests::the_environment_variable_takes_nvidias_form",
                    "--nocapture",
                ])
                .env(CHILD, "1")
                .env(
                    "FEATURE_GATES",
                    "ContextualLogging=false,LoggingAlphaOptions=true,NVMLDeviceHealthCheck=T",
                )
                .output()
                .unwrap();
            assert!(
                out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
                "{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            return;
        }
        let g = load(&gates_flag(&[]), Component::GpuPlugin).unwrap();
        assert!(!g.enabled("ContextualLogging"));
        assert!(g.enabled("LoggingAlphaOptions"));
        assert!(g.enabled("NVMLDeviceHealthCheck"));
        // The flag, when given, is used instead.
        let g = load(
            &gates_flag(&["--feature-gates", "DynamicMIG=true"]),
            Component::GpuPlugin,
        )
        .unwrap();
        assert!(g.dynamic_mig() && !g.enabled("NVMLDeviceHealthCheck"));
    }

    #[test]
    fn defaults_without_flag_or_variable_are_nvidias() {
        if std::env::var_os("FEATURE_GATES").is_some() {
            return;
        }
        let g = load(&gates_flag(&[]), Component::ComputeDomainPlugin).unwrap();
        assert_eq!(g, FeatureGates::default());
    }
}
