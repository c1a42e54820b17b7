//! A minimal in-process DRA driver used only to test the kubelet-role harness itself (scenario s0):
//! it registers like a plugin, prepares by writing one CDI spec per claim and unprepares by removing
//! it. It publishes nothing; the scenario creates the ResourceSlice by hand.
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::{Api, Client};
use kubelet_proto::dra_v1::{self, dra_plugin_server};
use kubelet_proto::registration::{self, registration_server};
use tokio::net::UnixListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

pub struct Double {
    tasks: Vec<JoinHandle<()>>,
    pub prepares: Arc<Mutex<Vec<String>>>,
}

impl Drop for Double {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

struct Reg {
    endpoint: PathBuf,
}

#[tonic::async_trait]
impl registration_server::Registration for Reg {
    async fn get_info(
        &self,
        _: Request<registration::InfoRequest>,
    ) -> Result<Response<registration::PluginInfo>, Status> {
        Ok(Response::new(registration::PluginInfo {
            r#type: "DRAPlugin".into(),
            name: e2e::DRIVER.into(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: vec!["v1.DRAPlugin".into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        r: Request<registration::RegistrationStatus>,
    ) -> Result<Response<registration::RegistrationStatusResponse>, Status> {
        if !r.get_ref().plugin_registered {
            return Err(Status::failed_precondition(r.into_inner().error));
        }
        Ok(Response::new(registration::RegistrationStatusResponse {}))
    }
}

struct Dra {
    client: Client,
    cdi: PathBuf,
    prepares: Arc<Mutex<Vec<String>>>,
}

impl Dra {
    fn spec_path(&self, uid: &str) -> PathBuf {
        self.cdi
            .join(format!("k8s.gpu.nvidia.com-claim_{uid}.json"))
    }

    async fn prepare_one(&self, c: &dra_v1::Claim) -> anyhow::Result<Vec<dra_v1::Device>> {
        let claim = Api::<ResourceClaim>::namespaced(self.client.clone(), &c.namespace)
            .get(&c.name)
            .await?;
        anyhow::ensure!(
            claim.metadata.uid.as_deref() == Some(c.uid.as_str()),
            "uid mismatch"
        );
        let results = claim
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .unwrap_or_default();
        let mut devices = Vec::new();
        let mut cdi_devices = Vec::new();
        for r in results.iter().filter(|r| r.driver == e2e::DRIVER) {
            let name = format!("{}-{}", c.uid, r.device);
            cdi_devices.push(serde_json::json!({"name": name, "containerEdits": {
                "env": [format!("NVIDIA_VISIBLE_DEVICES=GPU-{}", r.device)]}}));
            devices.push(dra_v1::Device {
                request_names: vec![r.request.clone()],
                pool_name: r.pool.clone(),
                device_name: r.device.clone(),
                cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim={name}")],
                share_id: None,
            });
        }
        let spec = serde_json::json!({"cdiVersion": "0.6.0", "kind": "k8s.gpu.nvidia.com/claim", "devices": cdi_devices});
        std::fs::write(self.spec_path(&c.uid), serde_json::to_vec(&spec)?)?;
        self.prepares.lock().unwrap().push(c.uid.clone());
        Ok(devices)
    }
}

#[tonic::async_trait]
impl dra_plugin_server::DraPlugin for Dra {
    async fn node_prepare_resources(
        &self,
        r: Request<dra_v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra_v1::NodePrepareResourcesResponse>, Status> {
        let mut resp = dra_v1::NodePrepareResourcesResponse::default();
        for c in &r.get_ref().claims {
            let entry = match self.prepare_one(c).await {
                Ok(devices) => dra_v1::NodePrepareResourceResponse {
                    devices,
                    error: String::new(),
                },
                Err(e) => dra_v1::NodePrepareResourceResponse {
                    devices: vec![],
                    error: format!("{e:#}"),
                },
            };
            resp.claims.insert(c.uid.clone(), entry);
        }
        Ok(Response::new(resp))
    }

    async fn node_unprepare_resources(
        &self,
        r: Request<dra_v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra_v1::NodeUnprepareResourcesResponse>, Status> {
        let mut resp = dra_v1::NodeUnprepareResourcesResponse::default();
        for c in &r.get_ref().claims {
            let error = match std::fs::remove_file(self.spec_path(&c.uid)) {
                Ok(()) => String::new(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(e) => e.to_string(),
            };
            resp.claims.insert(
                c.uid.clone(),
                dra_v1::NodeUnprepareResourceResponse { error },
            );
        }
        Ok(Response::new(resp))
    }
}

fn listen(path: &Path) -> anyhow::Result<UnixListenerStream> {
    let _ = std::fs::remove_file(path);
    Ok(UnixListenerStream::new(UnixListener::bind(path)?))
}

/// Serves registration in `registrar`, DRA in `plugin_dir`, writing CDI specs into `cdi`.
pub fn start(
    client: Client,
    registrar: &Path,
    plugin_dir: &Path,
    cdi: &Path,
) -> anyhow::Result<Double> {
    let endpoint = plugin_dir.join("dra.sock");
    let prepares = Arc::new(Mutex::new(Vec::new()));
    let dra = Dra {
        client,
        cdi: cdi.to_path_buf(),
        prepares: prepares.clone(),
    };
    let dra_incoming = listen(&endpoint)?;
    let reg_incoming = listen(&registrar.join("gpu.nvidia.com-reg.sock"))?;
    let t1 = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(dra_plugin_server::DraPluginServer::new(dra))
            .serve_with_incoming(dra_incoming)
            .await;
    });
    let t2 = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(registration_server::RegistrationServer::new(Reg {
                endpoint,
            }))
            .serve_with_incoming(reg_incoming)
            .await;
    });
    Ok(Double {
        tasks: vec![t1, t2],
        prepares,
    })
}
