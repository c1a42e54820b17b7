//! The kubelet's DRA manager, for one node without a container runtime.
//!
//! Discovers the plugin through its registration socket, watches pods bound to the node, prepares
//! their claims once they are reserved for the pod, checks the returned CDI IDs against the spec files
//! on disk, marks pods Running; on deletion unprepares and then force-deletes the pod.
//!
//! One file over 600 lines on purpose: the harness is one state machine (pod watch, prepare,
//! run, unprepare) whose parts share its state; only the test double's scenario uses it.
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use kubelet_proto::dra_v1::{self, dra_plugin_client::DraPluginClient};
use kubelet_proto::registration::{self, registration_client::RegistrationClient};
use kubelet_proto::services;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use crate::{DRIVER, cdi, grpc};

/// A claim as the kubelet names it in DRA calls.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl ClaimRef {
    fn to_proto(&self) -> dra_v1::Claim {
        dra_v1::Claim {
            namespace: self.namespace.clone(),
            uid: self.uid.clone(),
            name: self.name.clone(),
        }
    }
}

/// One device of a prepared claim, as NodePrepareResources returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    pub request_names: Vec<String>,
    pub pool: String,
    pub device: String,
    pub cdi_ids: Vec<String>,
}

/// What the harness did with one pod (kept after the pod is gone, for figures).
#[derive(Debug, Clone)]
pub struct PodRecord {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// When the harness first saw the pod bound to its node.
    pub seen_bound: Instant,
    /// When NodePrepareResources for all its claims had succeeded.
    pub prepared: Option<Instant>,
    pub claims: Vec<ClaimRef>,
    pub last_error: Option<String>,
    pub unprepared: bool,
}

#[derive(Default)]
struct State {
    pods: BTreeMap<String, PodRecord>,
    /// Claim UID -> pods on this node using it (a claim is prepared once, whatever the number).
    claim_users: HashMap<String, BTreeSet<String>>,
    /// Currently prepared claims.
    prepared: BTreeMap<String, (ClaimRef, Vec<PreparedDevice>)>,
    /// Claim UID -> NodePrepareResources calls that carried it.
    prepare_calls: HashMap<String, u32>,
    /// Things a real kubelet or runtime would have choked on; a scenario fails when this is not empty.
    violations: Vec<String>,
}

struct Inner {
    node: String,
    client: Client,
    registrar_dir: PathBuf,
    cdi_dir: PathBuf,
    dra: Mutex<Option<DraPluginClient<Channel>>>,
    state: Mutex<State>,
}

/// The kubelet role for one node. Stops watching when dropped.
pub struct Kubelet {
    inner: Arc<Inner>,
    task: JoinHandle<()>,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Re-watch backoff of 200 ms doubling to 2 s: a node's view recovers within seconds of an API
/// server outage (the default goes up to 30 s, which only slows the scenarios down).
#[derive(Default)]
struct QuickBackoff {
    next: Option<Duration>,
}

impl Iterator for QuickBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let d = self.next.unwrap_or(Duration::from_millis(200));
        self.next = Some((d * 2).min(Duration::from_secs(2)));
        Some(d)
    }
}

impl kube::runtime::utils::Backoff for QuickBackoff {
    fn reset(&mut self) {
        self.next = None;
    }
}

fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        || matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
}

impl Kubelet {
    /// Registers the node's plugin (waiting up to `wait` for its registration socket) and starts
    /// watching the node's pods.
    pub async fn start(
        client: Client,
        node: &str,
        registrar_dir: &Path,
        cdi_dir: &Path,
        wait: Duration,
    ) -> Result<Kubelet> {
        let inner = Arc::new(Inner {
            node: node.to_string(),
            client,
            registrar_dir: registrar_dir.to_path_buf(),
            cdi_dir: cdi_dir.to_path_buf(),
            dra: Mutex::new(None),
            state: Mutex::new(State::default()),
        });
        inner.register(wait).await?;
        let task = tokio::spawn(inner.clone().watch_pods());
        Ok(Kubelet { inner, task })
    }

    /// Discovers the plugin again (after a plugin restart), as the kubelet's plugin watcher does when
    /// the registration socket reappears.
    pub async fn reregister(&self, wait: Duration) -> Result<registration::PluginInfo> {
        self.inner.register(wait).await
    }

    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// A DRA client for the registered plugin endpoint.
    pub fn dra_client(&self) -> Result<DraPluginClient<Channel>> {
        self.inner.dra_client()
    }

