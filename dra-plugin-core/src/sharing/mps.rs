//! MPS: one control daemon per claim, run by the plugin as a supervised process.
//!
//! # Why a supervised process and not NVIDIA's per-claim Deployment
//!
//! NVIDIA's driver renders a Deployment per claim, creates it through the API server and polls it
//! until ready (seconds, with an image pull and a scheduling round on a cold node). This plugin
//! starts `nvidia-cuda-mps-control -d` itself, from the driver root it already mounts for NVML:
//!
//! * prepare does not depend on the API server, RBAC to create Deployments, the scheduler or an
//!   image pull: the daemon is up as soon as its control pipe exists (milliseconds), and offline
//!   mode and the e2e work the same way as a real node;
//! * the daemon's life is tied to the claim's checkpoint record, which already drives rollback and
//!   crash recovery; there is no second object (a Deployment) whose state can drift from it;
//! * at startup the plugin finds each prepared claim's daemon by its pipe directory and re-adopts it
//!   if it still runs, or starts it again if it does not (a restarted plugin container takes its
//!   processes with it), so a prepared claim always has a daemon.
//!
//! The costs: the daemon runs in the plugin's container (its memory counts against the plugin
//! pod, so the DaemonSet needs headroom), and clients of a daemon that had to be restarted must
//! reconnect (CUDA clients fail over to a new control daemon only on their next context).
//!
//! Per claim the plugin creates `<plugin dir>/mps/<claimUID>/{pipe,shm,log}`, sets the claim's
//! whole GPUs to `ExclusiveProcess` (MIG devices are left alone: the compute mode belongs to the
//! whole GPU and its other MIG devices may serve other claims), starts the daemon with
//! `CUDA_VISIBLE_DEVICES` = the claim's device UUIDs, and gives every MPS device of the claim CDI
//! edits that mount the directories and point `CUDA_MPS_PIPE_DIRECTORY`/`CUDA_MPS_LOG_DIRECTORY` at
//! them, plus `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` from the
//! config. Unprepare stops the daemon (`quit`), removes the directories and resets the compute mode.
use std::path::{Path, PathBuf};

use gpu_dra_api::config::MpsConfig;
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::cdi::Mount;

/// Where the container sees the claim's pipe directory.
pub const CONTAINER_PIPE_DIR: &str = "/tmp/nvidia-mps";
/// Where the container sees the claim's log directory.
pub const CONTAINER_LOG_DIR: &str = "/var/log/nvidia-mps";
/// MPS clients and server share memory through `/dev/shm`.
pub const CONTAINER_SHM_DIR: &str = "/dev/shm";

/// One claim's MPS control daemon: everything needed to start it, stop it and rebuild the
/// container edits, as recorded in the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsDaemon {
    pub claim_uid: String,
    /// `<plugin dir>/mps/<claimUID>`.
    pub root: PathBuf,
    /// Whole GPUs whose compute mode is ExclusiveProcess while the daemon runs.
    pub gpu_minors: Vec<u32>,
    /// The devices the daemon serves, in allocation order (unknown yet for a dynamic MIG device
    /// in a record written before it was created).
    #[serde(default)]
    pub device_uuids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_thread_percentage: Option<i64>,
    /// Pinned device memory limit per device UUID, in MiB.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned_limits_mib: Vec<(String, u64)>,
    /// `mpsConfig.multiUser`: the daemon runs in multi-user mode (`-M`), so clients running as
    /// other users can connect.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub multi_user: bool,
}

impl MpsDaemon {
    pub fn root_for(mps_root: &Path, claim_uid: &str) -> PathBuf {
        mps_root.join(claim_uid)
    }

    pub fn pipe_dir(&self) -> PathBuf {
        self.root.join("pipe")
    }

    pub fn shm_dir(&self) -> PathBuf {
        self.root.join("shm")
    }

    pub fn log_dir(&self) -> PathBuf {
        self.root.join("log")
    }

    /// The daemon's control pipe; it exists while the daemon accepts clients.
    pub fn control_path(&self) -> PathBuf {
        self.pipe_dir().join("control")
    }

    pub fn create_dirs(&self) -> Result<(), Error> {
        for d in [self.pipe_dir(), self.shm_dir(), self.log_dir()] {
            std::fs::create_dir_all(&d)
                .map_err(|e| Error::io("creating an MPS directory", &d, e))?;
        }
        Ok(())
    }

