//! Per-claim CDI specs: one transient spec file per claim, one CDI device per allocated device.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gpu_dra_api::inventory::{DeviceRef, Gpu, Inventory, MigDevice, parse_device_name};
use gpu_dra_api::names::{CDI_CLAIM_ANNOTATION, CDI_CLASS, CDI_DEVICES_ANNOTATION, GPU_CDI_VENDOR};
use serde::{Deserialize, Serialize};

use super::fsutil::{remove_if_exists, replace_unsynced};
use super::types::PreparedDevice;
use crate::Error;

pub const CDI_VERSION: &str = "0.6.0";

/// Device nodes every GPU container needs besides its own `/dev/nvidia<minor>`.
const CONTROL_NODES: [&str; 3] = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub devices: Vec<CdiDevice>,
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CdiDevice {
    pub name: String,
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

impl ContainerEdits {
    fn is_empty(&self) -> bool {
        self.env.is_empty() && self.device_nodes.is_empty() && self.mounts.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// What the container needs for one allocated device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceEdits {
    pub device_name: String,
    pub uuid: String,
    pub device_nodes: Vec<String>,
    /// `KEY=value` beyond `NVIDIA_VISIBLE_DEVICES` (sharing settings such as MPS).
    pub env: Vec<String>,
    /// Bind mounts (MPS pipe, log and shm directories).
    pub mounts: Vec<Mount>,
}

/// `k8s.gpu.nvidia.com/claim=<claimUID>-<device>`.
pub fn cdi_device_id(claim_uid: &str, device: &str) -> String {
    format!("{GPU_CDI_VENDOR}/{CDI_CLASS}={claim_uid}-{device}")
}

#[derive(Debug, Clone)]
pub struct CdiStore {
    root: PathBuf,
}

impl CdiStore {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        CdiStore { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn spec_path(&self, claim_uid: &str) -> PathBuf {
        self.root
            .join(format!("{GPU_CDI_VENDOR}-{CDI_CLASS}_{claim_uid}.json"))
    }

    /// Builds the spec for a claim. Each device carries `NVIDIA_VISIBLE_DEVICES` with the UUIDs of
    /// every device of its request, so a container that takes one request sees exactly those.
    pub fn build_spec(
        claim_uid: &str,
        claim_key: &str,
        edits: &[DeviceEdits],
        prepared: &[PreparedDevice],
    ) -> Spec {
        let uuids_of_request = |device: &str| -> String {
            let Some(req) = prepared
                .iter()
                .find(|p| p.device_name == device)
                .map(|p| &p.request_names)
            else {
                return String::new();
            };
            prepared
                .iter()
                .filter(|p| &p.request_names == req)
                .filter_map(|p| edits.iter().find(|e| e.device_name == p.device_name))
                .map(|e| e.uuid.as_str())
                .collect::<Vec<_>>()
                .join(",")
        };
        let devices = edits
            .iter()
            .map(|e| CdiDevice {
                name: format!("{claim_uid}-{}", e.device_name),
                container_edits: ContainerEdits {
                    env: std::iter::once(format!(
                        "NVIDIA_VISIBLE_DEVICES={}",
                        uuids_of_request(&e.device_name)
                    ))
                    .chain(e.env.iter().cloned())
                    .collect(),
                    device_nodes: e
                        .device_nodes
                        .iter()
                        .map(|p| DeviceNode { path: p.clone() })
                        .collect(),
                    mounts: e.mounts.clone(),
                },
            })
            .collect();
        let mut annotations = BTreeMap::new();
        annotations.insert(CDI_CLAIM_ANNOTATION.to_string(), claim_key.to_string());
        annotations.insert(
            CDI_DEVICES_ANNOTATION.to_string(),
            serde_json::to_string(prepared).expect("prepared devices serialize"),
        );
        Spec {
            cdi_version: CDI_VERSION.into(),
            kind: format!("{GPU_CDI_VENDOR}/{CDI_CLASS}"),
            annotations,
            devices,
            container_edits: ContainerEdits {
                device_nodes: CONTROL_NODES
                    .iter()
                    .map(|p| DeviceNode {
                        path: p.to_string(),
                    })
                    .collect(),
                ..Default::default()
            },
        }
    }

    pub fn write(&self, claim_uid: &str, spec: &Spec) -> Result<(), Error> {
        let path = self.spec_path(claim_uid);
        replace_unsynced(&path, &Self::encode(spec))
            .map_err(|e| Error::io("writing the CDI spec", &path, e))
    }

    /// The bytes [`CdiStore::write`] puts in a spec file.
    pub fn encode(spec: &Spec) -> Vec<u8> {
        serde_json::to_vec(spec).expect("CDI spec serializes")
    }

    pub fn remove(&self, claim_uid: &str) -> Result<(), Error> {
        let path = self.spec_path(claim_uid);
        remove_if_exists(&path).map_err(|e| Error::io("removing the CDI spec", &path, e))
    }

    pub fn read(&self, claim_uid: &str) -> Result<Option<Spec>, Error> {
        let path = self.spec_path(claim_uid);
        match std::fs::read(&path) {
            Ok(data) => serde_json::from_slice(&data)
                .map(Some)
                .map_err(|e| Error::io("parsing the CDI spec", &path, std::io::Error::other(e))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("reading the CDI spec", &path, e)),
        }
    }

    /// Claim UIDs that have a spec file of ours.
    pub fn claim_uids(&self) -> Vec<String> {
        let prefix = format!("{GPU_CDI_VENDOR}-{CDI_CLASS}_");
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut uids: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|n| Some(n.strip_prefix(&prefix)?.strip_suffix(".json")?.to_string()))
            .collect();
        uids.sort();
        uids
    }
}

/// MIG access capability device nodes, following the driver's fixed minor layout
/// (`gpu<m>/gi<g>/access` and `.../ci<c>/access` in nvidia-caps' mig-minors).
pub fn mig_cap_nodes(parent_minor: u32, gi_id: u32, ci_id: u32) -> [String; 2] {
    const PER_GI: u32 = 9; // the GI itself plus 8 compute instances
    const PER_GPU: u32 = 15 * PER_GI;
    let gi = 3 + parent_minor * PER_GPU + gi_id * PER_GI;
    [
        format!("/dev/nvidia-caps/nvidia-cap{gi}"),
        format!("/dev/nvidia-caps/nvidia-cap{}", gi + 1 + ci_id),
    ]
}

/// Edits for a whole GPU.
pub fn gpu_edits(device: &str, gpu: &Gpu) -> DeviceEdits {
    DeviceEdits {
        device_name: device.to_string(),
        uuid: gpu.uuid.clone(),
        device_nodes: vec![format!("/dev/nvidia{}", gpu.minor)],
        ..Default::default()
    }
}

/// Edits for a device that exists right now (a whole GPU or a live MIG device).
pub fn existing_edits(inv: &Inventory, device: &str) -> Option<DeviceEdits> {
    match parse_device_name(device)? {
        DeviceRef::Gpu { minor } => Some(gpu_edits(device, inv.gpu_by_minor(minor)?)),
        DeviceRef::Mig {
            parent_minor,
            gi_profile_id,
            start,
        } => {
            let gpu = inv.gpu_by_minor(parent_minor)?;
            let mig = gpu
                .mig
                .as_ref()?
                .devices
                .iter()
                .find(|m| m.gi_profile_id == gi_profile_id && m.placement_start == start)?;
            Some(mig_edits(device, gpu, mig))
        }
    }
}

pub fn mig_edits(device: &str, gpu: &Gpu, mig: &MigDevice) -> DeviceEdits {
    let mut nodes = vec![format!("/dev/nvidia{}", gpu.minor)];
    nodes.extend(mig_cap_nodes(gpu.minor, mig.gi_id, mig.ci_id));
    DeviceEdits {
        device_name: device.to_string(),
        uuid: mig.uuid.clone(),
        device_nodes: nodes,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepared(device: &str, req: &str) -> PreparedDevice {
        PreparedDevice {
            request_names: vec![req.into()],
            pool_name: "n1".into(),
            device_name: device.into(),
            cdi_device_ids: vec![cdi_device_id("uid-1", device)],
            share_id: None,
            uuid: None,
        }
    }

    #[test]
    fn spec_has_device_nodes_env_and_rebuild_annotations() {
        let edits = vec![
            DeviceEdits {
                device_name: "gpu-0".into(),
                uuid: "GPU-a".into(),
                device_nodes: vec!["/dev/nvidia0".into()],
                ..Default::default()
            },
            DeviceEdits {
                device_name: "gpu-1".into(),
                uuid: "GPU-b".into(),
                device_nodes: vec!["/dev/nvidia1".into()],
                env: vec!["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps".into()],
                mounts: vec![Mount {
                    host_path: "/plugin/mps/uid-1/pipe".into(),
                    container_path: "/tmp/nvidia-mps".into(),
                    options: vec!["rw".into(), "bind".into()],
                }],
            },
            DeviceEdits {
                device_name: "gpu-2".into(),
                uuid: "GPU-c".into(),
                device_nodes: vec!["/dev/nvidia2".into()],
                ..Default::default()
            },
        ];
        let p = vec![
            prepared("gpu-0", "pair"),
            prepared("gpu-1", "pair"),
            prepared("gpu-2", "solo"),
        ];
        let spec = CdiStore::build_spec("uid-1", "ns/claim", &edits, &p);
        assert_eq!(spec.kind, "k8s.gpu.nvidia.com/claim");
        assert_eq!(spec.devices[0].name, "uid-1-gpu-0");
        assert_eq!(
            spec.devices[0].container_edits.env,
            ["NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b"]
        );
        assert_eq!(
            spec.devices[2].container_edits.env,
            ["NVIDIA_VISIBLE_DEVICES=GPU-c"]
        );
        assert_eq!(
            spec.devices[1].container_edits.env,
            [
                "NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b",
                "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"
            ],
            "sharing env follows the visible devices"
        );
        assert_eq!(
            spec.devices[1].container_edits.mounts[0].container_path,
            "/tmp/nvidia-mps"
        );
        assert!(spec.devices[0].container_edits.mounts.is_empty());
        assert_eq!(
            spec.devices[1].container_edits.device_nodes,
            [DeviceNode {
                path: "/dev/nvidia1".into()
            }]
        );
        let control: Vec<_> = spec
            .container_edits
            .device_nodes
            .iter()
            .map(|d| d.path.as_str())
            .collect();
        assert_eq!(control, CONTROL_NODES);
        let back: Vec<PreparedDevice> =
            serde_json::from_str(&spec.annotations[CDI_DEVICES_ANNOTATION]).unwrap();
        assert_eq!(back, p);
        assert_eq!(
            cdi_device_id("uid-1", "gpu-0"),
            "k8s.gpu.nvidia.com/claim=uid-1-gpu-0"
        );
    }

    #[test]
    fn write_read_list_remove_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = CdiStore::new(dir.path().join("cdi"));
        let spec = CdiStore::build_spec("u1", "ns/c", &[], &[]);
        store.write("u1", &spec).unwrap();
        store.write("u2", &spec).unwrap();
        std::fs::write(dir.path().join("cdi/other-vendor.json"), "{}").unwrap();
        assert_eq!(store.claim_uids(), ["u1", "u2"]);
        assert_eq!(store.read("u1").unwrap(), Some(spec));
        store.remove("u1").unwrap();
        store.remove("u1").unwrap();
        assert_eq!(store.read("u1").unwrap(), None);
        assert_eq!(store.claim_uids(), ["u2"]);
    }

    #[test]
    fn mig_capability_minors_follow_the_driver_layout() {
        assert_eq!(
            mig_cap_nodes(0, 0, 0),
            [
                "/dev/nvidia-caps/nvidia-cap3",
                "/dev/nvidia-caps/nvidia-cap4"
            ]
        );
        assert_eq!(
            mig_cap_nodes(0, 1, 0),
            [
                "/dev/nvidia-caps/nvidia-cap12",
                "/dev/nvidia-caps/nvidia-cap13"
            ]
        );
        assert_eq!(mig_cap_nodes(1, 0, 2)[1], "/dev/nvidia-caps/nvidia-cap141");
    }
}