    pub fn records(&self) -> Vec<PodRecord> {
        self.inner
            .state
            .lock()
            .unwrap()
            .pods
            .values()
            .cloned()
            .collect()
    }

    pub fn record_of(&self, pod_uid: &str) -> Option<PodRecord> {
        self.inner.state.lock().unwrap().pods.get(pod_uid).cloned()
    }

    /// Currently prepared claims: UID -> (claim, devices).
    pub fn prepared(&self) -> BTreeMap<String, (ClaimRef, Vec<PreparedDevice>)> {
        self.inner.state.lock().unwrap().prepared.clone()
    }

    /// How often each claim UID was sent in NodePrepareResources by this harness.
    pub fn prepare_calls(&self) -> HashMap<String, u32> {
        self.inner.state.lock().unwrap().prepare_calls.clone()
    }

    pub fn violations(&self) -> Vec<String> {
        self.inner.state.lock().unwrap().violations.clone()
    }

    pub fn cdi_dir(&self) -> &Path {
        &self.inner.cdi_dir
    }
}

impl Inner {
    fn violation(&self, msg: String) {
        tracing::error!(node = %self.node, "{msg}");
        self.state.lock().unwrap().violations.push(msg);
    }

    fn dra_client(&self) -> Result<DraPluginClient<Channel>> {
        self.dra
            .lock()
            .unwrap()
            .clone()
            .ok_or_else(|| anyhow!("plugin on {} not registered", self.node))
    }

    async fn register(&self, wait: Duration) -> Result<registration::PluginInfo> {
        let deadline = Instant::now() + wait;
        let mut last_err = anyhow!("no registration socket in {}", self.registrar_dir.display());
        loop {
            match self.try_register().await {
                Ok(info) => return Ok(info),
                Err(e) => last_err = e,
            }
            if Instant::now() > deadline {
                return Err(
                    last_err.context(format!("registering the plugin of node {}", self.node))
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn try_register(&self) -> Result<registration::PluginInfo> {
        let mut socks: Vec<PathBuf> = std::fs::read_dir(&self.registrar_dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "sock"))
            .collect();
        socks.sort();
        ensure!(
            !socks.is_empty(),
            "no *.sock in {}",
            self.registrar_dir.display()
        );
        let mut errors = Vec::new();
        for sock in socks {
            let mut reg = RegistrationClient::new(grpc::uds_channel(&sock));
            let info = match reg.get_info(registration::InfoRequest {}).await {
                Ok(r) => r.into_inner(),
                Err(e) => {
                    errors.push(format!("{}: GetInfo: {e}", sock.display()));
                    continue;
                }
            };
            if info.r#type != services::PLUGIN_TYPE_DRA || info.name != DRIVER {
                errors.push(format!("{}: not ours: {info:?}", sock.display()));
                continue;
            }
            let problem = if !Path::new(&info.endpoint).is_absolute() {
                Some(format!(
                    "endpoint {:?} is not an absolute path",
                    info.endpoint
                ))
            } else if !info
                .supported_versions
                .iter()
                .any(|v| v == services::DRA_V1)
            {
                Some(format!(
                    "supported_versions {:?} lacks {}",
                    info.supported_versions,
                    services::DRA_V1
                ))
            } else {
                None
            };
            let status = registration::RegistrationStatus {
                plugin_registered: problem.is_none(),
                error: problem.clone().unwrap_or_default(),
            };
            reg.notify_registration_status(status)
                .await
                .with_context(|| format!("{}: NotifyRegistrationStatus", sock.display()))?;
            if let Some(p) = problem {
                bail!("{}: {p}", sock.display());
            }
            let client = DraPluginClient::new(grpc::uds_channel(Path::new(&info.endpoint)));
            *self.dra.lock().unwrap() = Some(client);
            tracing::info!(node = %self.node, endpoint = %info.endpoint, "plugin registered");
            return Ok(info);
        }
        bail!("{}", errors.join("; "))
    }

    async fn watch_pods(self: Arc<Self>) {
        let api: Api<Pod> = Api::all(self.client.clone());
        let cfg = watcher::Config::default().fields(&format!("spec.nodeName={}", self.node));
        let mut stream = watcher::watcher(api, cfg)
            .backoff(QuickBackoff::default())
            .boxed();
        let mut workers: HashMap<String, watch::Sender<Option<Pod>>> = HashMap::new();
        let mut relisted: Option<HashSet<String>> = None;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(Event::Init) => relisted = Some(HashSet::new()),
                Ok(Event::InitApply(pod)) => {
                    if let Some(seen) = relisted.as_mut() {
                        seen.insert(pod.uid().unwrap_or_default());
                    }
                    self.dispatch(&mut workers, pod);
                }
                Ok(Event::InitDone) => {
                    // Pods that vanished while the watch was down never get a Delete event.
                    if let Some(seen) = relisted.take() {
                        workers.retain(|uid, tx| {
                            if seen.contains(uid) {
                                true
                            } else {
                                tx.send_replace(None);
                                false
                            }
                        });
                    }
                }
                Ok(Event::Apply(pod)) => self.dispatch(&mut workers, pod),
                Ok(Event::Delete(pod)) => {
                    if let Some(tx) = workers.remove(&pod.uid().unwrap_or_default()) {
                        tx.send_replace(None);
                    }
                }
                Err(e) => tracing::warn!(node = %self.node, "pod watch: {e}"),
            }
        }
    }

