use super::*;

fn load(text: &str) -> Result<Objects> {
    let mut objs = Objects::default();
    load_str("f.yaml", text, &mut objs)?;
    Ok(objs)
}

#[test]
fn unknown_fields_are_named_with_their_path() {
    let err = load(
            "kind: ResourceSlice\napiVersion: resource.k8s.io/v1\nmetadata: {name: s}\n\
             spec: {driver: d, pool: {name: p, generation: 1, resourceSliceCount: 1}, nodeName: n,\n\
             devices: [{name: a}, {name: b, attributes: {x: {int: 1}}, capacitty: {}}]}\n",
        )
        .err()
        .expect("a misspelt field is an error")
        .to_string();
    assert_eq!(
        err,
        "f.yaml: document 1 (ResourceSlice s): field spec.devices[1].capacitty: unknown field"
    );
    let err = load("kind: DeviceClass\napiVersion: resource.k8s.io/v1\nmetadata: {name: c}\nspec: {}\nstatus: {}\n")
        .err()
        .expect("DeviceClass has no status")
        .to_string();
    assert!(err.ends_with("field status: unknown field"), "{err}");
}

#[test]
fn nulls_free_form_maps_and_defaults_pass() {
    let objs = load(
        "kind: ResourceClaim\napiVersion: resource.k8s.io/v1\n\
             metadata: {name: c, creationTimestamp: null, labels: {any/key: v}, annotations: {}}\n\
             spec: {devices: {requests: [{name: r, exactly: {deviceClassName: k, count: 1,\n\
             adminAccess: false, selectors: [], tolerations: null}}], constraints: null}}\n\
             ---\n\
             kind: DeviceClass\napiVersion: resource.k8s.io/v1\nmetadata: {name: k}\nspec: {config: [{opaque: {driver: d,\n\
             parameters: {apiVersion: v, kind: K, anything: {nested: [1, 2]}}}}]}\n",
    )
    .expect("known fields only");
    assert_eq!(
        objs.claims[0].metadata.namespace.as_deref(),
        Some("default")
    );
    assert_eq!(objs.classes.len(), 1);
}

#[test]
fn lists_workloads_and_ignored_kinds_land_in_their_places() {
    let objs = load(
        "apiVersion: v1\nkind: List\nitems:\n\
         - {apiVersion: v1, kind: Namespace, metadata: {name: ns}}\n\
         - {apiVersion: apps/v1, kind: Deployment, metadata: {name: d, namespace: ns},\n   \
            spec: {replicas: 3, selector: {}, template: {spec: {containers: [{name: c}]}}}}\n\
         - {apiVersion: batch/v1, kind: Job, metadata: {name: j},\n   \
            spec: {parallelism: 4, completions: 2, template: {spec: {containers: [{name: c}]}}}}\n\
         - {apiVersion: example.com/v1, kind: Widget, metadata: {name: w}}\n",
    )
    .expect("loads");
    let replicas: Vec<_> = objs.workloads.iter().map(|w| w.replicas).collect();
    use crate::workloads::Replicas::Count;
    assert_eq!(replicas, [Count(3), Count(2)]);
    assert_eq!(objs.workloads[1].namespace, "default");
    assert_eq!(objs.ignored.len(), 2, "{:?}", objs.ignored);
    assert!(objs.ignored[0].contains("document 1 (List): items[0] (Namespace ns)"));
}

#[test]
fn v1beta1_is_converted_with_a_note_and_v1alpha3_is_refused() {
    let objs = load(
        "apiVersion: resource.k8s.io/v1beta1\nkind: ResourceClaimTemplate\nmetadata: {name: t}\n\
         spec: {spec: {devices: {requests: [{name: gpu, deviceClassName: gpu.nvidia.com, count: 2}]}}}\n",
    )
    .expect("converted");
    let template = objs.templates[0].spec.clone().expect("spec");
    let devices = template.spec.and_then(|s| s.devices).expect("devices");
    let request = &devices.requests.expect("requests")[0];
    let exactly = request.exactly.as_ref().expect("moved under exactly");
    assert_eq!(
        (exactly.device_class_name.as_str(), exactly.count),
        ("gpu.nvidia.com", Some(2))
    );
    assert!(
        objs.notes[0].contains("converted from resource.k8s.io/v1beta1"),
        "{:?}",
        objs.notes
    );
    let err =
        load("apiVersion: resource.k8s.io/v1alpha3\nkind: ResourceClaim\nmetadata: {name: c}\n")
            .err()
            .expect("v1alpha3 claims are not served")
            .to_string();
    assert!(err.contains("no longer served"), "{err}");
    let err = load("apiVersion: v1\nmetadata: {name: c}\n")
        .err()
        .expect("no kind")
        .to_string();
    assert!(err.contains("field kind: not set"), "{err}");
}
