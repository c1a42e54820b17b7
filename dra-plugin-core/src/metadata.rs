//! Device metadata files (KEP-5304, NVIDIA's `DeviceMetadata` gate), in the layout of the
//! upstream kubeletplugin helper that NVIDIA's driver enables: per request of a prepared claim,
//! `<plugin dir>/dra-device-metadata/<ns>_<claim>/<request>/metadata.json` holding one
//! `DeviceMetadata` object per API version (newest first), and a CDI spec
//! `<cdi root>/<driver>_metadata_<claimUID>_<request>.json` whose one device bind-mounts that file
//! read-only at `/var/run/kubernetes.io/dra-device-attributes/...` in the container.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gpu_dra_api::names::{
    CDI_METADATA_CLASS, METADATA_API_GROUP, METADATA_CONTAINER_DIR, METADATA_DIR,
};
use serde::Serialize;

use crate::Error;
use crate::cdi::{CDI_VERSION, CdiDevice, ContainerEdits, Mount, Spec};
use crate::fsutil::{remove_if_exists, write_atomic};
use crate::types::{ClaimAllocation, ClaimRef, PreparedDevice};

/// The versions each file carries, newest first (what NVIDIA asks the helper for).
pub const VERSIONS: [&str; 2] = ["v1beta1", "v1alpha1"];

/// Attributes to publish per device name (NVIDIA: a VFIO device's slice attributes, as
/// `{"<name>": {"string": ...}}`); devices without an entry get none.
pub type DeviceAttributes = BTreeMap<String, serde_json::Value>;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Document<'a> {
    kind: &'static str,
    api_version: String,
    metadata: ObjectMeta<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod_claim_name: Option<&'a str>,
    requests: [Request<'a>; 1],
}

/// In the field order of Kubernetes' `ObjectMeta`, which the helper's encoder keeps.
#[derive(Serialize)]
struct ObjectMeta<'a> {
    name: &'a str,
    namespace: &'a str,
    uid: &'a str,
    generation: i64,
}

#[derive(Serialize)]
struct Request<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    devices: Vec<Device<'a>>,
}

#[derive(Serialize)]
struct Device<'a> {
    driver: &'a str,
    pool: &'a str,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    attributes: Option<&'a serde_json::Value>,
}

/// Writes and removes one driver's metadata files and their CDI specs.
#[derive(Debug, Clone)]
pub struct MetadataWriter {
    driver: String,
    plugin_dir: PathBuf,
    cdi_root: PathBuf,
}

impl MetadataWriter {
    pub fn new(driver: &str, plugin_dir: impl Into<PathBuf>, cdi_root: impl Into<PathBuf>) -> Self {
        MetadataWriter {
            driver: driver.to_string(),
            plugin_dir: plugin_dir.into(),
            cdi_root: cdi_root.into(),
        }
    }

    fn claim_dir(&self, claim: &ClaimRef) -> PathBuf {
        self.plugin_dir
            .join(METADATA_DIR)
            .join(format!("{}_{}", claim.namespace, claim.name))
    }

    pub fn file_path(&self, claim: &ClaimRef, request: &str) -> PathBuf {
        self.claim_dir(claim).join(request).join("metadata.json")
    }

    pub fn spec_path(&self, claim_uid: &str, request: &str) -> PathBuf {
        self.cdi_root.join(format!(
            "{}_{CDI_METADATA_CLASS}_{claim_uid}_{request}.json",
            self.driver
        ))
    }

    /// Where the container sees the file: by pod claim name for claims made from a template
    /// (their generated name is not in the pod spec), else by claim name.
    pub fn container_path(&self, alloc: &ClaimAllocation, request: &str) -> String {
        let (sub, name) = match alloc.pod_claim_name.as_deref().filter(|n| !n.is_empty()) {
            Some(pod_claim) => ("resourceclaimtemplates", pod_claim),
            None => ("resourceclaims", alloc.claim.name.as_str()),
        };
        format!(
            "{METADATA_CONTAINER_DIR}/{sub}/{name}/{request}/{}-metadata.json",
            self.driver
        )
    }

