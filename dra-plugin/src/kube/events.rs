//! Events on the Node object, for problems an operator must see without reading plugin logs.
use gpu_dra_api::names::PLUGIN_COMPONENT;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::Api;
use kube::api::PostParams;

/// Where this node's Warning events go. A trait so that code recording events can be tested
/// without an API server, and runs unchanged offline (where there is none).
pub trait NodeEvents: Send + Sync {
    /// Records the event in the background: the caller (a kubelet call, say) never waits on the
    /// API server. `action` is what the plugin was doing.
    fn warning(&self, reason: &'static str, action: &'static str, message: String);
}

/// Events through the API server.
pub struct ApiNodeEvents {
    pub client: kube::Client,
    pub node: String,
    pub node_uid: Option<String>,
}

impl NodeEvents for ApiNodeEvents {
    fn warning(&self, reason: &'static str, action: &'static str, message: String) {
        let (client, node, uid) = (
            self.client.clone(),
            self.node.clone(),
            self.node_uid.clone(),
        );
        tokio::spawn(async move {
            if let Err(e) =
                node_warning(&client, &node, uid.as_deref(), reason, action, &message).await
            {
                tracing::warn!(reason, error = %e, "could not record the event");
            }
        });
    }
}

pub async fn node_warning(
    client: &kube::Client,
    node: &str,
    node_uid: Option<&str>,
    reason: &str,
    action: &str,
    message: &str,
) -> Result<(), kube::Error> {
    let involved = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.into()),
        uid: node_uid.map(str::to_string),
        ..Default::default()
    };
    let what = EventKind {
        type_: "Warning",
        reason,
        action,
    };
    object_event(client, node, involved, what, message).await
}

/// An event's type (`Normal`, `Warning`), reason and the action the plugin was taking.
pub struct EventKind<'a> {
    pub type_: &'a str,
    pub reason: &'a str,
    pub action: &'a str,
}

/// Records an event on a cluster-scoped object (in `default`, where kubectl looks for those)
/// from this node's plugin.
pub async fn object_event(
    client: &kube::Client,
    node: &str,
    involved: ObjectReference,
    what: EventKind<'_>,
    message: &str,
) -> Result<(), kube::Error> {
    let EventKind {
        type_,
        reason,
        action,
    } = what;
    let now = k8s_openapi::jiff::Timestamp::now();
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", involved.name.as_deref().unwrap_or(node))),
            namespace: Some("default".into()),
            ..Default::default()
        },
        involved_object: involved,
        reason: Some(reason.into()),
        message: Some(message.chars().take(1024).collect()),
        type_: Some(type_.into()),
        source: Some(EventSource {
            component: Some(PLUGIN_COMPONENT.into()),
            host: Some(node.into()),
        }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        reporting_component: Some(PLUGIN_COMPONENT.into()),
        reporting_instance: Some(node.into()),
        action: Some(action.into()),
        count: Some(1),
        ..Default::default()
    };
    Api::<Event>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &event)
        .await
        .map(|_| ())
}
