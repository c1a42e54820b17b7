//! Dynamic MIG on the real control plane: every placement published as a partitionable device,
//! the scheduler picks non-overlapping ones through the shared counters, and the plugin creates
//! exactly that instance at prepare and destroys it at unprepare.
use anyhow::{Context, Result, ensure};
use e2e::env::{Env, PodClaim};
use kube::ResourceExt;

use e2e::env_or_skip;

use e2e::env::allocation_results as results;

fn mig_template(name: &str, profile: &str) -> String {
    format!(
        r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: {name}
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel:
              expression: "device.attributes['gpu.nvidia.com'].profile == '{profile}'"
"#
    )
}

/// The MIG device a pod got: its allocation result and the UUID in its CDI spec.
async fn mig_of(env: &Env, node: &str, pod: &str, claim: &str) -> Result<(String, String, String)> {
    let c = env.pod_claim(pod, claim).await?;
    let r = results(&c);
    ensure!(r.len() == 1, "{pod}: {} results", r.len());
    let uid = c.uid().unwrap_or_default();
    let specs = e2e::cdi::load(&env.node(node).dirs.cdi)?;
    let id = format!("k8s.gpu.nvidia.com/claim={uid}-{}", r[0].device);
    let dev = specs
        .get(&id)
        .with_context(|| format!("{pod}: CDI device {id} not defined"))?;
    let visible = dev
        .env_value("NVIDIA_VISIBLE_DEVICES")
        .context("no NVIDIA_VISIBLE_DEVICES")?;
    ensure!(
        visible.starts_with("MIG-"),
        "{pod}: NVIDIA_VISIBLE_DEVICES={visible} is not a MIG UUID"
    );
    Ok((
        r[0].request.clone(),
        r[0].device.clone(),
        visible.to_string(),
    ))
}

#[tokio::test]
async fn dm1_inference_claims_get_3g_slices_created_at_prepare() -> Result<()> {
    let mut env = env_or_skip!("dm1_inference_claims_get_3g_slices_created_at_prepare");
    let node = "dm1-h100";
    env.add_node(
        node,
        &[
            "--profile",
            "h100-80gb:2",
            "--feature-gates",
            "DynamicMIG=true",
        ],
    )
    .await?;
    let devices = env.devices(node).await?;
    ensure!(
        devices.len() == 2 * 26,
        "{} devices published, want 2 x (GPU + 25 placements)",
        devices.len()
    );
    ensure!(
        devices
            .values()
            .filter(|d| d.string("type") == Some("mig"))
            .all(|d| d.string("uuid").is_none()),
        "placements have no UUID until created"
    );
    env.create_from_file("examples/claims/inference-gpu.yaml")
        .await?;
    let claim = [PodClaim {
        name: "gpu",
        template: "inference-gpu",
    }];

    // Two 3g.40gb placements per GPU: four pods fit, all as MIG slices, none overlapping.
    let mut seen = Vec::new();
    for i in 0..4 {
        let pod = format!("infer-{i}");
        env.create_pod(&env.pod_manifest(&pod, Some(node), &claim, None)?)
            .await?;
        env.wait_running(&pod).await?;
        let (request, device, uuid) = mig_of(&env, node, &pod, "gpu").await?;
        ensure!(request == "gpu/mig-slice", "{pod}: allocated for {request}");
        ensure!(device.contains("-mig-3g40gb-9-"), "{pod}: got {device}");
        ensure!(
            !seen
                .iter()
                .any(|(d, u): &(String, String)| *d == device || *u == uuid),
            "{pod}: {device} / {uuid} handed out twice"
        );
        seen.push((device, uuid));
    }
    // The node is out of 3g placements, and MIG slices use up both GPUs' counters, so the whole-GPU
    // fallback cannot be taken either.
    env.create_pod(&env.pod_manifest("infer-4", Some(node), &claim, None)?)
        .await?;
    let pending =
        e2e::env::wait_until("infer-4 reported unschedulable", e2e::env::WAIT, || async {
            let p = env.pods().get("infer-4").await?;
            let cond = p
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False");
            Ok(cond.map(|c| c.message.unwrap_or_default()))
        })
        .await?;
    println!("infer-4 Pending as expected: {pending}");

    // Deleting a pod destroys its instance; the freed placement goes to the waiting pod.
    env.delete_pod("infer-1").await?;
    env.wait_pod_gone("infer-1").await?;
    env.wait_running("infer-4").await?;
    let (request, device, uuid) = mig_of(&env, node, "infer-4", "gpu").await?;
    ensure!(
        request == "gpu/mig-slice" && device == seen[1].0,
        "infer-4 got {request} {device}, want the freed {}",
        seen[1].0
    );
    ensure!(
        uuid == seen[1].1,
        "the re-created instance at the same placement has the same (simulated) UUID"
    );
    env.check_violations()?;
    env.teardown().await
}

#[tokio::test]
async fn dm2_mixed_profiles_never_overlap() -> Result<()> {
    let mut env = env_or_skip!("dm2_mixed_profiles_never_overlap");
    let node = "dm2-h100";
    env.add_node(
        node,
        &[
            "--profile",
            "h100-80gb:4",
            "--feature-gates",
            "DynamicMIG=true",
        ],
    )
    .await?;
    // Largest first, each group filling one GPU: 7g x1, 3g x2, 2g x3, 1g x7.
    let groups = [
        ("mig-7g", "7g.80gb", 1),
        ("mig-3g", "3g.40gb", 2),
        ("mig-2g", "2g.20gb", 3),
        ("mig-1g", "1g.10gb", 7),
    ];
    let mut by_gpu: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (template, profile, count) in groups {
        env.create_from_yaml(&mig_template(template, profile))
            .await?;
        let claim = [PodClaim {
            name: "mig",
            template,
        }];
        let pods: Vec<String> = (0..count).map(|i| format!("{template}-{i}")).collect();
        for pod in &pods {
            env.create_pod(&env.pod_manifest(pod, Some(node), &claim, None)?)
                .await?;
        }
        for pod in &pods {
            env.wait_running(pod).await?;
            let (_, device, _) = mig_of(&env, node, pod, "mig").await?;
            let gpu = device.split("-mig-").next().unwrap_or_default().to_string();
            by_gpu.entry(gpu).or_default().push(device);
        }
    }
    // The plugin's simulated hardware refuses overlapping instances, so all pods running means the
    // scheduler's counters and the hardware agreed; check the layout too.
    for (gpu, devices) in &by_gpu {
        let mut used = [false; 8];
        for d in devices {
            let start: usize = d.rsplit('-').next().unwrap_or("0").parse()?;
            let size = if d.contains("-7g") {
                8
            } else if d.contains("-3g") {
                4
            } else if d.contains("-2g") {
                2
            } else {
                1
            };
            for s in &mut used[start..start + size] {
                ensure!(!*s, "{gpu}: {d} overlaps another instance ({devices:?})");
                *s = true;
            }
        }
    }
    println!("layout: {by_gpu:?}");
    env.check_violations()?;
    env.teardown().await
}
