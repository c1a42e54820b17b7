//! Keeps each prepared daemon's peer file current from the API server: the hosts file with
//! `IMEXDaemonsWithDNSNames` (see [`super::hosts`]), the nodes config's IP list without it (see
//! [`super::ips`]). One task per domain, from its daemon claim's prepare to its unprepare.
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use gpu_dra_api::cdclique::ComputeDomainClique;
use kube::Api;
use tokio::task::AbortHandle;

use super::{Peers, hosts, ips};

/// Starts and stops the per-domain followers.
pub trait PeerFollower: Send + Sync + 'static {
    /// Follows domain `uid` (its daemon claim is in `namespace`) into `path`; no-op when already
    /// followed.
    fn follow(&self, uid: &str, namespace: &str, path: PathBuf);
    fn stop(&self, uid: &str);
}

/// Follows the domain's ComputeDomainCliques into the hosts file with DNS names, the
/// ComputeDomain's status into the nodes config's IP list without.
pub struct KubeFollower {
    client: kube::Client,
    node: String,
    peers: Peers,
    tasks: Mutex<HashMap<String, AbortHandle>>,
}

impl KubeFollower {
    pub fn new(client: kube::Client, node: String, peers: Peers) -> Self {
        KubeFollower {
            client,
            node,
            peers,
            tasks: Mutex::new(HashMap::new()),
        }
    }
}

impl PeerFollower for KubeFollower {
    fn follow(&self, uid: &str, namespace: &str, path: PathBuf) {
        let mut tasks = self.tasks.lock().expect("follower tasks lock");
        if tasks.get(uid).is_some_and(|t| !t.is_finished()) {
            return;
        }
        let (uid, node) = (uid.to_string(), self.node.clone());
        let task = match self.peers {
            Peers::DnsNames { .. } => {
                let api: Api<ComputeDomainClique> = Api::namespaced(self.client.clone(), namespace);
                tokio::spawn(hosts::follow_cliques(api, uid.clone(), node, path))
            }
            Peers::Ips => tokio::spawn(ips::follow_domain(
                self.client.clone(),
                uid.clone(),
                node,
                path,
            )),
        };
        tasks.insert(uid, task.abort_handle());
    }

    fn stop(&self, uid: &str) {
        if let Some(t) = self.tasks.lock().expect("follower tasks lock").remove(uid) {
            t.abort();
        }
    }
}