    /// Removes the claim's directories; absent is fine.
    pub fn remove_dirs(&self) -> Result<(), Error> {
        match std::fs::remove_dir_all(&self.root) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::io("removing the MPS directories", &self.root, e))
            }
            _ => Ok(()),
        }
    }

    /// `<uuid>=<n>M,...`, the form `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` takes.
    pub fn pinned_limit_value(&self) -> Option<String> {
        (!self.pinned_limits_mib.is_empty()).then(|| {
            self.pinned_limits_mib
                .iter()
                .map(|(id, mib)| format!("{id}={mib}M"))
                .collect::<Vec<_>>()
                .join(",")
        })
    }

    fn tuning_env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if let Some(p) = self.active_thread_percentage {
            env.push(("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), p.to_string()));
        }
        if let Some(l) = self.pinned_limit_value() {
            env.push(("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), l));
        }
        env
    }

    /// The daemon's environment (host paths).
    pub fn daemon_env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            ("CUDA_VISIBLE_DEVICES".into(), self.device_uuids.join(",")),
            (
                "CUDA_MPS_PIPE_DIRECTORY".into(),
                self.pipe_dir().display().to_string(),
            ),
            (
                "CUDA_MPS_LOG_DIRECTORY".into(),
                self.log_dir().display().to_string(),
            ),
        ];
        env.extend(self.tuning_env());
        env
    }

    /// The container's environment (container paths).
    pub fn container_env(&self) -> Vec<String> {
        let mut env = vec![
            format!("CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}"),
            format!("CUDA_MPS_LOG_DIRECTORY={CONTAINER_LOG_DIR}"),
        ];
        env.extend(
            self.tuning_env()
                .into_iter()
                .map(|(k, v)| format!("{k}={v}")),
        );
        env
    }

    pub fn container_mounts(&self) -> Vec<Mount> {
        let bind = |host: PathBuf, container: &str| Mount {
            host_path: host.display().to_string(),
            container_path: container.to_string(),
            options: vec!["rw".into(), "nosuid".into(), "nodev".into(), "bind".into()],
        };
        vec![
            bind(self.pipe_dir(), CONTAINER_PIPE_DIR),
            bind(self.log_dir(), CONTAINER_LOG_DIR),
            bind(self.shm_dir(), CONTAINER_SHM_DIR),
        ]
    }
}

/// Whether a GPU of this CUDA compute capability (`major.minor`) can serve multi-user MPS: Volta
/// (7.0) or newer, as NVIDIA's driver requires.
pub fn multi_user_capable(cuda_compute_capability: &str) -> bool {
    let mut parts = cuda_compute_capability
        .split('.')
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().unwrap_or(Some(0))) {
        (Some(major), Some(minor)) => (major, minor) >= (7, 0),
        _ => false,
    }
}

