//! The compute-domain driver (`compute-domain.nvidia.com`): one IMEX channel device and one IMEX
//! daemon device per node. Preparing a channel injects the channel's device node through CDI and
//! labels the node with the domain, which is what lands the domain's daemon DaemonSet there;
//! preparing the daemon device hands the daemon its per-domain config directory: `imexd.cfg` and a
//! nodes config of DNS names and a hosts file with `IMEXDaemonsWithDNSNames` (see [`hosts`]), of
//! the clique's IPs without it (see [`ips`]), kept current by a [`follow::PeerFollower`].
//!
//! Run with `dra-plugin run --driver-name compute-domain.nvidia.com` next to the GPU plugin.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;
use gpu_dra_api::config::{ComputeDomainConfig, ComputeDomainDeviceKind};
use gpu_dra_api::names::{
    CDI_CLASS, COMPUTE_DOMAIN_CDI_VENDOR, COMPUTE_DOMAIN_DRIVER, COMPUTE_DOMAIN_NODE_LABEL,
    COMPUTE_DOMAIN_PLUGIN_FIELD_MANAGER, GPU_CLIQUE_NODE_LABEL,
};
use gpu_dra_api::slices::SliceContent;
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};
use serde::{Deserialize, Serialize};
use tracing::info;

use dra_plugin_core::Error as CoreError;
use dra_plugin_core::cdi::{CdiDevice, CdiStore, ContainerEdits, DeviceNode, Mount, Spec};
use dra_plugin_core::checkpoint::{Checkpoint, ClaimRecord, ClaimState};
use dra_plugin_core::fsutil::{remove_if_exists, write_atomic};
use dra_plugin_core::types::{AllocatedDevice, ClaimAllocation, PreparedDevice};

use crate::Error;
use crate::prepare::Preparer;

/// Where the NVIDIA driver creates IMEX channel device nodes.
pub const CHANNELS_DIR: &str = "/dev/nvidia-caps-imex-channels";

/// The devices this node publishes: `channel-0` and `daemon-0`.
pub fn pool_contents() -> Vec<SliceContent> {
    let device = |name: &str, kind: &str| Device {
        name: name.into(),
        attributes: Some(BTreeMap::from([
            (
                "type".to_string(),
                DeviceAttribute {
                    string: Some(kind.into()),
                    ..Default::default()
                },
            ),
            (
                "id".to_string(),
                DeviceAttribute {
                    int: Some(0),
                    ..Default::default()
                },
            ),
        ])),
        ..Default::default()
    };
    vec![SliceContent {
        devices: vec![device("channel-0", "channel"), device("daemon-0", "daemon")],
        shared_counters: Vec::new(),
    }]
}

/// What a claim holds, recorded so unprepare knows which domain label it may release.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Holding {
    #[serde(rename_all = "camelCase")]
    Channel { domain_id: String },
    #[serde(rename_all = "camelCase")]
    Daemon { domain_id: String },
}

/// Sets or clears this node's domain label, and reads its NVLink clique.
pub trait NodeLabeler: Send + Sync + 'static {
    fn current(&self) -> BoxFuture<'_, Result<Option<String>, Error>>;
    fn set<'a>(&'a self, domain: Option<&'a str>) -> BoxFuture<'a, Result<(), Error>>;
    /// The node's `nvidia.com/gpu.clique` label (GPU feature discovery's, from NVML's fabric info).
    fn clique_id(&self) -> BoxFuture<'_, Result<Option<String>, Error>>;
}

/// How a daemon finds its peers, as NVIDIA's `IMEXDaemonsWithDNSNames` decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peers {
    /// On: the nodes config lists `max_nodes` DNS names; a hosts file maps them to daemon IPs.
    DnsNames { max_nodes: u32 },
    /// Off: the nodes config lists the IPs of the node's clique.
    Ips,
}

