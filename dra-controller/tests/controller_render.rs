//! The kubelet-plugin DaemonSet against the real plugin's command line: the rendered command, args and
//! environment are fed through `dra-plugin`'s own clap definition, so a renamed or dropped variable on
//! either side fails here.
use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{CommandFactory, Parser};
use dra_controller::controller::crd::GPUClusterSpec;
use dra_controller::controller::render::{self, Target};
use dra_plugin::cli::{Backend, Cli, Command, RunArgs};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{Value, json};

fn owner() -> OwnerReference {
    OwnerReference {
        api_version: "nvidia.com/v1alpha1".into(),
        kind: "GPUCluster".into(),
        name: "gpu-cluster".into(),
        uid: "uid-1".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn daemonset(spec: Value) -> DaemonSet {
    daemonset_logging(spec, &[])
}

/// With the controller's `--components-*` logging flags turned into `log_env`.
fn daemonset_logging(spec: Value, log_env: &[(&'static str, String)]) -> DaemonSet {
    let spec: GPUClusterSpec = serde_json::from_value(spec).expect("spec parses");
    let t = Target {
        namespace: "gpu-dra",
        owner: owner(),
        spec: &spec,
        log_env,
    };
    render::plugin_daemonset(&t).expect("renders")
}

fn containers(ds: &DaemonSet) -> Vec<Container> {
    ds.spec.template.spec.as_ref().unwrap().containers.clone()
}

/// `env var name -> --long-flag` of `dra-plugin run`, from the plugin's clap definition, and the
/// logging variables the shared logging set-up reads for its global flags.
fn plugin_env_flags() -> BTreeMap<String, String> {
    let cli = Cli::command();
    let run = cli.find_subcommand("run").expect("dra-plugin has `run`");
    let mut flags: BTreeMap<String, String> = run
        .get_arguments()
        .filter_map(|a| {
            let env = a.get_env()?.to_str()?.to_owned();
            Some((env, format!("--{}", a.get_long()?)))
        })
        .collect();
    for (env, long) in [
        (gpu_dra_log::VERBOSITY_ENV, "v"),
        (gpu_dra_log::FORMAT_ENV, "logging-format"),
    ] {
        let arg = cli
            .get_arguments()
            .find(|a| a.get_long() == Some(long))
            .unwrap_or_else(|| panic!("dra-plugin has no --{long}"));
        assert!(arg.is_global_set(), "--{long} is global");
        flags.insert(env.to_owned(), format!("--{long}"));
    }
    flags
}

/// The `run` flags that take no value.
fn plugin_switches() -> std::collections::BTreeSet<String> {
    let cli = Cli::command();
    let run = cli.find_subcommand("run").expect("dra-plugin has `run`");
    run.get_arguments()
        .filter(|a| !a.get_action().takes_values())
        .filter_map(|a| Some(format!("--{}", a.get_long()?)))
        .collect()
}

/// Parses the container the way its process would start: command, args, and every env var turned into
/// the flag the plugin reads it through. `NODE_NAME` and `POD_UID` (field references) resolve to
/// `node-a` and a fixed UID.
fn parse(c: &Container) -> RunArgs {
    parse_all(c).0
}

/// [`parse`], with the logging flags the variables turned into.
fn parse_all(c: &Container) -> (RunArgs, gpu_dra_log::LogArgs) {
    let flags = plugin_env_flags();
    let switches = plugin_switches();
    let mut argv: Vec<String> = c.command.clone().unwrap_or_default();
    argv.extend(c.args.clone().unwrap_or_default());
    assert_eq!(argv[..2], ["dra-plugin", "run"], "command and args");
    for e in c.env.as_deref().unwrap_or_default() {
        let flag = flags.get(&e.name).unwrap_or_else(|| {
            panic!(
                "container sets {} but `dra-plugin run` reads no such variable",
                e.name
            )
        });
        let value = match (&e.value, &e.value_from) {
            (Some(v), None) => v.clone(),
            (None, Some(from)) => {
                let path = &from.field_ref.as_ref().expect("field ref").field_path;
                match (e.name.as_str(), path.as_str()) {
                    ("NODE_NAME", "spec.nodeName") => "node-a".to_owned(),
                    ("POD_UID", "metadata.uid") => {
                        "8f0e4f7a-2c1b-4d3e-9a6b-5c4d3e2f1a0b".to_owned()
                    }
                    other => panic!("unexpected field reference {other:?}"),
                }
            }
            other => panic!("{}: {other:?}", e.name),
        };
        // A switch (`--on-demand-mig`) reads its variable as a boolean and takes no value.
        match (switches.contains(flag.as_str()), value.as_str()) {
            (true, "true") => argv.push(flag.clone()),
            (true, _) => {}
            (false, _) => argv.push(format!("{flag}={value}")),
        }
    }
    match Cli::try_parse_from(&argv) {
        Ok(Cli {
            command: Command::Run(args),
            log,
        }) => (args, log),
        Ok(other) => panic!("not `run`: {other:?}"),
        Err(e) => panic!("dra-plugin rejects {argv:?}: {e}"),
    }
}

fn env_of(c: &Container, name: &str) -> Option<String> {
    c.env
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

fn volume_path(ds: &DaemonSet, name: &str) -> String {
    let pod = ds.spec.template.spec.as_ref().unwrap();
    pod.volumes
        .as_deref()
        .unwrap()
        .iter()
        .find(|v| v.name == name)
        .unwrap_or_else(|| panic!("volume {name}"))
        .host_path
        .as_ref()
        .unwrap()
        .path
        .clone()
}

fn mount_path(c: &Container, name: &str) -> String {
    c.volume_mounts
        .as_deref()
        .unwrap()
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("mount {name}"))
        .mount_path
        .clone()
}

#[test]
fn defaults_parse_as_the_plugin_defaults_on_nvml() {
    let ds = daemonset(json!({ "draDriver": { "featureGates": { "DynamicMIG": true } } }));
    let cs = containers(&ds);
    assert_eq!(cs.len(), 2, "gpus and compute-domains (enabled by default)");
    let args = parse(&cs[0]);
    assert_eq!(args.device.node_name, "node-a");
    assert_eq!(args.device.driver_name, "gpu.nvidia.com");
    assert_eq!(args.device.feature_gates, "DynamicMIG=true");
    assert_eq!(args.device.backend, Backend::Nvml);
    assert_eq!(
        args.device.driver_root,
        Some(PathBuf::from(render::CONTAINER_DRIVER_ROOT))
    );
    assert_eq!(args.kubeconfig, None, "in-cluster configuration");
    assert_eq!(
        args.registrar_dir,
        PathBuf::from("/var/lib/kubelet/plugins_registry")
    );
    assert_eq!(
        args.plugin_dir,
        PathBuf::from("/var/lib/kubelet/plugins/gpu.nvidia.com")
    );
    assert_eq!(args.cdi_root, PathBuf::from("/var/run/cdi"));
    assert_eq!(args.metrics_port, Some(8080));
    assert_eq!(args.healthcheck_port, 51516);
    let probe = cs[0]
        .liveness_probe
        .as_ref()
        .unwrap()
        .grpc
        .as_ref()
        .unwrap();
    assert_eq!(
        (probe.port, probe.service.as_deref()),
        (51516, Some("liveness"))
    );
    // Host driver: host `/` is what the plugin sees at its driver root.
    assert_eq!(volume_path(&ds, "driver-root"), "/");
    assert_eq!(
        mount_path(&cs[0], "driver-root"),
        render::CONTAINER_DRIVER_ROOT
    );
}

#[test]
fn host_paths_move_the_sockets_and_the_driver_root() {
    let ds = daemonset(json!({
        "draDriver": {},
        "hostPaths": { "kubeletRootDir": "/data/kubelet/", "driverInstallDir": "/run/nvidia/driver" },
    }));
    let c = &containers(&ds)[0];
    let args = parse(c);
    assert_eq!(
        args.registrar_dir,
        PathBuf::from("/data/kubelet/plugins_registry")
    );
    assert_eq!(
        args.plugin_dir,
        PathBuf::from("/data/kubelet/plugins/gpu.nvidia.com")
    );
    // The kubelet dials the sockets at the paths the plugin reports: host and container paths agree.
    for (volume, path) in [
        ("plugins-registry", "/data/kubelet/plugins_registry"),
        ("plugin-dir", "/data/kubelet/plugins/gpu.nvidia.com"),
        ("cdi", "/var/run/cdi"),
    ] {
        assert_eq!(volume_path(&ds, volume), path);
        assert_eq!(mount_path(c, volume), path);
    }
    assert_eq!(volume_path(&ds, "driver-root"), "/run/nvidia/driver");
    assert_eq!(
        args.device.driver_root,
        Some(PathBuf::from(render::CONTAINER_DRIVER_ROOT))
    );
}

#[test]
fn disabled_healthcheck_turns_the_health_server_off_and_user_env_overrides() {
    let ds = daemonset(json!({ "draDriver": { "gpus": { "kubeletPlugin": {
        "healthcheck": { "enabled": false, "port": 6000 },
        "env": [ { "name": "DEVICE_BACKEND", "value": "simulated" },
                 { "name": "SIMULATED_PROFILES", "value": "h100-80gb:2" } ],
    } } } }));
    let c = &containers(&ds)[0];
    assert!(c.liveness_probe.is_none());
    assert_eq!(env_of(c, "HEALTHCHECK_PORT").as_deref(), Some("0"));
    let args = parse(c);
    assert_eq!(args.healthcheck_port, 0);
    assert_eq!(args.device.backend, Backend::Simulated);
    assert_eq!(args.device.hardware.profiles, ["h100-80gb:2"]);
    let names: Vec<_> = c.env.as_ref().unwrap().iter().map(|e| &e.name).collect();
    assert_eq!(
        names.iter().filter(|n| **n == "DEVICE_BACKEND").count(),
        1,
        "an override replaces the built-in variable"
    );
}

#[test]
fn the_controllers_component_logging_reaches_both_plugins_and_a_component_may_override_it() {
    let log_env = [
        (gpu_dra_log::VERBOSITY_ENV, "4".to_string()),
        (gpu_dra_log::FORMAT_ENV, "json".to_string()),
    ];
    let ds = daemonset_logging(
        json!({ "draDriver": { "computeDomains": { "kubeletPlugin": {
            "healthcheck": { "port": 51515 },
            "env": [ { "name": "LOG_VERBOSITY", "value": "6" } ],
        } } } }),
        &log_env,
    );
    let cs = containers(&ds);
    let (_, gpus) = parse_all(&cs[0]);
    assert_eq!(gpus.verbosity, Some(4));
    assert_eq!(gpus.logging_format, Some(gpu_dra_log::Format::Json));
    let (_, cd) = parse_all(&cs[1]);
    assert_eq!(cd.verbosity, Some(6), "the component's own env wins");
    assert_eq!(cd.logging_format, Some(gpu_dra_log::Format::Json));
    // Without the controller flags the plugins get no logging variables at all.
    let plain = containers(&daemonset(json!({ "draDriver": {} })));
    assert_eq!(env_of(&plain[0], gpu_dra_log::VERBOSITY_ENV), None);
    assert_eq!(parse_all(&plain[0]).1, gpu_dra_log::LogArgs::default());
}

#[test]
fn compute_domains_run_the_plugin_in_compute_domain_mode() {
    let ds = daemonset(json!({ "draDriver": { "computeDomains": { "enabled": true } } }));
    let cs = containers(&ds);
    let names: Vec<_> = cs.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["gpus", "compute-domains"]);
    let args = parse(&cs[1]);
    assert_eq!(args.device.driver_name, "compute-domain.nvidia.com");
    assert_eq!(
        args.metrics_port,
        Some(8081),
        "no port clash with the gpus container"
    );
    assert!(
        args.plugin_dir
            .ends_with("plugins/compute-domain.nvidia.com"),
        "{}",
        args.plugin_dir.display()
    );
    assert_eq!(
        mount_path(&cs[1], "cd-plugin-dir"),
        args.plugin_dir.display().to_string()
    );
    assert_eq!(
        volume_path(&ds, "cd-plugin-dir"),
        args.plugin_dir.display().to_string()
    );
    let off = daemonset(json!({ "draDriver": { "computeDomains": { "enabled": false } } }));
    assert_eq!(containers(&off).len(), 1);
}

/// `onDemandMig.enabled` turns on the GPU plugin's `--on-demand-mig`, and only that container's.
#[test]
fn on_demand_mig_reaches_the_gpu_plugin_only() {
    let on = daemonset(json!({ "draDriver": {
        "gpus": { "onDemandMig": { "enabled": true, "policy": "Spread", "holdDown": "30s" } },
        "computeDomains": { "enabled": true },
    } }));
    let cs = containers(&on);
    assert!(parse(&cs[0]).device.on_demand_mig);
    assert!(!parse(&cs[1]).device.on_demand_mig);
    let off =
        daemonset(json!({ "draDriver": { "gpus": { "onDemandMig": { "enabled": false } } } }));
    assert!(!parse(&containers(&off)[0]).device.on_demand_mig);
    assert_eq!(env_of(&containers(&off)[0], "ON_DEMAND_MIG"), None);
}

/// The plugin may write its devices' entries in claim status: the status subresource, and the
/// per-driver verb the API server checks for a token bound to the claim's node (1.36+).
#[test]
fn plugin_role_allows_claim_status_of_its_driver() {
    let spec: GPUClusterSpec =
        serde_json::from_value(json!({ "draDriver": {} })).expect("spec parses");
    let t = Target {
        namespace: "gpu-dra",
        owner: owner(),
        spec: &spec,
        log_env: &[],
    };
    let rules = render::plugin_rbac(&t).expect("renders").role.rules;
    let rules = serde_json::to_value(rules).unwrap();
    let rule = |resource: &str| {
        rules
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resources"] == json!([resource]))
            .cloned()
            .unwrap_or_else(|| panic!("no rule for {resource}: {rules}"))
    };
    assert_eq!(
        rule("resourceclaims/status")["verbs"],
        json!(["get", "patch"])
    );
    let driver = rule("resourceclaims/driver");
    assert_eq!(driver["resourceNames"], json!(["gpu.nvidia.com"]));
    assert_eq!(driver["verbs"], json!(["associated-node:patch"]));
    let layouts = rules
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resources"] == json!(["miglayouts", "miglayouts/status"]))
        .unwrap_or_else(|| panic!("no MigLayout rule: {rules}"));
    assert_eq!(
        layouts["verbs"],
        json!(["get", "list", "watch", "create", "patch"])
    );
}

#[test]
fn operator_shaped_specs_render_with_per_flavour_health_ports_and_the_pod_security_context() {
    // The operator's CRD lets a kubeletPlugin omit healthcheck or its port.
    let ds = daemonset(json!({
        "draDriver": {
            "imagePullPolicy": "Always",
            "gpus": { "kubeletPlugin": { "env": [] } },
            "computeDomains": { "enabled": true, "kubeletPlugin": { "healthcheck": { "enabled": true } } },
        },
        "dcgmExporter": { "enabled": true, "serviceMonitor": { "enabled": false } },
        "daemonsets": { "podSecurityContext": { "seccompProfile": { "type": "RuntimeDefault" } } },
    }));
    let cs = containers(&ds);
    assert_eq!(parse(&cs[0]).healthcheck_port, 51516);
    assert_eq!(parse(&cs[1]).healthcheck_port, 51515);
    assert_eq!(cs[0].image_pull_policy.as_deref(), Some("Always"));
    let pod = ds.spec.template.spec.as_ref().unwrap();
    let psc = pod.security_context.as_ref().expect("podSecurityContext");
    assert_eq!(
        psc.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );
    let plain = daemonset(json!({ "draDriver": {} }));
    assert!(
        plain
            .spec
            .template
            .spec
            .as_ref()
            .unwrap()
            .security_context
            .is_none()
    );
}
