//! Which opaque config applies to which allocated device, NVIDIA's precedence rules.
//!
//! Built-in defaults first, then class configs, then claim configs (the allocation lists them in
//! that order); for each device the last matching entry wins. An entry naming requests matches
//! the request (`gpu`) or the exact subrequest (`gpu/mig-slice`); an entry without requests
//! applies to every device of its kind.
use gpu_dra_api::config::{DeviceConfig, DeviceKind};
use gpu_dra_api::gates::FeatureGates;

use super::types::{AllocatedDevice, ConfigEntry};
use crate::Error;

pub fn resolve(
    device: &AllocatedDevice,
    kind: DeviceKind,
    configs: &[ConfigEntry],
    gates: &FeatureGates,
) -> Result<DeviceConfig, Error> {
    resolve_with_source(device, kind, configs, gates).map(|(c, _)| c)
}

/// Like [`resolve`], also returning where the chosen config came from (its field path, or
/// `built-in default`), for errors found later (e.g. an MPS limit naming a device the claim lacks).
pub fn resolve_with_source(
    device: &AllocatedDevice,
    kind: DeviceKind,
    configs: &[ConfigEntry],
    gates: &FeatureGates,
) -> Result<(DeviceConfig, String), Error> {
    let mut chosen = DeviceConfig::default_for(kind);
    let mut chosen_at = String::from("built-in default");
    for entry in configs {
        let named = !entry.requests.is_empty();
        if named
            && !entry
                .requests
                .iter()
                .any(|r| r == &device.request || r == device.base_request())
        {
            continue;
        }
        let config = DeviceConfig::decode(&entry.parameters, &entry.path)?;
        if config.kind() != kind {
            if named {
                return Err(Error::InvalidAllocation(format!(
                    "{}: a {:?} config cannot apply to {} ({:?} device) of request {}",
                    entry.path,
                    config.kind(),
                    device.device,
                    kind,
                    device.request
                )));
            }
            continue;
        }
        chosen = config;
        chosen_at = entry.path.clone();
    }
    chosen.normalize();
    chosen.validate(gates, &chosen_at)?;
    Ok((chosen, chosen_at))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::core::types::ConfigSource;

    fn dev(request: &str) -> AllocatedDevice {
        AllocatedDevice {
            request: request.into(),
            pool: "n".into(),
            device: "gpu-0".into(),
            admin_access: false,
            share_id: None,
        }
    }

    fn entry(
        source: ConfigSource,
        requests: &[&str],
        kind: &str,
        interval: &str,
        path: &str,
    ) -> ConfigEntry {
        ConfigEntry {
            source,
            requests: requests.iter().map(|r| r.to_string()).collect(),
            parameters: json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}}),
            path: path.into(),
        }
    }

    fn interval(c: &DeviceConfig) -> String {
        format!(
            "{:?}",
            c.sharing()
                .unwrap()
                .time_slicing_config
                .as_ref()
                .unwrap()
                .interval
                .unwrap()
        )
    }

    #[test]
    fn last_match_wins_and_claim_overrides_class() {
        let gates = FeatureGates::parse("TimeSlicingSettings=true").unwrap();
        let configs = [
            entry(ConfigSource::Class, &[], "GpuConfig", "Long", "class[0]"),
            entry(
                ConfigSource::Claim,
                &["gpu"],
                "GpuConfig",
                "Short",
                "claim[0]",
            ),
            entry(
                ConfigSource::Claim,
                &["other"],
                "GpuConfig",
                "Medium",
                "claim[1]",
            ),
        ];
        assert_eq!(
            interval(&resolve(&dev("gpu"), DeviceKind::Gpu, &configs, &gates).unwrap()),
            "Short"
        );
        assert_eq!(
            interval(&resolve(&dev("gpu/whole"), DeviceKind::Gpu, &configs, &gates).unwrap()),
            "Short",
            "request name covers its subrequests"
        );
        assert_eq!(
            interval(&resolve(&dev("x"), DeviceKind::Gpu, &configs, &gates).unwrap()),
            "Long"
        );
        let exact = [entry(
            ConfigSource::Claim,
            &["gpu/whole"],
            "GpuConfig",
            "Medium",
            "claim[0]",
        )];
        assert_eq!(
            interval(&resolve(&dev("gpu/whole"), DeviceKind::Gpu, &exact, &gates).unwrap()),
            "Medium"
        );
        assert!(
            resolve(&dev("gpu/mig"), DeviceKind::Gpu, &exact, &gates)
                .unwrap()
                .sharing()
                .is_none()
        );
    }

    #[test]
    fn kinds_must_fit_the_device() {
        let gates = FeatureGates::parse("TimeSlicingSettings=true").unwrap();
        let unnamed = [entry(
            ConfigSource::Class,
            &[],
            "GpuConfig",
            "Long",
            "class[0]",
        )];
        assert!(
            resolve(&dev("gpu"), DeviceKind::Mig, &unnamed, &gates)
                .unwrap()
                .sharing()
                .is_none(),
            "request-less configs skip other kinds"
        );
        let named = [entry(
            ConfigSource::Claim,
            &["gpu"],
            "GpuConfig",
            "Long",
            "claim[0]",
        )];
        let e = resolve(&dev("gpu"), DeviceKind::Mig, &named, &gates)
            .unwrap_err()
            .to_string();
        assert!(e.contains("claim[0]") && e.contains("gpu-0"), "{e}");
    }

    #[test]
    fn validation_errors_name_where_the_config_came_from() {
        let configs = [entry(
            ConfigSource::Claim,
            &[],
            "GpuConfig",
            "Short",
            "status.allocation.devices.config[1].opaque.parameters",
        )];
        let e = resolve(
            &dev("gpu"),
            DeviceKind::Gpu,
            &configs,
            &FeatureGates::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("status.allocation.devices.config[1].opaque.parameters.sharing.strategy")
                && e.contains("TimeSlicingSettings"),
            "{e}"
        );
        let mut bad = configs[0].clone();
        bad.parameters["sharing"]["bogus"] = json!(1);
        let e = resolve(
            &dev("gpu"),
            DeviceKind::Gpu,
            &[bad],
            &FeatureGates::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("sharing.bogus"), "{e}");
    }
}