pub struct ComputeDomainState {
    checkpoint: Checkpoint,
    peers: Peers,
    /// Keeps each prepared daemon's hosts file or IP list current (none in offline mode).
    follower: Option<Arc<dyn follow::PeerFollower>>,
    cdi_root: PathBuf,
    plugin_dir: PathBuf,
    channels_dir: PathBuf,
    labeler: Option<Arc<dyn NodeLabeler>>,
    // Claims of this driver are few and touch one node label: one at a time keeps that simple.
    lock: tokio::sync::Mutex<()>,
}

fn cdi_id(uid: &str, device: &str) -> String {
    format!("{COMPUTE_DOMAIN_CDI_VENDOR}/{CDI_CLASS}={uid}-{device}")
}

impl ComputeDomainState {
    pub fn new(
        checkpoint: Checkpoint,
        cdi_root: PathBuf,
        plugin_dir: PathBuf,
        channels_dir: PathBuf,
        labeler: Option<Arc<dyn NodeLabeler>>,
    ) -> Self {
        ComputeDomainState {
            checkpoint,
            cdi_root,
            plugin_dir,
            channels_dir,
            labeler,
            peers: Peers::Ips,
            follower: None,
            lock: tokio::sync::Mutex::new(()),
        }
    }

    /// How daemons find their peers, and who keeps their files current.
    pub fn with_peers(
        mut self,
        peers: Peers,
        follower: Option<Arc<dyn follow::PeerFollower>>,
    ) -> Self {
        self.peers = peers;
        self.follower = follower;
        self
    }

    /// The file the follower keeps in a domain directory.
    fn followed_file(&self, dir: &std::path::Path) -> PathBuf {
        match self.peers {
            Peers::DnsNames { .. } => dir.join("hosts"),
            Peers::Ips => dir.join("nodes.cfg"),
        }
    }

    fn domain_dir(&self, domain_id: &str) -> PathBuf {
        self.plugin_dir.join("domains").join(domain_id)
    }

    /// After a restart: follow the peers of every daemon claim the checkpoint holds.
    pub fn resume_followers(&self) {
        let Some(follower) = &self.follower else {
            return;
        };
        for r in self.checkpoint.claims().values() {
            for h in &r.hardware {
                if let Ok(Holding::Daemon { domain_id }) = serde_json::from_value(h.clone()) {
                    let path = self.followed_file(&self.domain_dir(&domain_id));
                    follower.follow(&domain_id, &r.namespace, path);
                }
            }
        }
    }

    /// The daemon's config files: `imexd.cfg` (see [`imexd`]) and `nodes.cfg`, plus in DNS-name mode
    /// `hosts`.
    fn write_daemon_config(&self, dir: &std::path::Path) -> Result<(), Error> {
        let cfg = imexd::daemon_config();
        let nodes = dir.join("nodes.cfg");
        match self.peers {
            Peers::DnsNames { max_nodes } => {
                let names = gpu_dra_api::cdclique::dns_nodes_config(max_nodes);
                write_atomic(&nodes, names.as_bytes())
                    .map_err(|e| Error::io("writing", &nodes, e))?;
                let hosts_path = dir.join("hosts");
                // Kept when present: a running daemon's bind mount must keep its inode.
                if !hosts_path.exists() {
                    hosts::write_hosts(&hosts_path, "")
                        .map_err(|e| Error::io("writing", &hosts_path, e))?;
                }
            }
            // Empty until the follower has the domain's full IP list; kept when present, as a
            // re-prepare must not take a running daemon's peers away.
            Peers::Ips if !nodes.exists() => {
                write_atomic(&nodes, b"").map_err(|e| Error::io("writing", &nodes, e))?;
            }
            Peers::Ips => {}
        }
        let path = dir.join("imexd.cfg");
        write_atomic(&path, cfg.as_bytes()).map_err(|e| Error::io("writing", &path, e))
    }

    pub fn spec_path(&self, uid: &str) -> PathBuf {
        self.cdi_root.join(format!(
            "{COMPUTE_DOMAIN_CDI_VENDOR}-{CDI_CLASS}_{uid}.json"
        ))
    }

