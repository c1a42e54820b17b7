//! The DeviceClasses, embedded from `deviceclasses/*.yaml` so the files stay usable with `kubectl apply`.
use gpu_dra_api::names::{
    COMPUTE_DOMAIN_CHANNEL_CLASS, COMPUTE_DOMAIN_DAEMON_CLASS, GPU_CLASS, MIG_CLASS,
    MIGRATION_CLASS, VFIO_CLASS,
};
use k8s_openapi::api::resource::v1::DeviceClass;

use super::crd::ExtendedResourceClass;

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
        include_str!("../../../deviceclasses/optional/migration.gpu.nvidia.com.yaml"),
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

/// The classes a GPUCluster wants, and those it wants gone. At most one class carries the
/// `nvidia.com/gpu` mapping: the scheduler would use only the newest of several.
pub fn desired(mapping: Option<ExtendedResourceClass>) -> Result<(Vec<DeviceClass>, Vec<String>)> {
    let mut keep = Vec::new();
    let mut drop = Vec::new();
    for mut class in all()? {
        let name = class.metadata.name.clone().unwrap_or_default();
        match (name.as_str(), mapping) {
            (MIGRATION_CLASS, Some(ExtendedResourceClass::Migration)) => keep.push(class),
            (MIGRATION_CLASS, _) => drop.push(name),
            (GPU_CLASS, Some(ExtendedResourceClass::Gpu)) => keep.push(class),
            (GPU_CLASS, _) => {
                if let Some(spec) = class.spec.as_mut() {
                    spec.extended_resource_name = None;
                }
                keep.push(class);
            }
            _ => keep.push(class),
        }
    }
    Ok((keep, drop))
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

    fn mapped(classes: &[DeviceClass]) -> Vec<(String, String)> {
        classes
            .iter()
            .filter_map(|c| {
                let name = c.spec.as_ref()?.extended_resource_name.clone()?;
                Some((c.metadata.name.clone()?, name))
            })
            .collect()
    }

    #[test]
    fn the_files_map_nvidia_com_gpu_on_gpu_nvidia_com_and_the_optional_migration_class() {
        let pairs = mapped(&all().unwrap());
        let gpu = "nvidia.com/gpu".to_string();
        assert_eq!(
            pairs,
            [
                (GPU_CLASS.into(), gpu.clone()),
                (MIGRATION_CLASS.into(), gpu)
            ]
        );
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
    fn exactly_one_class_or_none_carries_the_mapping() {
        let gpu = "nvidia.com/gpu".to_string();
        let (keep, drop) = desired(Some(ExtendedResourceClass::Gpu)).unwrap();
        assert_eq!((keep.len(), drop), (5, vec![MIGRATION_CLASS.to_string()]));
        assert_eq!(mapped(&keep), [(GPU_CLASS.into(), gpu.clone())]);

        let (keep, drop) = desired(Some(ExtendedResourceClass::Migration)).unwrap();
        assert_eq!((keep.len(), drop.len()), (6, 0));
        assert_eq!(mapped(&keep), [(MIGRATION_CLASS.into(), gpu)]);

        let (keep, drop) = desired(None).unwrap();
        assert_eq!((keep.len(), drop), (5, vec![MIGRATION_CLASS.to_string()]));
        assert!(mapped(&keep).is_empty());
    }
}
