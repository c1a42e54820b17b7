//! `DRAPlugin` v1 and v1beta1: NodePrepareResources / NodeUnprepareResources.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use futures::future::join_all;
use kubelet_proto::{dra_v1 as v1, dra_v1beta1 as v1beta1};
use tonic::{Request, Response, Status};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::metrics::Metrics;
use crate::prepare::{ClaimSource, Preparer};
use dra_plugin_core::types::ClaimRef;

#[derive(Clone)]
pub struct DraService {
    state: Arc<dyn Preparer>,
    claims: Arc<dyn ClaimSource>,
    metrics: Arc<Metrics>,
}

impl DraService {
    pub fn new(
        state: Arc<dyn Preparer>,
        claims: Arc<dyn ClaimSource>,
        metrics: Arc<Metrics>,
    ) -> Self {
        DraService {
            state,
            claims,
            metrics,
        }
    }

    /// Prepares every claim of the call concurrently; one claim's failure is its own.
    pub async fn prepare(&self, claims: Vec<v1::Claim>) -> v1::NodePrepareResourcesResponse {
        let start = Instant::now();
        let results = join_all(claims.into_iter().map(|c| {
            let span = info_span!("prepare", claimUID = %c.uid, claim = %format!("{}/{}", c.namespace, c.name));
            async move {
                let claim = ClaimRef { uid: c.uid, namespace: c.namespace, name: c.name };
                // NVIDIA's series count each claim, timed from its start, successes only.
                let t0 = Instant::now();
                let in_flight = self.metrics.nvidia.in_flight("prepare");
                let result = match self.claims.allocation(&claim).await {
                    Ok(alloc) => self.state.prepare(&alloc).await,
                    Err(e) => Err(e),
                };
                drop(in_flight);
                match &result {
                    Ok(_) => self.metrics.nvidia.succeeded("prepare", t0.elapsed()),
                    Err(e) => self.metrics.nvidia.failed("prepare", e.reason()),
                }
                let entry = match result {
                    Ok(devices) => {
                        info!(devices = devices.len(), "prepared");
                        for d in &devices {
                            debug!(request = %d.request_names.join(","), device = %d.device_name, pool = %d.pool_name, "device prepared");
                        }
                        v1::NodePrepareResourceResponse {
                            devices: devices
                                .into_iter()
                                .map(|d| v1::Device {
                                    request_names: d.request_names,
                                    pool_name: d.pool_name,
                                    device_name: d.device_name,
                                    cdi_device_ids: d.cdi_device_ids,
                                    share_id: d.share_id,
                                })
                                .collect(),
                            error: String::new(),
                        }
                    }
                    Err(e) => {
                        warn!(error = %e, "prepare failed");
                        self.metrics.error("prepare", e.reason());
                        v1::NodePrepareResourceResponse { devices: vec![], error: e.to_string() }
                    }
                };
                (claim.uid, entry)
            }
            .instrument(span)
        }))
        .await;
        self.metrics
            .prepare_duration
            .observe(start.elapsed().as_secs_f64());
        self.metrics.set_prepared(self.state.checkpoint());
        v1::NodePrepareResourcesResponse {
            claims: results.into_iter().collect(),
        }
    }

    pub async fn unprepare(&self, claims: Vec<v1::Claim>) -> v1::NodeUnprepareResourcesResponse {
        let start = Instant::now();
        let results = join_all(claims.into_iter().map(|c| {
            let span = info_span!("unprepare", claimUID = %c.uid, claim = %format!("{}/{}", c.namespace, c.name));
            async move {
                let claim = ClaimRef { uid: c.uid, namespace: c.namespace, name: c.name };
                let t0 = Instant::now();
                let in_flight = self.metrics.nvidia.in_flight("unprepare");
                let result = self.state.unprepare_claim(&claim).await;
                drop(in_flight);
                let error = match result {
                    Ok(()) => {
                        info!("unprepared");
                        self.metrics.nvidia.succeeded("unprepare", t0.elapsed());
                        String::new()
                    }
                    Err(e) => {
                        warn!(error = %e, "unprepare failed");
                        self.metrics.error("unprepare", e.reason());
                        self.metrics.nvidia.failed("unprepare", e.reason());
                        e.to_string()
                    }
                };
                (claim.uid, v1::NodeUnprepareResourceResponse { error })
            }
            .instrument(span)
        }))
        .await;
        self.metrics
            .unprepare_duration
            .observe(start.elapsed().as_secs_f64());
        self.metrics.set_prepared(self.state.checkpoint());
        v1::NodeUnprepareResourcesResponse {
            claims: results.into_iter().collect(),
        }
    }
}

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        req: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        Ok(Response::new(self.prepare(req.into_inner().claims).await))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        Ok(Response::new(self.unprepare(req.into_inner().claims).await))
    }
}

/// v1beta1 is v1 without `Device.share_id`; convert at the edge and share the implementation.
#[derive(Clone)]
pub struct DraServiceV1beta1(pub DraService);

fn claims_from_beta(claims: Vec<v1beta1::Claim>) -> Vec<v1::Claim> {
    claims
        .into_iter()
        .map(|c| v1::Claim {
            namespace: c.namespace,
            uid: c.uid,
            name: c.name,
        })
        .collect()
}

#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for DraServiceV1beta1 {
    async fn node_prepare_resources(
        &self,
        req: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let resp = self
            .0
            .prepare(claims_from_beta(req.into_inner().claims))
            .await;
        let claims: HashMap<_, _> = resp
            .claims
            .into_iter()
            .map(|(uid, r)| {
                let devices = r
                    .devices
                    .into_iter()
                    .map(|d| v1beta1::Device {
                        request_names: d.request_names,
                        pool_name: d.pool_name,
                        device_name: d.device_name,
                        cdi_device_ids: d.cdi_device_ids,
                    })
                    .collect();
                (
                    uid,
                    v1beta1::NodePrepareResourceResponse {
                        devices,
                        error: r.error,
                    },
                )
            })
            .collect();
        Ok(Response::new(v1beta1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let resp = self
            .0
            .unprepare(claims_from_beta(req.into_inner().claims))
            .await;
        let claims = resp
            .claims
            .into_iter()
            .map(|(uid, r)| {
                (
                    uid,
                    v1beta1::NodeUnprepareResourceResponse { error: r.error },
                )
            })
            .collect();
        Ok(Response::new(v1beta1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}