    /// The config NVIDIA's compute-domain plugin applies to a device. Every config of the driver
    /// is decoded strictly first; then, from the highest precedence down, the first entry that
    /// names the device's request (it must be for this kind of device) or that names no request
    /// (skipped if it is the other compute-domain kind) wins. With none, NVIDIA falls back to a
    /// built-in default whose empty `domainID` fails validation: the claim is refused.
    fn config(
        alloc: &ClaimAllocation,
        d: &AllocatedDevice,
        kind: ComputeDomainDeviceKind,
    ) -> Result<ComputeDomainConfig, CoreError> {
        let decoded = dra_plugin_core::configs::decode_all(&alloc.configs)?;
        for (entry, config) in decoded.iter().rev() {
            let other_kind = config.compute_domain_kind().is_some_and(|k| k != kind);
            if !entry.requests.is_empty() {
                if !dra_plugin_core::configs::names_request(entry, d) {
                    continue;
                }
                if other_kind {
                    return Err(CoreError::InvalidAllocation(format!(
                        "{}: a {} cannot apply to {} of request {}",
                        entry.path,
                        config.kind_name(),
                        d.device,
                        d.request
                    )));
                }
            } else if other_kind {
                continue;
            }
            return Ok(config.compute_domain_config(&entry.path)?);
        }
        let want = match kind {
            ComputeDomainDeviceKind::Channel => "ComputeDomainChannelConfig",
            ComputeDomainDeviceKind::Daemon => "ComputeDomainDaemonConfig",
        };
        Err(CoreError::InvalidAllocation(format!(
            "device {}: no opaque {want} for request {}, and the built-in default has no domainID \
             (domainID cannot be empty)",
            d.device, d.request
        )))
    }

    fn channel_numbers(&self, all_channels: bool) -> Result<Vec<u32>, CoreError> {
        if !all_channels {
            return Ok(vec![0]);
        }
        let entries = std::fs::read_dir(&self.channels_dir)
            .map_err(|e| CoreError::io("listing IMEX channels", &self.channels_dir, e))?;
        let mut n: Vec<u32> = entries
            .filter_map(|e| {
                e.ok()?
                    .file_name()
                    .to_str()?
                    .strip_prefix("channel")?
                    .parse()
                    .ok()
            })
            .collect();
        n.sort_unstable();
        if n.is_empty() {
            return Err(CoreError::Device(format!(
                "no IMEX channels in {}",
                self.channels_dir.display()
            )));
        }
        Ok(n)
    }

    fn domains_in_use(&self, except: &str) -> Vec<String> {
        self.checkpoint
            .claims()
            .iter()
            .filter(|(uid, _)| uid.as_str() != except)
            .flat_map(|(_, r)| {
                r.hardware
                    .iter()
                    .filter_map(|h| serde_json::from_value::<Holding>(h.clone()).ok())
            })
            .filter_map(|h| match h {
                Holding::Channel { domain_id } => Some(domain_id),
                Holding::Daemon { .. } => None,
            })
            .collect()
    }

