//! Who plays the kubelet on a node: the stock kubelet (every scenario by default) or the Rust
//! kubelet-role harness (only where a test injects what the stock kubelet never sends).
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anyhow::Result;
use kubelet_proto::dra_v1::dra_plugin_client::DraPluginClient;
use tonic::transport::Channel;

use crate::kubelet::{ClaimRef, Kubelet, PreparedDevice};
use crate::real_kubelet::RealKubelet;

pub enum NodeKubelet {
    Stock(Box<RealKubelet>),
    Harness(Kubelet),
}

impl NodeKubelet {
    /// Claims prepared on the node now, by UID, with the devices prepare returned.
    pub fn prepared(&self) -> Result<BTreeMap<String, (ClaimRef, Vec<PreparedDevice>)>> {
        match self {
            NodeKubelet::Stock(k) => k.prepared(),
            NodeKubelet::Harness(k) => Ok(k.prepared()),
        }
    }

    /// Claim UID -> NodePrepareResources calls that prepared it (the stock kubelet's calls are
    /// counted in the plugin's log, one `prepared` line per claim and call).
    pub fn prepare_calls(&self) -> Result<HashMap<String, u32>> {
        match self {
            NodeKubelet::Stock(k) => k.prepare_calls(),
            NodeKubelet::Harness(k) => Ok(k.prepare_calls()),
        }
    }

    /// What a kubelet or runtime refused (a scenario fails when this is not empty).
    pub fn violations(&self) -> Result<Vec<String>> {
        match self {
            NodeKubelet::Stock(k) => k.violations(),
            NodeKubelet::Harness(k) => Ok(k.violations()),
        }
    }

    /// A DRA client on the plugin's socket, for a test's own calls.
    pub fn dra_client(&self) -> Result<DraPluginClient<Channel>> {
        match self {
            NodeKubelet::Stock(k) => Ok(DraPluginClient::new(crate::grpc::uds_channel(
                &k.plugin_dir(crate::DRIVER).join("dra.sock"),
            ))),
            NodeKubelet::Harness(k) => k.dra_client(),
        }
    }

    /// The stock kubelet, for scenarios that restart it or read its runtime's records.
    pub fn stock(&self) -> Option<&RealKubelet> {
        match self {
            NodeKubelet::Stock(k) => Some(k),
            NodeKubelet::Harness(_) => None,
        }
    }

    pub fn stock_mut(&mut self) -> Option<&mut RealKubelet> {
        match self {
            NodeKubelet::Stock(k) => Some(k),
            NodeKubelet::Harness(_) => None,
        }
    }

    /// What is known about one pod, for the log of a failing scenario.
    pub fn describe_pod(&self, pod_uid: &str) -> Vec<String> {
        match self {
            NodeKubelet::Stock(k) => k
                .containers()
                .unwrap_or_default()
                .into_iter()
                .filter(|c| c.pod_uid == pod_uid)
                .map(|c| format!("{c:?}"))
                .collect(),
            NodeKubelet::Harness(k) => k
                .record_of(pod_uid)
                .map(|r| format!("{r:?}"))
                .into_iter()
                .collect(),
        }
    }

    /// Re-registration after a plugin restart: the stock kubelet's plugin watcher does it by
    /// itself; the harness must be told.
    pub async fn reregister_harness(&self, wait: Duration) -> Result<()> {
        if let NodeKubelet::Harness(k) = self {
            k.reregister(wait).await?;
        }
        Ok(())
    }
}