    fn dispatch(
        self: &Arc<Self>,
        workers: &mut HashMap<String, watch::Sender<Option<Pod>>>,
        pod: Pod,
    ) {
        let uid = pod.uid().unwrap_or_default();
        if let Some(tx) = workers.get(&uid) {
            tx.send_replace(Some(pod));
            return;
        }
        let (tx, rx) = watch::channel(Some(pod));
        workers.insert(uid.clone(), tx);
        tokio::spawn(self.clone().pod_worker(uid, rx));
    }

    /// The life of one pod on this node.
    async fn pod_worker(self: Arc<Self>, uid: String, mut rx: watch::Receiver<Option<Pod>>) {
        let Some(first) = rx.borrow().clone() else {
            return;
        };
        if is_terminating(&first) && !self.state.lock().unwrap().pods.contains_key(&uid) {
            // Already on its way out when we first saw it (a relist): nothing of ours to undo.
            self.release_pod(&first).await;
            return;
        }
        self.state.lock().unwrap().pods.insert(
            uid.clone(),
            PodRecord {
                namespace: first.namespace().unwrap_or_default(),
                name: first.name_any(),
                uid: uid.clone(),
                seen_bound: Instant::now(),
                prepared: None,
                claims: Vec::new(),
                last_error: None,
                unprepared: false,
            },
        );

        // Prepare, retrying like SyncPod does, until it works or the pod goes.
        let mut attempted: Vec<ClaimRef> = Vec::new();
        let mut prepared: Option<Vec<ClaimRef>> = None;
        let mut last_pod = first;
        loop {
            let current = rx.borrow_and_update().clone();
            let Some(pod) = current else { break };
            last_pod = pod.clone();
            if is_terminating(&pod) {
                break;
            }
            match self.prepare_pod(&pod, &mut attempted).await {
                Ok(claims) => {
                    let mut st = self.state.lock().unwrap();
                    if let Some(r) = st.pods.get_mut(&uid) {
                        r.prepared = Some(Instant::now());
                        r.claims = claims.clone();
                        r.last_error = None;
                    }
                    prepared = Some(claims);
                    break;
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    tracing::debug!(node = %self.node, pod = %pod.name_any(), "prepare: {msg}");
                    if let Some(r) = self.state.lock().unwrap().pods.get_mut(&uid) {
                        r.last_error = Some(msg);
                    }
                    tokio::select! {
                        _ = rx.changed() => {}
                        _ = tokio::time::sleep(Duration::from_millis(300)) => {}
                    }
                }
            }
        }

        if prepared.is_some() {
            self.mark_running(&last_pod, &mut rx).await;
            // Wait for the pod to be deleted (or to vanish).
            loop {
                {
                    let cur = rx.borrow_and_update();
                    match &*cur {
                        None => break,
                        Some(p) if is_terminating(p) => break,
                        Some(_) => {}
                    }
                }
                if rx.changed().await.is_err() {
                    break;
                }
            }
        }

        // Unprepare before the pod may go, so the claim is not deallocated under a prepared device.
        let claims = prepared.unwrap_or(attempted);
        self.unprepare_pod(&uid, &claims).await;
        if let Some(r) = self.state.lock().unwrap().pods.get_mut(&uid) {
            r.unprepared = true;
        }
        let still_there = rx.borrow().clone();
        if let Some(pod) = still_there {
            self.release_pod(&pod).await;
        }
    }

