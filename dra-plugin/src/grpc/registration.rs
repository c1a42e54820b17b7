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
    /// `health`: also advertise the resource health services (v1 preferred by 1.37+ kubelets).
    pub fn new(driver: &str, endpoint: &str, health: bool) -> Self {
        // DRA v1 first: the kubelet takes the first DRAPlugin entry it knows.
        let mut versions: Vec<String> = vec![services::DRA_V1.into(), services::DRA_V1BETA1.into()];
        if health {
            versions.push(services::HEALTH_V1.into());
            versions.push(services::HEALTH_V1ALPHA1.into());
        }
        RegistrationService {
            driver: driver.into(),
            endpoint: endpoint.into(),
            versions,
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
