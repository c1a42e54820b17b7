//! Checkpoint compatibility across releases. `fixtures/checkpoint/<commit>/` holds what the
//! checkpoint module of that commit wrote (generate/: its own code, run by gen.sh), one per format:
//! 68a95cc one file; 784a2ee two files written in turn with `seq` and blank padding; 02a0fad
//! device UUIDs. This version must load each with the same claims; and a version one format back
//! must read what this one leaves behind after a clean stop (docs/upgrades.md).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dra_plugin_core::checkpoint::{Checkpoint, ClaimState, LoadOutcome, checksum};
use dra_plugin_core::state::HardwareChange;
use serde::Deserialize;

const FIXTURES: [&str; 3] = ["68a95cc", "784a2ee", "02a0fad"];

/// A fixture copied to a scratch directory (loading may write to it).
fn copy_fixture(commit: &str) -> (tempfile::TempDir, PathBuf) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/checkpoint")
        .join(commit);
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    let path = dir.path().join("checkpoint.json");
    (dir, path)
}

#[test]
fn every_earlier_format_loads_with_the_same_claims() {
    for commit in FIXTURES {
        let (_dir, path) = copy_fixture(commit);
        let (cp, outcome) = Checkpoint::load(&path, "boot-1").unwrap();
        assert_eq!(outcome, LoadOutcome::Loaded, "{commit}");
        let claims = cp.claims();
        let uids: Vec<_> = claims.keys().map(String::as_str).collect();
        assert_eq!(uids, ["uid-mig", "uid-started", "uid-train"], "{commit}");
        let train = &claims["uid-train"];
        assert_eq!(train.state, ClaimState::PrepareCompleted, "{commit}");
        assert_eq!(
            (train.namespace.as_str(), train.name.as_str()),
            ("ns", "train")
        );
        let names: Vec<_> = train
            .devices
            .iter()
            .map(|d| d.device_name.as_str())
            .collect();
        assert_eq!(names, ["gpu-0", "gpu-1"], "{commit}");
        assert_eq!(
            train.devices[1].cdi_device_ids,
            ["k8s.gpu.nvidia.com/claim=uid-train-gpu-1"]
        );
        // UUIDs are kept since 02a0fad's format; earlier records have none.
        let uuid = train.devices[0].uuid.as_deref();
        assert_eq!(uuid, (commit == "02a0fad").then_some("GPU-0"), "{commit}");
        assert_eq!(claims["uid-started"].state, ClaimState::PrepareStarted);
        let mig: Vec<HardwareChange> = claims["uid-mig"]
            .hardware
            .iter()
            .map(|h| serde_json::from_value(h.clone()).unwrap())
            .collect();
        let want = HardwareChange::DynamicMig {
            parent_minor: 2,
            gi_profile_id: 9,
            placement_start: 4,
        };
        assert_eq!(mig, [want], "{commit}");
    }
}

#[test]
fn a_different_boot_drops_the_claims_of_every_format() {
    for commit in FIXTURES {
        let (_dir, path) = copy_fixture(commit);
        let (cp, outcome) = Checkpoint::load(&path, "boot-2").unwrap();
        assert!(matches!(outcome, LoadOutcome::Rebooted { ref dropped } if dropped.len() == 3));
        assert!(cp.claims().is_empty(), "{commit}");
    }
}

/// The reader of the oldest format (68a95cc), kept here as that version's types were: one file,
/// the checksum over `data` as written, unknown fields ignored.
mod previous {
    use super::*;

    #[derive(Deserialize)]
    pub struct Envelope<'a> {
        pub version: u32,
        pub checksum: String,
        #[serde(borrow)]
        pub data: &'a serde_json::value::RawValue,
    }

    #[derive(Deserialize, Debug)]
    #[serde(rename_all = "camelCase")]
    pub struct Data {
        #[serde(rename = "nodeBootID")]
        pub node_boot_id: String,
        pub claims: BTreeMap<String, Record>,
    }

    #[derive(Deserialize, Debug)]
    #[serde(rename_all = "camelCase")]
    pub struct Record {
        pub state: ClaimState,
        pub devices: Vec<Device>,
        #[serde(default)]
        pub hardware: Vec<serde_json::Value>,
    }

    #[derive(Deserialize, Debug)]
    #[serde(rename_all = "camelCase")]
    pub struct Device {
        pub device_name: String,
        pub cdi_device_ids: Vec<String>,
    }

    pub fn read(path: &Path) -> Result<Data, String> {
        let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
        let env: Envelope = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
        if env.version != 1 {
            return Err(format!("unknown checkpoint version {}", env.version));
        }
        if checksum(env.data.get().as_bytes()) != env.checksum {
            return Err("checksum mismatch".into());
        }
        serde_json::from_str(env.data.get()).map_err(|e| e.to_string())
    }
}

#[tokio::test]
async fn the_previous_format_reads_what_this_version_leaves_after_a_clean_stop() {
    let (_dir, path) = copy_fixture("02a0fad");
    let (cp, _) = Checkpoint::load(&path, "boot-1").unwrap();
    // Two writes: the newest lands in the alternate file, where settling must not leave it.
    cp.update(|_| ()).await.unwrap();
    cp.update(|c| c.remove("uid-started")).await.unwrap();
    cp.settle().await.unwrap();
    drop(cp);
    // Only checkpoint.json: the oldest reader knows no alternate file.
    let old = previous::read(&path).unwrap();
    assert_eq!(old.node_boot_id, "boot-1");
    let uids: Vec<_> = old.claims.keys().map(String::as_str).collect();
    assert_eq!(uids, ["uid-mig", "uid-train"]);
    let train = &old.claims["uid-train"];
    assert_eq!(train.state, ClaimState::PrepareCompleted);
    assert_eq!(train.devices[1].device_name, "gpu-1");
    assert_eq!(train.devices[1].cdi_device_ids.len(), 1);
    assert_eq!(old.claims["uid-mig"].hardware.len(), 1);
}

#[test]
fn a_checkpoint_of_a_newer_envelope_version_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    let data = r#"{"nodeBootID":"boot-1","seq":1,"claims":{}}"#;
    let file = format!(
        r#"{{"version":2,"checksum":"{}","data":{data}}}"#,
        checksum(data.as_bytes())
    );
    std::fs::write(&path, file).unwrap();
    let (_, outcome) = Checkpoint::load(&path, "boot-1").unwrap();
    let LoadOutcome::Corrupt { reason, .. } = outcome else {
        panic!("{outcome:?}");
    };
    assert!(
        reason.contains("version 2 is newer than this plugin understands"),
        "{reason}"
    );
}