    /// The claim names of a pod: its spec's claims (resolved through its status for templates) and
    /// the claim the scheduler made for DRA-backed extended resources. `true` marks generated claims.
    fn claim_names(pod: &Pod) -> Result<Vec<(String, bool)>> {
        let mut out = Vec::new();
        let status = pod.status.as_ref();
        for pc in pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .into_iter()
            .flatten()
        {
            if let Some(n) = &pc.resource_claim_name {
                out.push((n.clone(), false));
            } else if pc.resource_claim_template_name.is_some() {
                let st = status
                    .and_then(|s| s.resource_claim_statuses.as_ref())
                    .and_then(|l| l.iter().find(|s| s.name == pc.name))
                    .ok_or_else(|| {
                        anyhow!(
                            "pod claim {}: no entry in status.resourceClaimStatuses yet",
                            pc.name
                        )
                    })?;
                if let Some(n) = &st.resource_claim_name {
                    out.push((n.clone(), true));
                }
            }
        }
        if let Some(ext) = status.and_then(|s| s.extended_resource_claim_status.as_ref()) {
            out.push((ext.resource_claim_name.clone(), true));
        }
        Ok(out)
    }

    async fn prepare_pod(&self, pod: &Pod, attempted: &mut Vec<ClaimRef>) -> Result<Vec<ClaimRef>> {
        let ns = pod.namespace().unwrap_or_default();
        let pod_uid = pod.uid().unwrap_or_default();
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &ns);
        let mut refs = Vec::new();
        let mut to_prepare: Vec<(ClaimRef, Vec<DeviceRequestAllocationResult>)> = Vec::new();
        for (name, generated) in Self::claim_names(pod)? {
            let claim = api
                .get(&name)
                .await
                .with_context(|| format!("getting claim {ns}/{name}"))?;
            let cref = ClaimRef {
                namespace: ns.clone(),
                name: name.clone(),
                uid: claim.uid().unwrap_or_default(),
            };
            if generated {
                let owned = claim
                    .owner_references()
                    .iter()
                    .any(|o| o.uid == pod_uid && o.controller == Some(true));
                ensure!(owned, "claim {name} is not owned by pod {}", pod.name_any());
            }
            let status = claim.status.as_ref();
            let reserved = status
                .and_then(|s| s.reserved_for.as_ref())
                .is_some_and(|r| r.iter().any(|c| c.resource == "pods" && c.uid == pod_uid));
            ensure!(
                reserved,
                "claim {name} is not reserved for pod {} yet",
                pod.name_any()
            );
            let alloc = status
                .and_then(|s| s.allocation.as_ref())
                .ok_or_else(|| anyhow!("claim {name} reserved but not allocated"))?;
            let ours: Vec<DeviceRequestAllocationResult> = alloc
                .devices
                .as_ref()
                .and_then(|d| d.results.as_ref())
                .map(|r| r.iter().filter(|r| r.driver == DRIVER).cloned().collect())
                .unwrap_or_default();
            if ours.is_empty() {
                continue;
            }
            refs.push(cref.clone());
            let already = self.state.lock().unwrap().prepared.contains_key(&cref.uid);
            if !already {
                to_prepare.push((cref, ours));
            }
        }

