//! `pluginregistration.Registration`: how the kubelet's plugin watcher learns about us.
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kubelet_proto::registration as reg;
use kubelet_proto::services;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::kube::events::NodeEvents;
use crate::metrics::Metrics;

/// The reason of the Node Event a refused registration becomes.
pub const REGISTRATION_FAILED: &str = "RegistrationFailed";
/// The refusal's method, for the log line.
pub const NOTIFY_METHOD: &str = "/pluginregistration.Registration/NotifyRegistrationStatus";
/// The kubelet retries a refused registration with backoff: the same refusal again within this
/// long is logged and counted, but not recorded as one more event.
const EVENT_REPEAT_AFTER: Duration = Duration::from_secs(600);

#[derive(Clone)]
pub struct RegistrationService {
    driver: String,
    endpoint: String,
    versions: Vec<String>,
    /// The kubelet's last verdict, for the health check and logs.
    pub status: Arc<Mutex<Option<reg::RegistrationStatus>>>,
    metrics: Arc<Metrics>,
    /// None offline: there is no API server to record events in.
    events: Option<Arc<dyn NodeEvents>>,
    last_event: Arc<Mutex<Option<(String, Instant)>>>,
}

impl RegistrationService {
    /// `endpoint` is the absolute path of the DRA socket.
    /// `health`: also advertise the resource health services (v1 preferred by 1.37+ kubelets).
    pub fn new(driver: &str, endpoint: &str, health: bool, metrics: Arc<Metrics>) -> Self {
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
            metrics,
            events: None,
            last_event: Arc::new(Mutex::new(None)),
        }
    }

    /// Refusals also become Warning events on this node.
    pub fn with_events(mut self, events: Option<Arc<dyn NodeEvents>>) -> Self {
        self.events = events;
        self
    }

    pub fn info(&self) -> reg::PluginInfo {
        reg::PluginInfo {
            r#type: services::PLUGIN_TYPE_DRA.into(),
            name: self.driver.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: self.versions.clone(),
        }
    }

    /// The kubelet's refusal is the only place its reason reaches us; an operator must see it
    /// without reading the kubelet's log.
    fn refused(&self, error: &str) {
        self.metrics.registration_refused.inc();
        warn!(
            socket = "registration",
            method = NOTIFY_METHOD,
            driver = self.driver.as_str(),
            error,
            "the kubelet refused the registration"
        );
        let Some(events) = &self.events else { return };
        let now = Instant::now();
        let mut last = self.last_event.lock().expect("last event lock");
        if last
            .as_ref()
            .is_some_and(|(e, at)| e == error && now.duration_since(*at) < EVENT_REPEAT_AFTER)
        {
            return;
        }
        *last = Some((error.to_string(), now));
        events.warning(
            REGISTRATION_FAILED,
            "Register",
            format!(
                "the kubelet refused to register DRA driver {}: {error}",
                self.driver
            ),
        );
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
            info!(driver = self.driver.as_str(), "registered with the kubelet");
        } else {
            self.refused(&status.error);
        }
        let refused = (!status.plugin_registered).then(|| status.error.clone());
        *self.status.lock().expect("status lock") = Some(status);
        // An error back, as the Go kubeletplugin helper answers; the kubelet only logs it.
        match refused {
            Some(e) => Err(Status::internal(format!("registration failed: {e}"))),
            None => Ok(Response::new(reg::RegistrationStatusResponse {})),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reg::registration_server::Registration;
    use tonic::server::NamedService;

    #[derive(Default)]
    struct Recorded(Mutex<Vec<(&'static str, &'static str, String)>>);

    impl NodeEvents for Recorded {
        fn warning(&self, reason: &'static str, action: &'static str, message: String) {
            self.0.lock().unwrap().push((reason, action, message));
        }
    }

    async fn notify(s: &RegistrationService, registered: bool, error: &str) -> bool {
        s.notify_registration_status(Request::new(reg::RegistrationStatus {
            plugin_registered: registered,
            error: error.into(),
        }))
        .await
        .is_ok()
    }

    fn refusals(m: &Metrics) -> u64 {
        m.registration_refused.get()
    }

    #[test]
    fn the_logged_method_is_the_services_own() {
        let name = <reg::registration_server::RegistrationServer<RegistrationService> as NamedService>::NAME;
        assert_eq!(NOTIFY_METHOD, format!("/{name}/NotifyRegistrationStatus"));
    }

    #[tokio::test]
    async fn a_refusal_is_counted_and_becomes_one_node_event_per_distinct_reason() {
        let metrics = Arc::new(Metrics::new());
        let events = Arc::new(Recorded::default());
        let s = RegistrationService::new("gpu.nvidia.com", "/p/dra.sock", false, metrics.clone())
            .with_events(Some(events.clone()));

        assert!(notify(&s, true, "").await);
        assert_eq!(refusals(&metrics), 0);
        assert!(events.0.lock().unwrap().is_empty());

        assert!(!notify(&s, false, "version 9 is not supported").await);
        assert_eq!(refusals(&metrics), 1);
        {
            let recorded = events.0.lock().unwrap();
            assert_eq!(recorded.len(), 1);
            let (reason, action, message) = &recorded[0];
            assert_eq!((*reason, *action), ("RegistrationFailed", "Register"));
            assert_eq!(
                message,
                "the kubelet refused to register DRA driver gpu.nvidia.com: version 9 is not supported"
            );
        }
        assert!(
            metrics
                .encode()
                .contains("gpu_dra_registration_refused_total 1")
        );

        // The kubelet's retry of the same refusal: counted, not another event.
        assert!(!notify(&s, false, "version 9 is not supported").await);
        assert_eq!(refusals(&metrics), 2);
        assert_eq!(events.0.lock().unwrap().len(), 1);
        // A different reason is news.
        assert!(!notify(&s, false, "name clash").await);
        assert_eq!(events.0.lock().unwrap().len(), 2);
        let last = s.status.lock().unwrap().clone().unwrap();
        assert!(!last.plugin_registered);
    }

    #[tokio::test]
    async fn offline_a_refusal_is_still_counted() {
        let metrics = Arc::new(Metrics::new());
        let s = RegistrationService::new("gpu.nvidia.com", "/p/dra.sock", false, metrics.clone());
        assert!(!notify(&s, false, "no").await);
        assert_eq!(refusals(&metrics), 1);
    }
}
