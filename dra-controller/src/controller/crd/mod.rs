//! Custom resources owned by the controller, and the YAML the CRDs are generated into.
mod computedomain;
mod gpucluster;

pub use computedomain::*;
pub use gpucluster::*;

use kube::CustomResourceExt;

/// The CRDs as one multi-document YAML stream, in a stable order; `deploy/crds/` holds this output.
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for crd in [GPUCluster::crd(), ComputeDomain::crd()] {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}
