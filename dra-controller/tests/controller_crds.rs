//! The committed CRD YAML must be exactly what the Rust types generate.
//! Regenerate with `dra-controller crdgen > deploy/crds/crds.yaml`, or run this test with `BLESS_CRDS=1`.
use std::path::PathBuf;

fn committed(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}

#[test]
fn committed_crds_match_the_types() {
    let generated = dra_controller::controller::crd::crds_yaml().expect("CRDs serialise");
    for rel in [
        "deploy/crds/crds.yaml",
        "deploy/helm/gpu-dra-driver/crds/crds.yaml",
    ] {
        let path = committed(rel);
        if std::env::var_os("BLESS_CRDS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &generated).unwrap();
        }
        let on_disk =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            on_disk == generated,
            "{rel} is stale; regenerate it (see this file's header)"
        );
    }
}

#[test]
fn gpucluster_crd_enforces_the_singleton_name() {
    let yaml = dra_controller::controller::crd::crds_yaml().unwrap();
    assert!(yaml.contains("self.metadata.name == 'gpu-cluster'"));
    assert!(yaml.contains("scope: Cluster"));
    assert!(
        yaml.contains("self == oldSelf"),
        "ComputeDomain spec must be immutable"
    );
}

#[test]
fn crdgen_subcommand_prints_the_committed_crds() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dra-controller"))
        .arg("crdgen")
        .output()
        .expect("dra-controller runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8(out.stdout).expect("utf-8");
    let on_disk = std::fs::read_to_string(committed("deploy/crds/crds.yaml")).unwrap();
    assert!(
        printed == on_disk,
        "`dra-controller crdgen` differs from deploy/crds/crds.yaml"
    );
}

#[test]
fn the_charts_ownership_check_looks_for_the_label_our_crds_carry() {
    let (key, value) = dra_controller::controller::crd::CRD_OWNER_LABEL;
    let yaml = dra_controller::controller::crd::crds_yaml().unwrap();
    // GPUCluster, ComputeDomain, ComputeDomainClique, MigLayout.
    assert_eq!(yaml.matches(&format!("{key}: {value}")).count(), 4);
    let check = std::fs::read_to_string(committed(
        "deploy/helm/gpu-dra-driver/templates/crd-check.yaml",
    ))
    .unwrap();
    assert!(
        check.contains(&format!(r#"(get $labels "{key}") "{value}""#)),
        "crd-check.yaml must test {key}={value}"
    );
    assert!(check.contains(r#""gpuclusters.nvidia.com""#));
}
