//! `ComputeDomainClique` (resource.nvidia.com/v1beta1, namespaced): the IMEX daemons of one
//! ComputeDomain that share one NVLink clique, as NVIDIA's driver keeps them under its
//! `ComputeDomainCliques` gate. One object per domain and clique, in the driver namespace, named
//! `<domain UID>.<clique ID>`; `daemons[]` has one entry per node.
//!
//! The object has no `spec`/`status`: `daemons` sits at the top level, as in NVIDIA's CRD, which is
//! why the type implements [`kube::Resource`] by hand instead of deriving `CustomResource`.
use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "resource.nvidia.com";
pub const VERSION: &str = "v1beta1";
pub const KIND: &str = "ComputeDomainClique";
pub const PLURAL: &str = "computedomaincliques";
/// Prefix of the stable per-clique DNS names IMEX daemons reach each other by.
pub const DNS_NAME_PREFIX: &str = "compute-domain-daemon-";
/// NVIDIA's default `--max-nodes-per-imex-domain`: how many DNS names a nodes config lists.
pub const DEFAULT_MAX_NODES_PER_IMEX_DOMAIN: u32 = 18;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ComputeDomainClique {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub daemons: Vec<DaemonInfo>,
}

/// One node's IMEX daemon. `index` fixes its DNS name within the clique; `status` is `Ready` once
/// the daemon is.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DaemonInfo {
    pub node_name: String,
    #[serde(default)]
    pub ip_address: String,
    #[serde(default, rename = "cliqueID")]
    pub clique_id: String,
    #[serde(default)]
    pub index: i32,
    #[serde(default = "not_ready")]
    pub status: String,
}

fn not_ready() -> String {
    "NotReady".into()
}

impl kube::Resource for ComputeDomainClique {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        KIND.into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        PLURAL.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The object name NVIDIA gives a domain's clique.
pub fn clique_name(domain_uid: &str, clique_id: &str) -> String {
    format!("{domain_uid}.{clique_id}")
}

/// The DNS name of the daemon with `index`: `compute-domain-daemon-0003`.
pub fn dns_name(index: i64) -> String {
    format!("{DNS_NAME_PREFIX}{index:04}")
}

/// The IMEX nodes config in DNS-name mode: every name a clique can hand out, one per line, so the
/// file never changes while daemons come and go.
pub fn dns_nodes_config(max_nodes: u32) -> String {
    (0..max_nodes)
        .map(|i| format!("{}\n", dns_name(i64::from(i))))
        .collect()
}

/// `/etc/hosts` lines mapping each daemon's IP to its DNS name, ordered by index. Daemons without
/// an IP yet (or a negative index) are left out.
pub fn hosts_lines(daemons: &[DaemonInfo]) -> String {
    let mut by_index: BTreeMap<i32, &str> = BTreeMap::new();
    for d in daemons {
        if d.index >= 0 && !d.ip_address.is_empty() {
            by_index.insert(d.index, &d.ip_address);
        }
    }
    by_index
        .iter()
        .map(|(i, ip)| format!("{ip}\t{}\n", dns_name(i64::from(*i))))
        .collect()
}

/// The CRD, schema-compatible with NVIDIA's `computedomaincliques.resource.nvidia.com`.
pub fn crd() -> CustomResourceDefinition {
    let s = |d: &str| serde_json::json!({ "type": "string", "description": d });
    let daemon = serde_json::json!({
        "type": "object",
        "description": "One node's IMEX daemon in the clique.",
        "required": ["cliqueID", "ipAddress", "nodeName"],
        "properties": {
            "nodeName": s("Node the daemon runs on."),
            "ipAddress": s("The daemon pod's IP."),
            "cliqueID": s("`<fabric clusterUUID>.<cliqueId>`."),
            "index": { "type": "integer", "description": "Unique within the clique; fixes the daemon's DNS name `compute-domain-daemon-<index>`." },
            "status": { "type": "string", "enum": ["Ready", "NotReady"], "default": "NotReady",
                        "description": "Ready once the daemon is." },
        },
    });
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": format!("{PLURAL}.{GROUP}") },
        "spec": {
            "group": GROUP,
            "names": { "kind": KIND, "listKind": format!("{KIND}List"), "plural": PLURAL, "singular": "computedomainclique" },
            "scope": "Namespaced",
            "versions": [{
                "name": VERSION, "served": true, "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "description": "The IMEX daemons of one ComputeDomain in one NVLink clique; named `<domain UID>.<clique ID>`, in the driver namespace.",
                    "properties": {
                        "apiVersion": { "type": "string" },
                        "kind": { "type": "string" },
                        "metadata": { "type": "object" },
                        "daemons": {
                            "type": "array",
                            "items": daemon,
                            "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["nodeName"],
                        },
                    },
                }},
            }],
        },
    }))
    .expect("the ComputeDomainClique CRD is well-formed")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(node: &str, ip: &str, index: i32) -> DaemonInfo {
        DaemonInfo {
            node_name: node.into(),
            ip_address: ip.into(),
            clique_id: "c.1".into(),
            index,
            status: "Ready".into(),
        }
    }

    #[test]
    fn names_and_files_follow_nvidias_format() {
        assert_eq!(clique_name("u", "c.1"), "u.c.1");
        assert_eq!(dns_name(3), "compute-domain-daemon-0003");
        let cfg = dns_nodes_config(2);
        assert_eq!(
            cfg,
            "compute-domain-daemon-0000\ncompute-domain-daemon-0001\n"
        );
        let hosts = hosts_lines(&[d("b", "10.0.0.2", 1), d("a", "10.0.0.1", 0), d("c", "", 2)]);
        assert_eq!(
            hosts,
            "10.0.0.1\tcompute-domain-daemon-0000\n10.0.0.2\tcompute-domain-daemon-0001\n"
        );
    }

    #[test]
    fn missing_fields_take_nvidias_defaults() {
        let c: ComputeDomainClique = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "x" },
            "daemons": [{ "nodeName": "n", "ipAddress": "1.2.3.4", "cliqueID": "c.1" }],
        }))
        .unwrap();
        assert_eq!(c.daemons[0].index, 0);
        assert_eq!(c.daemons[0].status, "NotReady");
    }
}
