//! The DeviceClasses, embedded from `deviceclasses/*.yaml` so the files stay usable with `kubectl apply`.
use gpu_dra_api::names::{
    COMPUTE_DOMAIN_CHANNEL_CLASS, COMPUTE_DOMAIN_DAEMON_CLASS, GPU_CLASS, MIG_CLASS,
    MIGRATION_CLASS, VFIO_CLASS,
};
use k8s_openapi::api::resource::v1::DeviceClass;

use super::error::{Error, Result};

const FILES: [(&str, &str); 6] = [
    (
        GPU_CLASS,
        include_str!("../../../deviceclasses/gpu.nvidia.com.yaml"),
    ),
    (
        MIG_CLASS,
        include_str!("../../../deviceclasses/mig.nvidia.com.yaml"),
    ),
    (
        VFIO_CLASS,
        include_str!("../../../deviceclasses/vfio.gpu.nvidia.com.yaml"),
    ),
    (
        COMPUTE_DOMAIN_DAEMON_CLASS,
        include_str!("../../../deviceclasses/compute-domain-daemon.nvidia.com.yaml"),
    ),
    (
        COMPUTE_DOMAIN_CHANNEL_CLASS,
        include_str!("../../../deviceclasses/compute-domain-default-channel.nvidia.com.yaml"),
    ),
    (
        MIGRATION_CLASS,
        include_str!("../../../deviceclasses/migration.gpu.nvidia.com.yaml"),
    ),
];

/// Every embedded class, parsed, in file order.
pub fn all() -> Result<Vec<DeviceClass>> {
    FILES
        .iter()
        .map(|(name, text)| {
            serde_yaml::from_str(text).map_err(|source| Error::Manifest { name, source })
        })
        .collect()
}

/// The classes a GPUCluster wants, and those it wants gone.
pub fn desired(map_extended_resource: bool) -> Result<(Vec<DeviceClass>, Vec<String>)> {
    let (keep, drop): (Vec<_>, Vec<_>) = all()?.into_iter().partition(|c| {
        map_extended_resource || c.metadata.name.as_deref() != Some(MIGRATION_CLASS)
    });
    Ok((
        keep,
        drop.into_iter().filter_map(|c| c.metadata.name).collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_classes_parse_and_are_named_like_their_files() {
        let classes = all().unwrap();
        let names: Vec<_> = classes
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, FILES.map(|(n, _)| n.to_string()));
        for c in &classes {
            assert_eq!(
                c.spec
                    .as_ref()
                    .and_then(|s| s.selectors.as_ref())
                    .map(Vec::len),
                Some(1),
                "{names:?}"
            );
        }
    }

    #[test]
    fn only_the_migration_class_maps_the_extended_resource() {
        for c in all().unwrap() {
            let mapped = c
                .spec
                .as_ref()
                .and_then(|s| s.extended_resource_name.as_deref());
            let expect =
                (c.metadata.name.as_deref() == Some(MIGRATION_CLASS)).then_some("nvidia.com/gpu");
            assert_eq!(mapped, expect, "{:?}", c.metadata.name);
        }
    }

    #[test]
    fn migration_class_selects_whole_gpus_only() {
        let c = all()
            .unwrap()
            .into_iter()
            .find(|c| c.metadata.name.as_deref() == Some(MIGRATION_CLASS))
            .unwrap();
        let selectors = c.spec.unwrap().selectors.unwrap();
        let expr = &selectors[0].cel.as_ref().unwrap().expression;
        assert!(expr.contains("type == 'gpu'"), "{expr}");
        assert!(!expr.contains("mig") && !expr.contains("vfio"), "{expr}");
    }

    #[test]
    fn disabling_the_mapping_removes_the_migration_class() {
        let (keep, drop) = desired(false).unwrap();
        assert_eq!(keep.len(), 5);
        assert_eq!(drop, [MIGRATION_CLASS]);
        let (keep, drop) = desired(true).unwrap();
        assert_eq!(keep.len(), 6);
        assert!(drop.is_empty());
    }
}
