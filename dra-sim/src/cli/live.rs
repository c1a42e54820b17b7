//! `--kubeconfig`: ResourceSlices, DeviceClasses, allocated ResourceClaims and Nodes from a cluster.
use super::*;
use kube::api::{Api, ListParams};

pub async fn load(
    path: &str,
    objs: &mut Objects,
    allocated: &mut Vec<ResourceClaim>,
) -> Result<()> {
    let client = client(path).await?;
    let lp = ListParams::default();
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    objs.slices.extend(
        slices
            .list(&lp)
            .await
            .map_err(|source| Error::List {
                kind: "ResourceSlices",
                source,
            })?
            .items,
    );
    let classes: Api<k8s_openapi::api::resource::v1::DeviceClass> = Api::all(client.clone());
    objs.classes.extend(
        classes
            .list(&lp)
            .await
            .map_err(|source| Error::List {
                kind: "DeviceClasses",
                source,
            })?
            .items,
    );
    let claims: Api<ResourceClaim> = Api::all(client.clone());
    allocated.extend(
        claims
            .list(&lp)
            .await
            .map_err(|source| Error::List {
                kind: "ResourceClaims",
                source,
            })?
            .items
            .into_iter()
            .filter(|c| {
                c.status
                    .as_ref()
                    .and_then(|s| s.allocation.as_ref())
                    .is_some()
            }),
    );
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
    objs.nodes.extend(
        nodes
            .list(&lp)
            .await
            .map_err(|source| Error::List {
                kind: "Nodes",
                source,
            })?
            .items,
    );
    Ok(())
}

/// A client from the kubeconfig at `path`, or (empty) the inferred configuration.
pub async fn client(path: &str) -> Result<kube::Client> {
    let config = if path.is_empty() {
        kube::Config::infer().await.map_err(Error::InferConfig)?
    } else {
        let kc = kube::config::Kubeconfig::read_from(path).map_err(|source| Error::Kubeconfig {
            what: format!("reading kubeconfig {path}"),
            source,
        })?;
        kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|source| Error::Kubeconfig {
                what: format!("kubeconfig {path}"),
                source,
            })?
    };
    Ok(kube::Client::try_from(config)?)
}
