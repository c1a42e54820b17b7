use super::*;
use crate::types::AllocatedDevice;

fn alloc(pod_claim_name: Option<&str>) -> ClaimAllocation {
    let dev = |request: &str, device: &str| AllocatedDevice {
        request: request.into(),
        pool: "n1".into(),
        device: device.into(),
        admin_access: false,
        share_id: None,
    };
    ClaimAllocation {
        claim: ClaimRef {
            uid: "0b1c-uid".into(),
            namespace: "ns".into(),
            name: "pod-gpu-x7k2".into(),
        },
        pod_claim_name: pod_claim_name.map(str::to_string),
        devices: vec![
            dev("gpus/big", "gpu-0"),
            dev("gpus/big", "gpu-1"),
            dev("vf", "gpu-2"),
        ],
        configs: vec![],
    }
}

/// The bytes the upstream helper writes for the same claim: Go's indented JSON of each version,
/// newest first, each ending in a newline; the request keeps its subrequest.
#[test]
fn document_matches_the_helpers_stream() {
    let w = MetadataWriter::new("gpu.nvidia.com", "/plugin", "/cdi");
    let got =
        String::from_utf8(w.document(&alloc(Some("gpu")), "gpus/big", &BTreeMap::new())).unwrap();
    let one = |version: &str| {
        format!(
            r#"{{
  "kind": "DeviceMetadata",
  "apiVersion": "metadata.resource.k8s.io/{version}",
  "metadata": {{
    "name": "pod-gpu-x7k2",
    "namespace": "ns",
    "uid": "0b1c-uid",
    "generation": 1
  }},
  "podClaimName": "gpu",
  "requests": [
    {{
      "name": "gpus/big",
      "devices": [
        {{
          "driver": "gpu.nvidia.com",
          "pool": "n1",
          "name": "gpu-0"
        }},
        {{
          "driver": "gpu.nvidia.com",
          "pool": "n1",
          "name": "gpu-1"
        }}
      ]
    }}
  ]
}}
"#
        )
    };
    assert_eq!(got, one("v1beta1") + &one("v1alpha1"));
}

#[test]
fn attributes_and_paths_follow_the_layout() {
    let w = MetadataWriter::new("gpu.nvidia.com", "/plugin", "/cdi");
    let mut attrs = DeviceAttributes::new();
    attrs.insert(
        "gpu-2".into(),
        serde_json::json!({"pciBusID": {"string": "0000:3b:00.0"}}),
    );
    let a = alloc(None);
    let doc = w.document(&a, "vf", &attrs);
    let first: serde_json::Value = serde_json::Deserializer::from_slice(&doc)
        .into_iter()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(
        first["requests"][0]["devices"][0]["attributes"]["pciBusID"]["string"],
        "0000:3b:00.0"
    );
    assert!(first.get("podClaimName").is_none());
    assert_eq!(
        w.container_path(&a, "vf"),
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/pod-gpu-x7k2/vf/gpu.nvidia.com-metadata.json"
    );
    assert_eq!(
        w.container_path(&alloc(Some("gpu")), "vf"),
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/vf/gpu.nvidia.com-metadata.json"
    );
    let spec = serde_json::to_value(w.spec(&a, "vf")).unwrap();
    assert_eq!(
        spec,
        serde_json::json!({
            "cdiVersion": "0.5.0",
            "kind": "gpu.nvidia.com/metadata",
            "devices": [{"name": "0b1c-uid_vf", "containerEdits": {"mounts": [{
                "hostPath": "/plugin/dra-device-metadata/ns_pod-gpu-x7k2/vf/metadata.json",
                "containerPath": "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/pod-gpu-x7k2/vf/gpu.nvidia.com-metadata.json",
                "options": ["ro", "bind"]
            }]}}]
        })
    );
}

#[test]
fn write_adds_one_id_per_request_and_remove_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let (plugin, cdi) = (dir.path().join("plugin"), dir.path().join("cdi"));
    std::fs::create_dir_all(&cdi).unwrap();
    let w = MetadataWriter::new("gpu.nvidia.com", &plugin, &cdi);
    let a = alloc(Some("gpu"));
    let ids = w.write(&a, &BTreeMap::new()).unwrap();
    assert_eq!(
        ids.into_iter().collect::<Vec<_>>(),
        [
            (
                "gpus".to_string(),
                "gpu.nvidia.com/metadata=0b1c-uid_gpus".to_string()
            ),
            (
                "vf".to_string(),
                "gpu.nvidia.com/metadata=0b1c-uid_vf".to_string()
            ),
        ]
    );
    let file = plugin.join("dra-device-metadata/ns_pod-gpu-x7k2/gpus/metadata.json");
    assert_eq!(
        std::fs::read(&file).unwrap(),
        w.document(&a, "gpus/big", &BTreeMap::new())
    );
    assert!(
        cdi.join("gpu.nvidia.com_metadata_0b1c-uid_vf.json")
            .exists()
    );
    std::fs::write(cdi.join("gpu.nvidia.com_metadata_other_vf.json"), "{}").unwrap();

    let mut prepared: Vec<PreparedDevice> = ["gpus", "gpus", "vf"]
        .iter()
        .map(|r| PreparedDevice {
            request_names: vec![r.to_string()],
            cdi_device_ids: vec!["k8s.gpu.nvidia.com/claim=x".into()],
            ..Default::default()
        })
        .collect();
    add_cdi_ids(&mut prepared, &w.write(&a, &BTreeMap::new()).unwrap());
    let counts: Vec<usize> = prepared.iter().map(|p| p.cdi_device_ids.len()).collect();
    assert_eq!(counts, [2, 1, 2]);

    w.remove(&a.claim).unwrap();
    w.remove(&a.claim).unwrap();
    assert!(!plugin.join("dra-device-metadata/ns_pod-gpu-x7k2").exists());
    let left: Vec<_> = std::fs::read_dir(&cdi)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["gpu.nvidia.com_metadata_other_vf.json"]);
}