/// Per-device pinned memory limits: the default for every device, then the per-device entries,
/// keyed by a device's UUID or by its index among the daemon's devices sorted by UUID (what
/// NVIDIA's driver indexes). Limits are whole MiB (a quantity's value rounded up to bytes, then
/// down to MiB). `at` is the config's path, for errors.
pub fn pinned_limits(
    config: &MpsConfig,
    uuids: &[String],
    at: &str,
) -> Result<Vec<(String, u64)>, Error> {
    let config_err =
        |path: String, reason: String| Error::Model(gpu_dra_api::Error::Config { path, reason });
    let mib = |q: &str, path: String| -> Result<u64, Error> {
        let bytes = gpu_dra_api::quantity::value(q)
            .map_err(|_| config_err(path.clone(), format!("{q:?} is not a quantity")))?;
        if bytes < 1 << 20 {
            return Err(config_err(path, format!("{q} is below the 1Mi minimum")));
        }
        Ok(u64::try_from(bytes >> 20).unwrap_or(u64::MAX))
    };
    let mut sorted: Vec<&String> = uuids.iter().collect();
    sorted.sort();
    let mut limits: Vec<(String, u64)> = Vec::new();
    if let Some(q) = &config.default_pinned_device_memory_limit {
        let v = mib(
            q,
            format!("{at}.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit"),
        )?;
        limits.extend(uuids.iter().map(|u| (u.clone(), v)));
    }
    for (key, q) in config
        .default_per_device_pinned_memory_limit
        .iter()
        .flatten()
    {
        let path = format!("{at}.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[{key}]");
        // A UUID first, then an integer as Go's strconv.Atoi reads it (sign allowed).
        let uuid = uuids
            .iter()
            .find(|u| *u == key)
            .or_else(|| {
                let i = key.parse::<i64>().ok()?;
                sorted.get(usize::try_from(i).ok()?).copied()
            })
            .cloned()
            .ok_or_else(|| {
                config_err(
                    path.clone(),
                    format!(
                        "{key:?} is neither the index (0..{}) nor the UUID of one of the claim's \
                         MPS devices",
                        uuids.len()
                    ),
                )
            })?;
        let v = mib(q, path)?;
        match limits.iter_mut().find(|(u, _)| *u == uuid) {
            Some(l) => l.1 = v,
            None => limits.push((uuid, v)),
        }
    }
    Ok(limits)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn daemon() -> MpsDaemon {
        MpsDaemon {
            claim_uid: "u1".into(),
            root: PathBuf::from("/plugin/mps/u1"),
            gpu_minors: vec![0],
            device_uuids: vec!["GPU-a".into(), "GPU-b".into()],
            active_thread_percentage: Some(50),
            pinned_limits_mib: vec![("GPU-a".into(), 1024), ("GPU-b".into(), 512)],
            multi_user: false,
        }
    }

    #[test]
    fn env_and_mounts_point_the_container_at_the_claims_directories() {
        let d = daemon();
        assert_eq!(
            d.container_env(),
            [
                "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
                "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=GPU-a=1024M,GPU-b=512M",
            ]
        );
        let mounts: Vec<_> = d
            .container_mounts()
            .into_iter()
            .map(|m| (m.host_path, m.container_path))
            .collect();
        assert_eq!(
            mounts,
            [
                ("/plugin/mps/u1/pipe".into(), "/tmp/nvidia-mps".into()),
                ("/plugin/mps/u1/log".into(), "/var/log/nvidia-mps".into()),
                ("/plugin/mps/u1/shm".into(), "/dev/shm".into()),
            ]
        );
        let env: BTreeMap<_, _> = d.daemon_env().into_iter().collect();
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
        assert_eq!(env["CUDA_MPS_PIPE_DIRECTORY"], "/plugin/mps/u1/pipe");
        assert_eq!(env["CUDA_MPS_LOG_DIRECTORY"], "/plugin/mps/u1/log");
    }

    #[test]
    fn multi_user_needs_volta_or_newer() {
        for cc in ["7.0", "7.5", "8.0", "9.0", "10.0", "12.1", "7"] {
            assert!(multi_user_capable(cc), "{cc}");
        }
        for cc in ["6.1", "5.2", "", "x.y", "6"] {
            assert!(!multi_user_capable(cc), "{cc}");
        }
    }

    #[test]
    fn per_device_indexes_count_in_uuid_order_and_read_like_go_atoi() {
        // Allocation order differs from UUID order: index 0 is the smallest UUID.
        let uuids = vec!["GPU-b".to_string(), "GPU-a".to_string()];
        for (key, want) in [
            ("0", "GPU-a"),
            ("+1", "GPU-b"),
            ("-0", "GPU-a"),
            ("01", "GPU-b"),
        ] {
            let cfg = MpsConfig {
                default_per_device_pinned_memory_limit: Some(BTreeMap::from([(
                    key.to_string(),
                    "1Gi".to_string(),
                )])),
                ..Default::default()
            };
            assert_eq!(
                pinned_limits(&cfg, &uuids, "p").unwrap(),
                [(want.to_string(), 1024)],
                "{key}"
            );
        }
        for key in ["-1", "2", " 0", "0x0"] {
            let cfg = MpsConfig {
                default_per_device_pinned_memory_limit: Some(BTreeMap::from([(
                    key.to_string(),
                    "1Gi".to_string(),
                )])),
                ..Default::default()
            };
            assert!(pinned_limits(&cfg, &uuids, "p").is_err(), "{key}");
        }
    }

    #[test]
    fn pinned_limits_default_then_per_device_by_index_or_uuid() {
        let uuids = vec![
            "GPU-a".to_string(),
            "GPU-b".to_string(),
            "GPU-c".to_string(),
        ];
        let cfg = MpsConfig {
            default_pinned_device_memory_limit: Some("2Gi".into()),
            default_per_device_pinned_memory_limit: Some(BTreeMap::from([
                ("1".to_string(), "1536Mi".to_string()),
                ("GPU-c".to_string(), "1G".to_string()),
            ])),
            ..Default::default()
        };
        assert_eq!(
            pinned_limits(&cfg, &uuids, "p").unwrap(),
            [
                ("GPU-a".to_string(), 2048),
                ("GPU-b".to_string(), 1536),
                ("GPU-c".to_string(), 953)
            ]
        );
        let only_one = MpsConfig {
            default_per_device_pinned_memory_limit: Some(BTreeMap::from([(
                "GPU-b".to_string(),
                "1Gi".to_string(),
            )])),
            ..Default::default()
        };
        assert_eq!(
            pinned_limits(&only_one, &uuids, "p").unwrap(),
            [("GPU-b".to_string(), 1024)]
        );
        for key in ["3", "GPU-x"] {
            let bad = MpsConfig {
                default_per_device_pinned_memory_limit: Some(BTreeMap::from([(
                    key.to_string(),
                    "1Gi".to_string(),
                )])),
                ..Default::default()
            };
            let e = pinned_limits(&bad, &uuids, "p").unwrap_err().to_string();
            assert!(
                e.contains(&format!(
                    "p.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[{key}]"
                )),
                "{e}"
            );
        }
    }

    #[test]
    fn directories_are_created_and_removed_idempotently() {
        let dir = tempfile::tempdir().unwrap();
        let mut d = daemon();
        d.root = MpsDaemon::root_for(&dir.path().join("mps"), "u1");
        d.create_dirs().unwrap();
        assert!(d.pipe_dir().is_dir() && d.shm_dir().is_dir() && d.log_dir().is_dir());
        d.remove_dirs().unwrap();
        d.remove_dirs().unwrap();
        assert!(!d.root.exists());
    }
}
