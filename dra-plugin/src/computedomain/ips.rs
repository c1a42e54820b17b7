//! `IMEXDaemonsWithDNSNames` off: the IMEX daemon's nodes config lists the IPs of the daemons in
//! this node's clique, as NVIDIA's daemon writes it. Like NVIDIA's, the list is written only once
//! the ComputeDomain's status holds all `numNodes` nodes, and a status with fewer (a node left)
//! keeps the last list; the daemon pod restarts IMEX on each new list.
use std::collections::BTreeSet;
use std::path::PathBuf;

use dra_plugin_core::fsutil::write_atomic;
use futures::StreamExt;
use gpu_dra_api::cdclique::{GROUP, VERSION};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;
use tracing::{info, warn};

/// The nodes config for `node` from a ComputeDomain (as JSON): one IP per line, sorted, of the
/// status nodes in `node`'s clique. None while the status lists fewer or more nodes than
/// `spec.numNodes`, does not list `node`, or lists a node of its clique without an IP yet (a list
/// without it would only restart the daemon again).
pub fn ip_nodes_config(domain: &Value, node: &str) -> Option<String> {
    let want = domain["spec"]["numNodes"].as_u64()?;
    let nodes = domain["status"]["nodes"].as_array()?;
    if u64::try_from(nodes.len()).ok()? != want {
        return None;
    }
    let clique = |n: &Value| n["cliqueID"].as_str().unwrap_or_default().to_string();
    let mine = clique(nodes.iter().find(|n| n["name"] == node)?);
    let ips: Option<BTreeSet<&str>> = nodes
        .iter()
        .filter(|n| clique(n) == mine)
        .map(|n| n["ipAddress"].as_str().filter(|ip| !ip.is_empty()))
        .collect();
    Some(ips?.into_iter().map(|ip| format!("{ip}\n")).collect())
}

/// Follows ComputeDomain `uid` into the nodes config at `path` until aborted. The daemon claim
/// lives in the driver namespace, not the domain's, so the watch spans all namespaces; domains are
/// few.
pub async fn follow_domain(client: kube::Client, uid: String, node: String, path: PathBuf) {
    let gvk = GroupVersionKind::gvk(GROUP, VERSION, "ComputeDomain");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "computedomains");
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let events = watcher(api, watcher::Config::default())
        .default_backoff()
        .applied_objects();
    futures::pin_mut!(events);
    let mut last: Option<String> = None;
    while let Some(event) = events.next().await {
        let domain = match event {
            Ok(d) if d.metadata.uid.as_deref() == Some(uid.as_str()) => d,
            Ok(_) => continue,
            Err(e) => {
                warn!(domain = %uid, error = %e, "watching ComputeDomains");
                continue;
            }
        };
        let Some(list) = ip_nodes_config(&domain.data, &node) else {
            continue;
        };
        if last.as_deref() == Some(list.as_str()) {
            continue;
        }
        match write_atomic(&path, list.as_bytes()) {
            Ok(()) => {
                info!(domain = %uid, nodes_config = %path.display(), nodes = list.lines().count(), "updated the IMEX daemon's peer IPs");
                last = Some(list);
            }
            Err(e) => {
                warn!(domain = %uid, nodes_config = %path.display(), error = %e, "writing the nodes config")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn domain(num_nodes: u64, nodes: &[(&str, &str, &str)]) -> Value {
        let nodes: Vec<Value> = nodes
            .iter()
            .map(|(name, ip, clique)| json!({ "name": name, "ipAddress": ip, "cliqueID": clique }))
            .collect();
        json!({ "spec": { "numNodes": num_nodes }, "status": { "nodes": nodes } })
    }

    #[test]
    fn lists_the_clique_once_every_node_is_there() {
        let two = [("a", "10.0.0.2", "c.1"), ("b", "10.0.0.1", "c.1")];
        assert_eq!(ip_nodes_config(&domain(3, &two), "a"), None, "incomplete");
        assert_eq!(
            ip_nodes_config(&domain(2, &two), "a").as_deref(),
            Some("10.0.0.1\n10.0.0.2\n")
        );
        let mixed = [
            ("a", "10.0.0.1", "c.1"),
            ("b", "10.0.0.2", "c.2"),
            ("c", "10.0.0.3", "c.1"),
        ];
        assert_eq!(
            ip_nodes_config(&domain(3, &mixed), "a").as_deref(),
            Some("10.0.0.1\n10.0.0.3\n"),
            "other cliques left out"
        );
        let no_ip = [("a", "10.0.0.1", "c.1"), ("b", "", "c.1"), ("c", "", "c.2")];
        assert_eq!(
            ip_nodes_config(&domain(3, &no_ip), "a"),
            None,
            "b has no IP yet"
        );
        assert_eq!(ip_nodes_config(&domain(2, &two), "z"), None, "not ours");
        assert_eq!(
            ip_nodes_config(&json!({ "spec": { "numNodes": 2 } }), "a"),
            None
        );
    }
}
