//! Which opaque config applies to which allocated device, NVIDIA's precedence rules.
//!
//! Every config of this driver is decoded strictly first (a malformed one fails the claim even if
//! it applies to no device, as in NVIDIA's driver). Built-in defaults come first, then class
//! configs, then claim configs; for each device the last matching entry wins. An entry naming
//! requests matches the request (`gpu`) or the exact subrequest (`gpu/mig-slice`) and must be of
//! the device's kind; an entry without requests applies to every device of its kind. The chosen
//! config is then normalized and validated ([`OpaqueConfig::device_config`]).
//!
//! One deliberate difference: NVIDIA's driver matches a named request only against the
//! allocation result's exact request name, so a config naming `gpu` does not reach a device
//! allocated for the subrequest `gpu/mig-slice`; here it does, as the DRA API documents.
use gpu_dra_api::config::{DeviceConfig, DeviceKind, OpaqueConfig};
use gpu_dra_api::gates::FeatureGates;

use super::types::{AllocatedDevice, ConfigEntry, ConfigSource};
use crate::Error;

/// Decodes every config entry, class configs before claim configs (stable within each).
pub fn decode_all(configs: &[ConfigEntry]) -> Result<Vec<(&ConfigEntry, OpaqueConfig)>, Error> {
    let class = configs.iter().filter(|c| c.source == ConfigSource::Class);
    let claim = configs.iter().filter(|c| c.source == ConfigSource::Claim);
    class
        .chain(claim)
        .map(|e| Ok((e, OpaqueConfig::decode(&e.parameters, &e.path)?)))
        .collect()
}

/// Whether an entry names the device's request (or its main request).
pub fn names_request(entry: &ConfigEntry, device: &AllocatedDevice) -> bool {
    entry
        .requests
        .iter()
        .any(|r| r == &device.request || r == device.base_request())
}

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
    let decoded = decode_all(configs)?;
    // From the highest precedence down; the first entry that applies wins.
    for (entry, config) in decoded.iter().rev() {
        if !entry.requests.is_empty() {
            if !names_request(entry, device) {
                continue;
            }
            if config.device_kind() != Some(kind) {
                return Err(Error::InvalidAllocation(format!(
                    "{}: a {} cannot apply to {} ({:?} device) of request {}",
                    entry.path,
                    config.kind_name(),
                    device.device,
                    kind,
                    device.request
                )));
            }
        } else if config.device_kind() != Some(kind) {
            continue;
        }
        return Ok((
            config.device_config(gates, &entry.path)?,
            entry.path.clone(),
        ));
    }
    let mut default = DeviceConfig::default_for(kind);
    default.normalize();
    Ok((default, String::from("built-in default")))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::types::ConfigSource;

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

    #[test]
    fn every_config_is_decoded_even_one_that_applies_to_no_device() {
        let gates = FeatureGates::parse("TimeSlicingSettings=true").unwrap();
        let mut other = entry(
            ConfigSource::Claim,
            &["other"],
            "GpuConfig",
            "Short",
            "claim[1]",
        );
        other.parameters["sharing"]["timeslicingconfig"] = json!({});
        let configs = [
            entry(
                ConfigSource::Claim,
                &["gpu"],
                "GpuConfig",
                "Long",
                "claim[0]",
            ),
            other.clone(),
        ];
        let e = resolve(&dev("gpu"), DeviceKind::Gpu, &configs, &gates)
            .unwrap_err()
            .to_string();
        assert!(e.contains("claim[1].sharing.timeslicingconfig"), "{e}");
        // A value error in a config that applies to nothing is not checked (NVIDIA validates only
        // the configs it applies).
        let mut unused = other;
        unused.parameters = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "Sometimes"}});
        let configs = [
            entry(
                ConfigSource::Claim,
                &["gpu"],
                "GpuConfig",
                "Long",
                "claim[0]",
            ),
            unused,
        ];
        assert_eq!(
            interval(&resolve(&dev("gpu"), DeviceKind::Gpu, &configs, &gates).unwrap()),
            "Long"
        );
    }

    #[test]
    fn class_configs_rank_below_claim_configs_wherever_they_are_listed() {
        let gates = FeatureGates::parse("TimeSlicingSettings=true").unwrap();
        let configs = [
            entry(ConfigSource::Claim, &[], "GpuConfig", "Short", "claim[0]"),
            entry(ConfigSource::Class, &[], "GpuConfig", "Long", "class[0]"),
        ];
        let (c, at) = resolve_with_source(&dev("gpu"), DeviceKind::Gpu, &configs, &gates).unwrap();
        assert_eq!((interval(&c).as_str(), at.as_str()), ("Short", "claim[0]"));
    }

    #[test]
    fn a_higher_ranked_match_hides_a_lower_ranked_misfit() {
        let gates = FeatureGates::parse("TimeSlicingSettings=true").unwrap();
        let mut mig = entry(
            ConfigSource::Claim,
            &["gpu"],
            "MigDeviceConfig",
            "Long",
            "claim[0]",
        );
        mig.parameters =
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig"});
        let configs = [
            mig,
            entry(
                ConfigSource::Claim,
                &["gpu"],
                "GpuConfig",
                "Short",
                "claim[1]",
            ),
        ];
        assert_eq!(
            interval(&resolve(&dev("gpu"), DeviceKind::Gpu, &configs, &gates).unwrap()),
            "Short"
        );
        let swapped = [configs[1].clone(), configs[0].clone()];
        assert!(resolve(&dev("gpu"), DeviceKind::Gpu, &swapped, &gates).is_err());
    }

    #[test]
    fn compute_domain_configs_under_this_driver() {
        let cd = |requests: &[&str]| ConfigEntry {
            source: ConfigSource::Claim,
            requests: requests.iter().map(|r| r.to_string()).collect(),
            parameters: json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig", "domainID": "d"}),
            path: "claim[0]".into(),
        };
        let gates = FeatureGates::default();
        // Without requests it applies to no GPU device and is skipped.
        assert!(
            resolve(&dev("gpu"), DeviceKind::Gpu, &[cd(&[])], &gates)
                .unwrap()
                .sharing()
                .is_none()
        );
        // Naming a GPU request, it is refused.
        let e = resolve(&dev("gpu"), DeviceKind::Gpu, &[cd(&["gpu"])], &gates)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ComputeDomainChannelConfig") && e.contains("claim[0]"),
            "{e}"
        );
    }
}
