//! `pluginregistration.Registration`: how the kubelet's plugin watcher learns about us.
use std::sync::{Arc, Mutex};

use kubelet_proto::registration as reg;
use kubelet_proto::services;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

#[derive(Clone)]
pub struct RegistrationService {
    driver: String,
    endpoint: String,
    versions: Vec<String>,
    /// The kubelet's last verdict, for the health check and logs.
    pub status: Arc<Mutex<Option<reg::RegistrationStatus>>>,
}

impl RegistrationService {
    /// `endpoint` is the absolute path of the DRA socket.
    pub fn new(driver: &str, endpoint: &str) -> Self {
        RegistrationService {
            driver: driver.into(),
            endpoint: endpoint.into(),
            // v1 first: the kubelet takes the first entry it knows.
            versions: vec![services::DRA_V1.into(), services::DRA_V1BETA1.into()],
            status: Arc::new(Mutex::new(None)),
        }
    }

    pub fn info(&self) -> reg::PluginInfo {
        reg::PluginInfo {
            r#type: services::PLUGIN_TYPE_DRA.into(),
            name: self.driver.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: self.versions.clone(),
        }
    }
}

#[tonic::async_trait]
impl reg::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _req: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(self.info()))
    }

    async fn notify_registration_status(
        &self,
        req: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let status = req.into_inner();
        if status.plugin_registered {
            info!("registered with the kubelet");
        } else {
            warn!(error = %status.error, "the kubelet refused the registration");
        }
        let refused = (!status.plugin_registered).then(|| status.error.clone());
        *self.status.lock().expect("status lock") = Some(status);
        match refused {
            Some(e) => Err(Status::internal(format!("registration failed: {e}"))),
            None => Ok(Response::new(reg::RegistrationStatusResponse {})),
        }
    }
}