    async fn prepare_claim(&self, alloc: &ClaimAllocation) -> Result<Vec<PreparedDevice>, Error> {
        // Shared with a second plugin process (rolling upgrade): its records first.
        let _lease = self.checkpoint.lease().await?;
        let _guard = self.lock.lock().await;
        let uid = &alloc.claim.uid;
        if let Some(r) = self
            .checkpoint
            .get(uid)
            .filter(|r| r.state == ClaimState::PrepareCompleted)
        {
            return Ok(r.devices);
        }
        if alloc.devices.is_empty() {
            return Err(CoreError::InvalidAllocation(format!(
                "ResourceClaim {} has no devices of {COMPUTE_DOMAIN_DRIVER} here",
                alloc.claim.key()
            ))
            .into());
        }
        let mut holdings = Vec::new();
        let mut cdi_devices = Vec::new();
        let mut prepared = Vec::new();
        for d in &alloc.devices {
            let edits = match d.device.as_str() {
                "channel-0" => {
                    let ComputeDomainConfig::Channel {
                        domain_id,
                        all_channels,
                    } = Self::config(alloc, d, ComputeDomainDeviceKind::Channel)?
                    else {
                        return Err(CoreError::InvalidAllocation(format!(
                            "device {}: not given a channel config",
                            d.device
                        ))
                        .into());
                    };
                    let nodes = self.channel_numbers(all_channels)?;
                    holdings.push(Holding::Channel { domain_id });
                    ContainerEdits {
                        device_nodes: nodes
                            .iter()
                            .map(|n| DeviceNode {
                                path: format!("{CHANNELS_DIR}/channel{n}"),
                            })
                            .collect(),
                        ..Default::default()
                    }
                }
                "daemon-0" => {
                    let ComputeDomainConfig::Daemon { domain_id } =
                        Self::config(alloc, d, ComputeDomainDeviceKind::Daemon)?
                    else {
                        return Err(CoreError::InvalidAllocation(format!(
                            "device {}: not given a daemon config",
                            d.device
                        ))
                        .into());
                    };
                    let dir = self.domain_dir(&domain_id);
                    std::fs::create_dir_all(&dir)
                        .map_err(|e| Error::io("creating the domain directory", &dir, e))?;
                    self.write_daemon_config(&dir)?;
                    holdings.push(Holding::Daemon {
                        domain_id: domain_id.clone(),
                    });
                    let mut mounts = vec![Mount {
                        host_path: dir.to_string_lossy().into_owned(),
                        container_path: "/imexd".into(),
                        options: vec!["rw".into(), "bind".into()],
                    }];
                    if let Peers::DnsNames { .. } = self.peers {
                        // The daemon resolves the DNS names of nodes.cfg through this file.
                        mounts.push(Mount {
                            host_path: dir.join("hosts").to_string_lossy().into_owned(),
                            container_path: "/etc/hosts".into(),
                            options: vec!["ro".into(), "bind".into()],
                        });
                    }
                    if let Some(f) = &self.follower {
                        f.follow(&domain_id, &alloc.claim.namespace, self.followed_file(&dir));
                    }
                    let mut env = vec![format!("COMPUTE_DOMAIN_UUID={domain_id}")];
                    // As NVIDIA's plugin: an empty clique tells the daemon pod not to start IMEX.
                    if let Some(labeler) = &self.labeler {
                        let clique = labeler.clique_id().await?.unwrap_or_default();
                        env.push(format!("CLIQUE_ID={clique}"));
                    }
                    ContainerEdits {
                        env,
                        mounts,
                        ..Default::default()
                    }
                }
                other => {
                    return Err(CoreError::InvalidAllocation(format!(
                        "device {}/{other}: not a device of {COMPUTE_DOMAIN_DRIVER}",
                        d.pool
                    ))
                    .into());
                }
            };
            cdi_devices.push(CdiDevice {
                name: format!("{uid}-{}", d.device),
                container_edits: edits,
            });
            prepared.push(PreparedDevice {
                request_names: vec![d.base_request().to_string()],
                pool_name: d.pool.clone(),
                device_name: d.device.clone(),
                cdi_device_ids: vec![cdi_id(uid, &d.device)],
                share_id: None,
                uuid: None,
            });
        }
        let channel_domain = holdings.iter().find_map(|h| match h {
            Holding::Channel { domain_id } => Some(domain_id.clone()),
            Holding::Daemon { .. } => None,
        });
        if let Some(domain) = &channel_domain {
            if let Some(other) = self.domains_in_use(uid).into_iter().find(|o| o != domain) {
                return Err(CoreError::Busy(format!(
                    "this node serves ComputeDomain {other}; a channel of {domain} cannot be prepared here"
                )).into());
            }
            if let Some(l) = &self.labeler {
                l.set(Some(domain)).await?;
            }
        }
        let record = ClaimRecord {
            state: ClaimState::PrepareCompleted,
            namespace: alloc.claim.namespace.clone(),
            name: alloc.claim.name.clone(),
            devices: prepared.clone(),
            hardware: holdings
                .iter()
                .map(|h| serde_json::to_value(h).expect("serializes"))
                .collect(),
            unknown: Default::default(),
        };
        let spec = Spec {
            cdi_version: dra_plugin_core::cdi::CDI_VERSION.into(),
            kind: format!("{COMPUTE_DOMAIN_CDI_VENDOR}/{CDI_CLASS}"),
            annotations: BTreeMap::new(),
            devices: cdi_devices,
            container_edits: ContainerEdits::default(),
        };
        let path = self.spec_path(uid);
        write_atomic(&path, &CdiStore::encode(&spec))
            .map_err(|e| Error::io("writing the CDI spec", &path, e))?;
        self.checkpoint
            .update(|c| c.insert(uid.clone(), record))
            .await?;
        info!(claim = %alloc.claim.key(), domain = ?channel_domain, "prepared compute-domain devices");
        Ok(prepared)
    }

