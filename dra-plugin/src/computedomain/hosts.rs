//! `IMEXDaemonsWithDNSNames`: the IMEX daemon's nodes config lists fixed DNS names
//! (`compute-domain-daemon-0000` …), and a hosts file, mounted over the daemon container's
//! `/etc/hosts`, maps the names of this node's clique to the daemon pod IPs. The controller keeps
//! those in the domain's ComputeDomainClique objects; while a daemon claim is prepared here, the
//! plugin follows them and rewrites the hosts file whenever the mapping changes.
use std::path::{Path, PathBuf};

use futures::StreamExt;
use gpu_dra_api::cdclique::{ComputeDomainClique, hosts_lines};
use gpu_dra_api::names::COMPUTE_DOMAIN_NODE_LABEL;
use kube::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tracing::{info, warn};

/// What the hosts file holds besides the daemon names, since it replaces the container's own.
const BASE: &str = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
                    # ComputeDomain daemon mappings\n";

/// The hosts file's content for a clique's mapping lines.
pub fn hosts_file(mapping: &str) -> String {
    format!("{BASE}{mapping}")
}

/// Writes in place (same inode): the file is bind-mounted into a running container, where a
/// rename would leave the container with the old content.
pub fn write_hosts(path: &Path, mapping: &str) -> std::io::Result<()> {
    std::fs::write(path, hosts_file(mapping))
}

/// The mapping of the clique that lists `node`; empty while none does.
pub fn mapping_for(cliques: &[std::sync::Arc<ComputeDomainClique>], node: &str) -> String {
    cliques
        .iter()
        .find(|c| c.daemons.iter().any(|d| d.node_name == node))
        .map(|c| hosts_lines(&c.daemons))
        .unwrap_or_default()
}

/// Follows domain `uid`'s cliques (label `resource.nvidia.com/computeDomain=<uid>`) into the hosts
/// file at `path` until aborted.
pub async fn follow_cliques(
    api: Api<ComputeDomainClique>,
    uid: String,
    node: String,
    path: PathBuf,
) {
    let config = watcher::Config::default().labels(&format!("{COMPUTE_DOMAIN_NODE_LABEL}={uid}"));
    let (reader, writer) = reflector::store();
    let events = watcher(api, config).default_backoff().reflect(writer);
    futures::pin_mut!(events);
    let mut last: Option<String> = None;
    while let Some(event) = events.next().await {
        match event {
            Err(e) => {
                warn!(domain = %uid, error = %e, "watching ComputeDomainCliques");
                continue;
            }
            // The store holds the listed objects only once the initial list is done.
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
            Ok(_) => {}
        }
        let mapping = mapping_for(&reader.state(), &node);
        if last.as_deref() == Some(mapping.as_str()) {
            continue;
        }
        match write_hosts(&path, &mapping) {
            Ok(()) => {
                info!(domain = %uid, hosts = %path.display(), entries = mapping.lines().count(), "updated the IMEX daemon hosts file");
                last = Some(mapping);
            }
            Err(e) => {
                warn!(domain = %uid, hosts = %path.display(), error = %e, "writing the hosts file")
            }
        }
    }
}
