//! Applies or prunes the DCGM exporter objects (`spec.dcgmExporter`, see `render::dcgm_*`).
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::Client;
use kube::api::{Api, Patch};

use super::apply::{apply, delete, params};
use super::error::Result;
use super::render::{self, DCGM_EXPORTER, Target};

/// Brings the exporter to what the spec says: namespace label first (the API server checks it when
/// the DaemonSet controller creates each pod's claim), then template, DaemonSet and Service.
pub async fn converge(client: &Client, t: &Target<'_>) -> Result<()> {
    let Some(spec) = render::enabled_exporter(t) else {
        return prune(client, t.namespace).await.map(|_| ());
    };
    label_namespace(client, t.namespace, true).await?;
    let ns = t.namespace;
    apply(
        &Api::<ResourceClaimTemplate>::namespaced(client.clone(), ns),
        &render::dcgm_claim_template(t)?,
    )
    .await?;
    apply(
        &Api::<DaemonSet>::namespaced(client.clone(), ns),
        &render::dcgm_exporter_daemonset(t, spec)?,
    )
    .await?;
    apply(
        &Api::<Service>::namespaced(client.clone(), ns),
        &render::dcgm_exporter_service(t)?,
    )
    .await?;
    Ok(())
}

/// Deletes the exporter; `true` while its DaemonSet (and so its pods' admin claims) still exists.
/// The template is applied first and deleted last, so without it there is nothing to prune: one
/// read per reconcile while the exporter is off. The namespace label goes with the template.
pub async fn prune(client: &Client, ns: &str) -> Result<bool> {
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), ns);
    if templates.get_opt(DCGM_EXPORTER).await?.is_none() {
        return Ok(false);
    }
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    let left = delete(&daemonsets, DCGM_EXPORTER).await?;
    delete(
        &Api::<Service>::namespaced(client.clone(), ns),
        DCGM_EXPORTER,
    )
    .await?;
    if left {
        return Ok(true);
    }
    delete(&templates, DCGM_EXPORTER).await?;
    label_namespace(client, ns, false).await?;
    Ok(false)
}

async fn label_namespace(client: &Client, ns: &str, labelled: bool) -> Result<()> {
    let body = render::admin_access_namespace(ns, labelled);
    Api::<Namespace>::all(client.clone())
        .patch(ns, &params(), &Patch::Apply(body))
        .await?;
    Ok(())
}
