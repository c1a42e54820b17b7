//! `DRAResourceHealth.NodeWatchResources` (v1alpha1 for kubelets 1.34-1.36, v1 for 1.37+): the
//! health of every prepared device, as a full snapshot on every change and as a heartbeat.
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::Stream;
use kubelet_proto::{health_v1 as v1, health_v1alpha1 as v1alpha1};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use dra_plugin_core::checkpoint::ClaimState;
use dra_plugin_core::health::{Health, HealthTracker, gpu_of};
use dra_plugin_core::state::DeviceState;

/// Heartbeat: the kubelet marks a device Unknown when it hears nothing for its timeout (30 s).
const HEARTBEAT: Duration = Duration::from_secs(10);
const TIMEOUT_SECONDS: i64 = 60;

/// One device's line in a snapshot, version-neutral.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealthLine {
    pub pool: String,
    pub device: String,
    pub health: Health,
    pub message: String,
}

#[derive(Clone)]
pub struct HealthService {
    state: Arc<DeviceState>,
    tracker: Arc<Mutex<HealthTracker>>,
    changed: watch::Receiver<u64>,
}

impl HealthService {
    pub fn new(
        state: Arc<DeviceState>,
        tracker: Arc<Mutex<HealthTracker>>,
        changed: watch::Receiver<u64>,
    ) -> Self {
        HealthService {
            state,
            tracker,
            changed,
        }
    }

    /// Health of every device of every completed claim.
    pub fn snapshot(&self) -> Vec<DeviceHealthLine> {
        let tracker = self.tracker.lock().expect("health lock");
        let mut lines: Vec<DeviceHealthLine> = self
            .state
            .checkpoint()
            .claims()
            .values()
            .filter(|r| r.state == ClaimState::PrepareCompleted)
            .flat_map(|r| r.devices.iter())
            .map(|d| {
                let minor = gpu_of(&d.device_name);
                DeviceHealthLine {
                    pool: d.pool_name.clone(),
                    device: d.device_name.clone(),
                    health: minor.map(|m| tracker.health(m)).unwrap_or(Health::Unknown),
                    message: minor.map(|m| tracker.message(m)).unwrap_or_default(),
                }
            })
            .collect();
        lines.sort_by(|a, b| (&a.pool, &a.device).cmp(&(&b.pool, &b.device)));
        lines.dedup();
        lines
    }

    /// Sends `to(snapshot)` now, on every health change, and every heartbeat, until the kubelet
    /// hangs up.
    fn stream<T: Send + 'static>(
        &self,
        to: fn(Vec<DeviceHealthLine>) -> T,
    ) -> ReceiverStream<Result<T, Status>> {
        let (tx, rx) = mpsc::channel(4);
        let this = self.clone();
        tokio::spawn(async move {
            let mut changed = this.changed.clone();
            loop {
                if tx.send(Ok(to(this.snapshot()))).await.is_err() {
                    return;
                }
                tokio::select! {
                    r = changed.changed() => if r.is_err() { return },
                    _ = tokio::time::sleep(HEARTBEAT) => {}
                    _ = tx.closed() => return,
                }
            }
        });
        ReceiverStream::new(rx)
    }
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn truncate(message: String) -> String {
    if message.chars().count() <= 1024 {
        message
    } else {
        message.chars().take(1021).collect::<String>() + "..."
    }
}

macro_rules! health_api {
    ($ver:ident) => {
        impl HealthService {
            fn $ver(lines: Vec<DeviceHealthLine>) -> $ver::NodeWatchResourcesResponse {
                let now = now_unix();
                $ver::NodeWatchResourcesResponse {
                    devices: lines
                        .into_iter()
                        .map(|l| $ver::DeviceHealth {
                            device: Some($ver::DeviceIdentifier {
                                pool_name: l.pool,
                                device_name: l.device,
                            }),
                            health: match l.health {
                                Health::Healthy => $ver::HealthStatus::Healthy,
                                Health::Unhealthy => $ver::HealthStatus::Unhealthy,
                                Health::Unknown => $ver::HealthStatus::Unknown,
                            } as i32,
                            last_updated_time: now,
                            health_check_timeout_seconds: TIMEOUT_SECONDS,
                            message: truncate(l.message),
                        })
                        .collect(),
                }
            }
        }

        #[tonic::async_trait]
        impl $ver::dra_resource_health_server::DraResourceHealth for HealthService {
            type NodeWatchResourcesStream = Pin<
                Box<dyn Stream<Item = Result<$ver::NodeWatchResourcesResponse, Status>> + Send>,
            >;

            async fn node_watch_resources(
                &self,
                _req: Request<$ver::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                Ok(Response::new(Box::pin(self.stream(HealthService::$ver))))
            }
        }
    };
}

health_api!(v1);
health_api!(v1alpha1);
