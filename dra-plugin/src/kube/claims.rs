//! Turning a ResourceClaim into what the core prepares: this driver's results in this node's pool
//! and this driver's opaque configs, in allocation order.
use std::path::PathBuf;

use futures::FutureExt;
use futures::future::BoxFuture;
use gpu_dra_api::names::POD_CLAIM_NAME_ANNOTATION;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;

use crate::Error;
use crate::prepare::ClaimSource;
use dra_plugin_core::types::{
    AllocatedDevice, ClaimAllocation, ClaimRef, ConfigEntry, ConfigSource,
};

pub fn allocation_from_claim(
    obj: &ResourceClaim,
    want: &ClaimRef,
    driver: &str,
    pool: &str,
) -> Result<ClaimAllocation, Error> {
    let key = want.key();
    let uid = obj.metadata.uid.clone().unwrap_or_default();
    if uid != want.uid {
        return Err(Error::ClaimReplaced {
            key,
            expected: want.uid.clone(),
            actual: uid,
        });
    }
    let alloc = obj
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .ok_or_else(|| Error::NotAllocated(key.clone()))?;
    let devices = alloc
        .results
        .iter()
        .flatten()
        .filter(|r| r.driver == driver && r.pool == pool)
        .map(|r| AllocatedDevice {
            request: r.request.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            admin_access: r.admin_access.unwrap_or(false),
            share_id: r.share_id.clone(),
        })
        .collect();
    let configs = alloc
        .config
        .iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, c)| {
            let opaque = c.opaque.as_ref().filter(|o| o.driver == driver)?;
            Some(ConfigEntry {
                source: if c.source == "FromClass" {
                    ConfigSource::Class
                } else {
                    ConfigSource::Claim
                },
                requests: c.requests.clone().unwrap_or_default(),
                parameters: opaque.parameters.0.clone(),
                path: format!(
                    "ResourceClaim {key} status.allocation.devices.config[{i}].opaque.parameters"
                ),
            })
        })
        .collect();
    Ok(ClaimAllocation {
        claim: want.clone(),
        pod_claim_name: obj
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(POD_CLAIM_NAME_ANNOTATION).cloned()),
        devices,
        configs,
    })
}

/// Claim reads in flight at once. The client speaks HTTP/1.1, so each read in flight holds a
/// TLS connection of its own, which stays in the pool afterwards: a burst of 64 prepares would
/// otherwise leave 64 connections (and their buffers) open. A busy API server answers no faster
/// with more.
const MAX_CLAIM_READS: usize = 8;

/// Reads claims from the API server.
pub struct ApiClaims {
    client: kube::Client,
    driver: String,
    pool: String,
    reads: tokio::sync::Semaphore,
}

impl ApiClaims {
    pub fn new(client: kube::Client, driver: &str, pool: &str) -> Self {
        ApiClaims {
            client,
            driver: driver.into(),
            pool: pool.into(),
            reads: tokio::sync::Semaphore::new(MAX_CLAIM_READS),
        }
    }
}

impl ClaimSource for ApiClaims {
    fn allocation<'a>(
        &'a self,
        claim: &'a ClaimRef,
    ) -> BoxFuture<'a, Result<ClaimAllocation, Error>> {
        async move {
            let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &claim.namespace);
            let permit = self.reads.acquire().await.expect("never closed");
            let obj = api.get_opt(&claim.name).await;
            drop(permit);
            let obj = obj?.ok_or_else(|| Error::ClaimNotFound(claim.key()))?;
            allocation_from_claim(&obj, claim, &self.driver, &self.pool)
        }
        .boxed()
    }
}

/// Reads claims from `<dir>/<namespace>_<name>.json|yaml`: offline runs and benchmarks.
pub struct FileClaims {
    dir: PathBuf,
    driver: String,
    pool: String,
}

impl FileClaims {
    pub fn new(dir: PathBuf, driver: &str, pool: &str) -> Self {
        FileClaims {
            dir,
            driver: driver.into(),
            pool: pool.into(),
        }
    }

    pub fn path_for(dir: &std::path::Path, namespace: &str, name: &str) -> PathBuf {
        dir.join(format!("{namespace}_{name}.json"))
    }
}

impl ClaimSource for FileClaims {
    fn allocation<'a>(
        &'a self,
        claim: &'a ClaimRef,
    ) -> BoxFuture<'a, Result<ClaimAllocation, Error>> {
        async move {
            let json = Self::path_for(&self.dir, &claim.namespace, &claim.name);
            let yaml = json.with_extension("yaml");
            // Small local files the page cache answers: read in place rather than paying a
            // blocking-pool handoff per claim (this source feeds the prepare benchmark).
            let (path, text) = match std::fs::read_to_string(&json) {
                Ok(t) => (json, t),
                Err(_) => match std::fs::read_to_string(&yaml) {
                    Ok(t) => (yaml, t),
                    Err(_) => return Err(Error::ClaimNotFound(claim.key())),
                },
            };
            let parsed = if path.extension().is_some_and(|e| e == "json") {
                serde_json::from_str(&text).map_err(std::io::Error::other)
            } else {
                serde_yaml::from_str(&text).map_err(std::io::Error::other)
            };
            let obj: ResourceClaim =
                parsed.map_err(|e| Error::io("parsing the ResourceClaim", &path, e))?;
            allocation_from_claim(&obj, claim, &self.driver, &self.pool)
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim_json() -> ResourceClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {
                "results": [
                    {"request": "gpu/mig-slice", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0-mig-3g40gb-9-0"},
                    {"request": "nic", "driver": "nic.example.com", "pool": "n1", "device": "eth0"},
                    {"request": "gpu2", "driver": "gpu.nvidia.com", "pool": "n2", "device": "gpu-1", "adminAccess": true}
                ],
                "config": [
                    {"source": "FromClass", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "GpuConfig"}}},
                    {"source": "FromClaim", "requests": ["nic"], "opaque": {"driver": "nic.example.com", "parameters": {}}},
                    {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "MigDeviceConfig"}}}
                ]
            }}}
        }))
        .unwrap()
    }

    fn want(uid: &str) -> ClaimRef {
        ClaimRef {
            uid: uid.into(),
            namespace: "ns".into(),
            name: "c".into(),
        }
    }

    #[test]
    fn keeps_only_this_drivers_results_in_this_pool_and_its_configs() {
        let a = allocation_from_claim(&claim_json(), &want("u1"), "gpu.nvidia.com", "n1").unwrap();
        assert_eq!(a.devices.len(), 1);
        assert_eq!(a.devices[0].request, "gpu/mig-slice");
        assert_eq!(a.configs.len(), 2);
        assert_eq!(a.configs[0].source, ConfigSource::Class);
        assert_eq!(a.configs[1].requests, ["gpu"]);
        assert!(
            a.configs[1].path.ends_with("config[2].opaque.parameters"),
            "{}",
            a.configs[1].path
        );
    }

    #[test]
    fn replaced_and_unallocated_claims_are_errors() {
        let e =
            allocation_from_claim(&claim_json(), &want("u0"), "gpu.nvidia.com", "n1").unwrap_err();
        assert!(matches!(e, Error::ClaimReplaced { .. }), "{e}");
        let mut c = claim_json();
        c.status = None;
        assert!(matches!(
            allocation_from_claim(&c, &want("u1"), "gpu.nvidia.com", "n1"),
            Err(Error::NotAllocated(_))
        ));
    }
}