        if !to_prepare.is_empty() {
            for (c, _) in &to_prepare {
                if !attempted.contains(c) {
                    attempted.push(c.clone());
                }
            }
            let req = dra_v1::NodePrepareResourcesRequest {
                claims: to_prepare.iter().map(|(c, _)| c.to_proto()).collect(),
            };
            {
                let mut st = self.state.lock().unwrap();
                for (c, _) in &to_prepare {
                    *st.prepare_calls.entry(c.uid.clone()).or_default() += 1;
                }
            }
            let mut client = self.dra_client()?;
            let resp = client
                .node_prepare_resources(req)
                .await
                .map_err(|s| anyhow!("NodePrepareResources: {s}"))?
                .into_inner();
            let mut results = Vec::new();
            for (c, alloc) in &to_prepare {
                let r = resp
                    .claims
                    .get(&c.uid)
                    .ok_or_else(|| anyhow!("NodePrepareResources skipped claim {}", c.name))?;
                ensure!(
                    r.error.is_empty(),
                    "NodePrepareResources for claim {}: {}",
                    c.name,
                    r.error
                );
                let devices: Vec<PreparedDevice> = r
                    .devices
                    .iter()
                    .map(|d| PreparedDevice {
                        request_names: d.request_names.clone(),
                        pool: d.pool_name.clone(),
                        device: d.device_name.clone(),
                        cdi_ids: d.cdi_device_ids.clone(),
                    })
                    .collect();
                self.check_prepared(c, alloc, &devices);
                results.push((c.clone(), devices));
            }
            let mut st = self.state.lock().unwrap();
            for (c, devices) in results {
                st.prepared.insert(c.uid.clone(), (c, devices));
            }
        }
        let mut st = self.state.lock().unwrap();
        for c in &refs {
            st.claim_users
                .entry(c.uid.clone())
                .or_default()
                .insert(pod_uid.clone());
        }
        Ok(refs)
    }

    /// What a runtime and the kubelet rely on: the devices are the allocated ones, and every CDI ID
    /// resolves in a spec file on disk.
    fn check_prepared(
        &self,
        c: &ClaimRef,
        alloc: &[DeviceRequestAllocationResult],
        devices: &[PreparedDevice],
    ) {
        let allocated: BTreeSet<(String, String)> = alloc
            .iter()
            .map(|r| (r.pool.clone(), r.device.clone()))
            .collect();
        let returned: BTreeSet<(String, String)> = devices
            .iter()
            .map(|d| (d.pool.clone(), d.device.clone()))
            .collect();
        if allocated != returned {
            self.violation(format!(
                "claim {}: prepared devices {returned:?} differ from the allocation {allocated:?}",
                c.name
            ));
        }
        for d in devices {
            let r = alloc
                .iter()
                .find(|r| r.pool == d.pool && r.device == d.device);
            if let Some(r) = r {
                let base = r.request.split('/').next().unwrap_or_default();
                if !d.request_names.iter().any(|n| n == &r.request || n == base) {
                    self.violation(format!(
                        "claim {}: device {} has request_names {:?}, allocated for request {}",
                        c.name, d.device, d.request_names, r.request
                    ));
                }
            }
            if d.cdi_ids.is_empty() {
                self.violation(format!(
                    "claim {}: device {} has no CDI device IDs",
                    c.name, d.device
                ));
            }
        }
        let specs = match cdi::load(&self.cdi_dir) {
            Ok(s) => s,
            Err(e) => {
                self.violation(format!("claim {}: unreadable CDI specs: {e:#}", c.name));
                return;
            }
        };
        for id in devices.iter().flat_map(|d| &d.cdi_ids) {
            if !cdi::is_qualified(id) {
                self.violation(format!(
                    "claim {}: CDI ID {id:?} is not vendor/class=name",
                    c.name
                ));
            } else if !specs.contains_key(id) {
                self.violation(format!(
                    "claim {}: CDI ID {id} is not defined in any spec in {}",
                    c.name,
                    self.cdi_dir.display()
                ));
            }
        }
    }

    async fn unprepare_pod(&self, pod_uid: &str, claims: &[ClaimRef]) {
        let mut to_unprepare = Vec::new();
        {
            let mut st = self.state.lock().unwrap();
            for c in claims {
                let last = match st.claim_users.get_mut(&c.uid) {
                    Some(users) => {
                        users.remove(pod_uid);
                        users.is_empty()
                    }
                    None => true,
                };
                if last {
                    st.claim_users.remove(&c.uid);
                    to_unprepare.push(c.clone());
                }
            }
        }
        if to_unprepare.is_empty() {
            return;
        }
        let mut last_err = String::new();
        for attempt in 0..60 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            let mut client = match self.dra_client() {
                Ok(c) => c,
                Err(e) => {
                    last_err = e.to_string();
                    continue;
                }
            };
            let req = dra_v1::NodeUnprepareResourcesRequest {
                claims: to_unprepare.iter().map(ClaimRef::to_proto).collect(),
            };
            match client.node_unprepare_resources(req).await {
                Err(s) => last_err = format!("NodeUnprepareResources: {s}"),
                Ok(resp) => {
                    let resp = resp.into_inner();
                    let errors: Vec<String> = to_unprepare
                        .iter()
                        .filter_map(|c| match resp.claims.get(&c.uid) {
                            None => Some(format!("claim {} skipped", c.name)),
                            Some(r) if !r.error.is_empty() => {
                                Some(format!("claim {}: {}", c.name, r.error))
                            }
                            Some(_) => None,
                        })
                        .collect();
                    if errors.is_empty() {
                        let mut removed = Vec::new();
                        {
                            let mut st = self.state.lock().unwrap();
                            for c in &to_unprepare {
                                if let Some((_, devs)) = st.prepared.remove(&c.uid) {
                                    removed.push((c.clone(), devs));
                                }
                            }
                        }
                        self.check_unprepared(&removed);
                        return;
                    }
                    last_err = errors.join("; ");
                }
            }
        }
        self.violation(format!(
            "unprepare of {to_unprepare:?} kept failing: {last_err}"
        ));
    }

    /// After unprepare, the claim's CDI devices must be gone from disk.
    fn check_unprepared(&self, removed: &[(ClaimRef, Vec<PreparedDevice>)]) {
        let specs = match cdi::load(&self.cdi_dir) {
            Ok(s) => s,
            Err(e) => {
                self.violation(format!("unreadable CDI specs after unprepare: {e:#}"));
                return;
            }
        };
        for (c, devs) in removed {
            for id in devs.iter().flat_map(|d| &d.cdi_ids) {
                if specs.contains_key(id) {
                    self.violation(format!(
                        "claim {}: CDI ID {id} still defined after unprepare",
                        c.name
                    ));
                }
            }
        }
    }

    async fn mark_running(&self, pod: &Pod, rx: &mut watch::Receiver<Option<Pod>>) {
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let patch = serde_json::json!({
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": "Initialized", "status": "True"},
                    {"type": "ContainersReady", "status": "True"},
                    {"type": "Ready", "status": "True"},
                ],
            }
        });
        for _ in 0..240 {
            match api
                .patch_status(
                    &pod.name_any(),
                    &PatchParams::default(),
                    &Patch::Strategic(&patch),
                )
                .await
            {
                Ok(_) => return,
                Err(kube::Error::Api(s)) if s.code == 404 => return,
                Err(e) => {
                    tracing::warn!(node = %self.node, pod = %pod.name_any(), "marking Running: {e}")
                }
            }
            if rx.borrow().as_ref().is_none_or(is_terminating) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        self.violation(format!("could not mark pod {} Running", pod.name_any()));
    }

    /// Lets the pod object go, like the kubelet's final status sync: delete with grace 0.
    async fn release_pod(&self, pod: &Pod) {
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        for _ in 0..240 {
            match api.delete(&pod.name_any(), &dp).await {
                Ok(_) => return,
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return,
                Err(e) => tracing::warn!(node = %self.node, pod = %pod.name_any(), "deleting: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        self.violation(format!("could not delete pod {}", pod.name_any()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn claim_names_resolve_direct_template_and_extended() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {
                "containers": [{"name": "c"}],
                "resourceClaims": [
                    {"name": "a", "resourceClaimName": "shared"},
                    {"name": "b", "resourceClaimTemplateName": "t"},
                    {"name": "c", "resourceClaimTemplateName": "t"},
                ],
            },
            "status": {
                "resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-xyz"}, {"name": "c"}],
                "extendedResourceClaimStatus": {"resourceClaimName": "p-ext", "requestMappings": []},
            },
        }));
        let names = Inner::claim_names(&p).unwrap();
        assert_eq!(
            names,
            vec![
                ("shared".to_string(), false),
                ("p-b-xyz".to_string(), true),
                ("p-ext".to_string(), true)
            ]
        );
    }

    #[test]
    fn template_claim_without_status_is_not_ready() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c"}],
                     "resourceClaims": [{"name": "b", "resourceClaimTemplateName": "t"}]},
        }));
        assert!(Inner::claim_names(&p).is_err());
    }

    #[test]
    fn terminating_pods() {
        let running =
            pod(serde_json::json!({"metadata": {"name": "p"}, "status": {"phase": "Running"}}));
        let done =
            pod(serde_json::json!({"metadata": {"name": "p"}, "status": {"phase": "Succeeded"}}));
        let deleted = pod(
            serde_json::json!({"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"}}),
        );
        assert!(!is_terminating(&running));
        assert!(is_terminating(&done));
        assert!(is_terminating(&deleted));
    }
}