    /// The file of one request: `request_ref` as allocated (`<request>[/<subrequest>]`) and its
    /// devices in allocation order, each version's object pretty-printed and newline-ended.
    pub fn document(
        &self,
        alloc: &ClaimAllocation,
        request_ref: &str,
        attributes: &DeviceAttributes,
    ) -> Vec<u8> {
        let devices = alloc
            .devices
            .iter()
            .filter(|d| d.request == request_ref)
            .map(|d| Device {
                driver: &self.driver,
                pool: &d.pool,
                name: &d.device,
                attributes: attributes.get(&d.device),
            })
            .collect();
        let mut doc = Document {
            kind: "DeviceMetadata",
            api_version: String::new(),
            metadata: ObjectMeta {
                name: &alloc.claim.name,
                namespace: &alloc.claim.namespace,
                uid: &alloc.claim.uid,
                generation: 1,
            },
            pod_claim_name: alloc.pod_claim_name.as_deref(),
            requests: [Request {
                name: request_ref,
                devices,
            }],
        };
        let mut out = Vec::new();
        for version in VERSIONS {
            doc.api_version = format!("{METADATA_API_GROUP}/{version}");
            serde_json::to_writer_pretty(&mut out, &doc).expect("metadata serializes");
            out.push(b'\n');
        }
        out
    }

    /// The CDI spec that mounts a request's file; its one device is `<claimUID>_<request>`.
    pub fn spec(&self, alloc: &ClaimAllocation, request: &str) -> Spec {
        let name = format!("{}_{request}", alloc.claim.uid);
        // The lowest version that allows the name (a leading digit needs 0.5.0), as the
        // helper picks it.
        let version = match name.starts_with(|c: char| c.is_ascii_alphabetic()) {
            true => "0.3.0",
            false => "0.5.0",
        };
        debug_assert!(version <= CDI_VERSION);
        Spec {
            cdi_version: version.into(),
            kind: format!("{}/{CDI_METADATA_CLASS}", self.driver),
            annotations: BTreeMap::new(),
            devices: vec![CdiDevice {
                name,
                container_edits: ContainerEdits {
                    mounts: vec![Mount {
                        host_path: self.file_path(&alloc.claim, request).display().to_string(),
                        container_path: self.container_path(alloc, request),
                        options: vec!["ro".into(), "bind".into()],
                    }],
                    ..Default::default()
                },
            }],
            container_edits: ContainerEdits::default(),
        }
    }

    /// Writes the files and specs of every request of the claim; returns the CDI device ID of
    /// each base request.
    pub fn write(
        &self,
        alloc: &ClaimAllocation,
        attributes: &DeviceAttributes,
    ) -> Result<BTreeMap<String, String>, Error> {
        let mut ids = BTreeMap::new();
        for d in &alloc.devices {
            let request = d.base_request();
            if ids.contains_key(request) {
                continue;
            }
            let file = self.file_path(&alloc.claim, request);
            let dir = file.parent().expect("a file under the claim directory");
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::io("creating the metadata directory", dir, e))?;
            write_atomic(&file, &self.document(alloc, &d.request, attributes))
                .map_err(|e| Error::io("writing the device metadata", &file, e))?;
            let spec = self.spec(alloc, request);
            let path = self.spec_path(&alloc.claim.uid, request);
            let bytes = serde_json::to_vec_pretty(&spec).expect("CDI spec serializes");
            write_atomic(&path, &bytes)
                .map_err(|e| Error::io("writing the metadata CDI spec", &path, e))?;
            let id = format!(
                "{}/{CDI_METADATA_CLASS}={}",
                self.driver, spec.devices[0].name
            );
            ids.insert(request.to_string(), id);
        }
        Ok(ids)
    }

    /// Removes a claim's files and specs; nothing there is fine.
    pub fn remove(&self, claim: &ClaimRef) -> Result<(), Error> {
        let dir = self.claim_dir(claim);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io("removing the device metadata", &dir, e));
            }
            _ => {}
        }
        let prefix = format!("{}_{CDI_METADATA_CLASS}_{}_", self.driver, claim.uid);
        for path in files_with_prefix(&self.cdi_root, &prefix) {
            remove_if_exists(&path)
                .map_err(|e| Error::io("removing the metadata CDI spec", &path, e))?;
        }
        Ok(())
    }
}

fn files_with_prefix(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".json"))
        })
        .map(|e| e.path())
        .collect()
}

/// Hands each request's metadata CDI device to the kubelet on the first device of that request,
/// as the helper does, so the runtime mounts the file once per container.
pub fn add_cdi_ids(devices: &mut [PreparedDevice], ids: &BTreeMap<String, String>) {
    let mut done = std::collections::BTreeSet::new();
    for d in devices {
        for request in &d.request_names {
            if let Some(id) = ids.get(request)
                && done.insert(request.clone())
            {
                d.cdi_device_ids.push(id.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests;
