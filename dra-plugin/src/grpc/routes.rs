//! Which gRPC service answers a call on the DRA socket, by the service name in its path.
use std::convert::Infallible;

use hyper::body::Incoming;
use kubelet_proto::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1};
use tonic::codegen::{BoxFuture, Service};
use tonic::server::NamedService;

use crate::grpc::dra::{DraService, DraServiceV1beta1};
use crate::grpc::health::HealthService;

type V1 = dra_v1::dra_plugin_server::DraPluginServer<DraService>;
type V1beta1 = dra_v1beta1::dra_plugin_server::DraPluginServer<DraServiceV1beta1>;
type HealthV1 = health_v1::dra_resource_health_server::DraResourceHealthServer<HealthService>;
type HealthV1alpha1 =
    health_v1alpha1::dra_resource_health_server::DraResourceHealthServer<HealthService>;

/// The DRA socket's services: both DRA versions, and both health versions when health is served.
#[derive(Clone)]
pub struct DraRoutes {
    v1: V1,
    v1beta1: V1beta1,
    health: Option<(HealthV1, HealthV1alpha1)>,
}

impl DraRoutes {
    pub fn new(service: DraService, health: Option<HealthService>) -> Self {
        Self {
            v1: V1::new(service.clone()),
            v1beta1: V1beta1::new(DraServiceV1beta1(service)),
            health: health.map(|h| (HealthV1::new(h.clone()), HealthV1alpha1::new(h))),
        }
    }
}

/// Whether `path` (`/<package>.<Service>/<Method>`) names a method of `S`.
fn serves<S: NamedService>(path: &str) -> bool {
    path.strip_prefix('/')
        .and_then(|p| p.strip_prefix(S::NAME))
        .is_some_and(|rest| rest.starts_with('/'))
}

type Response = http::Response<tonic::body::Body>;

impl hyper::service::Service<http::Request<Incoming>> for DraRoutes {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<Response, Infallible>;

    // The generated servers are always ready (they hold only an Arc of the service), so calling
    // a clone without polling readiness first is what a tower wrapper would do too.
    fn call(&self, req: http::Request<Incoming>) -> Self::Future {
        let path = req.uri().path();
        if serves::<V1>(path) {
            return self.v1.clone().call(req);
        }
        if serves::<V1beta1>(path) {
            return self.v1beta1.clone().call(req);
        }
        if let Some((v1, v1alpha1)) = &self.health {
            if serves::<HealthV1>(path) {
                return v1.clone().call(req);
            }
            if serves::<HealthV1alpha1>(path) {
                return v1alpha1.clone().call(req);
            }
        }
        Box::pin(std::future::ready(Ok(tonic::Status::unimplemented(
            format!("no service serves {path} on this socket"),
        )
        .into_http())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_names_a_service_only_up_to_the_method() {
        let name = <V1 as NamedService>::NAME;
        assert!(serves::<V1>(&format!("/{name}/NodePrepareResources")));
        assert!(!serves::<V1>(&format!("/{name}X/NodePrepareResources")));
        assert!(!serves::<V1>(&format!("{name}/NodePrepareResources")));
        assert!(!serves::<V1>(&format!("/{name}")));
        assert!(!serves::<V1beta1>(&format!("/{name}/NodePrepareResources")));
    }
}
