//! Device taints against a request's tolerations.
use k8s_openapi::api::resource::v1::DeviceToleration;

pub(crate) fn taint_prevents(
    dev: &k8s_openapi::api::resource::v1::Device,
    tolerations: &[DeviceToleration],
) -> bool {
    for t in dev.taints.iter().flatten() {
        if t.effect == "NoSchedule" || t.effect == "NoExecute" {
            let tolerated = tolerations.iter().any(|tol| {
                if tol
                    .effect
                    .as_deref()
                    .is_some_and(|e| !e.is_empty() && e != t.effect)
                {
                    return false;
                }
                if tol
                    .key
                    .as_deref()
                    .is_some_and(|k| !k.is_empty() && k != t.key)
                {
                    return false;
                }
                match tol.operator.as_deref().unwrap_or("") {
                    "" | "Equal" => {
                        tol.value.as_deref().unwrap_or("") == t.value.as_deref().unwrap_or("")
                    }
                    "Exists" => true,
                    _ => false,
                }
            });
            if !tolerated {
                return true;
            }
        }
    }
    false
}
