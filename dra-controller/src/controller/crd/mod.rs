//! Custom resources owned by the controller, and the YAML the CRDs are generated into.
mod computedomain;
mod gpucluster;

pub use computedomain::*;
pub use gpucluster::*;

use gpu_dra_api::miglayout::MigLayout;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSON,
};
use kube::CustomResourceExt;

/// The GPUCluster CRD. The operator's CRD does not require `spec`, so neither does ours; the API
/// server fills a missing one with `{draDriver: {}}` (what the operator reads it as), so every
/// stored object still has the `spec` our type needs to deserialize.
pub fn gpucluster_crd() -> CustomResourceDefinition {
    let mut crd = GPUCluster::crd();
    for version in &mut crd.spec.versions {
        let Some(root) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        else {
            continue;
        };
        if let Some(required) = root.required.as_mut() {
            required.retain(|r| r != "spec");
        }
        if root.required.as_ref().is_some_and(Vec::is_empty) {
            root.required = None;
        }
        if let Some(spec) = root.properties.as_mut().and_then(|p| p.get_mut("spec")) {
            spec.default = Some(JSON(serde_json::json!({ "draDriver": {} })));
        }
    }
    crd
}

/// The label that marks a CRD as this project's. The Helm chart refuses to install over a
/// `gpuclusters.nvidia.com` without it (the GPU Operator's), whose schema would drop our fields.
pub const CRD_OWNER_LABEL: (&str, &str) = super::labels::PART_OF;

/// The CRDs as one multi-document YAML stream, in a stable order; `deploy/crds/` holds this output.
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for mut crd in [
        gpucluster_crd(),
        ComputeDomain::crd(),
        gpu_dra_api::cdclique::crd(),
        MigLayout::crd(),
    ] {
        crd.metadata.labels = Some(
            [(CRD_OWNER_LABEL.0.to_owned(), CRD_OWNER_LABEL.1.to_owned())]
                .into_iter()
                .collect(),
        );
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}