    async fn unprepare_claim(&self, uid: &str) -> Result<(), Error> {
        let _lease = self.checkpoint.lease().await?;
        let _guard = self.lock.lock().await;
        let path = self.spec_path(uid);
        remove_if_exists(&path).map_err(|e| Error::io("removing the CDI spec", &path, e))?;
        let Some(record) = self.checkpoint.get(uid) else {
            return Ok(());
        };
        let daemon_domains: Vec<String> = record
            .hardware
            .iter()
            .filter_map(|h| match serde_json::from_value::<Holding>(h.clone()) {
                Ok(Holding::Daemon { domain_id }) => Some(domain_id),
                _ => None,
            })
            .collect();
        let held_channel = record.hardware.iter().any(|h| {
            matches!(
                serde_json::from_value::<Holding>(h.clone()),
                Ok(Holding::Channel { .. })
            )
        });
        self.checkpoint
            .update(|c| {
                c.remove(uid);
            })
            .await?;
        if let Some(f) = &self.follower {
            for d in daemon_domains {
                f.stop(&d);
            }
        }
        if held_channel
            && self.domains_in_use(uid).is_empty()
            && let Some(l) = &self.labeler
        {
            l.set(None).await?;
        }
        Ok(())
    }
}

impl Preparer for ComputeDomainState {
    fn prepare<'a>(
        &'a self,
        alloc: &'a ClaimAllocation,
    ) -> BoxFuture<'a, Result<Vec<PreparedDevice>, Error>> {
        Box::pin(self.prepare_claim(alloc))
    }

    fn unprepare<'a>(&'a self, claim_uid: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.unprepare_claim(claim_uid))
    }

    fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }
}

/// The node label through server-side apply (its own field manager, so releasing it removes only
/// what this plugin set).
pub struct KubeNodeLabeler {
    pub client: kube::Client,
    pub node: String,
}

impl KubeNodeLabeler {
    async fn label(&self, key: &str) -> Result<Option<String>, Error> {
        let node = kube::Api::<k8s_openapi::api::core::v1::Node>::all(self.client.clone())
            .get(&self.node)
            .await?;
        Ok(node.metadata.labels.and_then(|l| l.get(key).cloned()))
    }
}

impl NodeLabeler for KubeNodeLabeler {
    fn current(&self) -> BoxFuture<'_, Result<Option<String>, Error>> {
        Box::pin(self.label(COMPUTE_DOMAIN_NODE_LABEL))
    }

    fn clique_id(&self) -> BoxFuture<'_, Result<Option<String>, Error>> {
        Box::pin(self.label(GPU_CLIQUE_NODE_LABEL))
    }

    fn set<'a>(&'a self, domain: Option<&'a str>) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let labels = match domain {
                Some(d) => serde_json::json!({ COMPUTE_DOMAIN_NODE_LABEL: d }),
                None => serde_json::json!({}),
            };
            let patch = serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node, "labels": labels}});
            let params = kube::api::PatchParams::apply(COMPUTE_DOMAIN_PLUGIN_FIELD_MANAGER).force();
            kube::Api::<k8s_openapi::api::core::v1::Node>::all(self.client.clone())
                .patch(&self.node, &params, &kube::api::Patch::Apply(patch))
                .await?;
            Ok(())
        })
    }
}

pub mod follow;
pub mod hosts;
pub mod imexd;
pub mod ips;
#[cfg(test)]
mod tests;
