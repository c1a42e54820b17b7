//! On-demand MIG on the real control plane: the node publishes what exists; the test, standing in
//! for the controller, writes the node's MigLayout spec; the plugin carves or restores GPUs, never
//! destroys a device a claim holds, and converges after a restart in the middle of a change.
use anyhow::{Context, Result, ensure};
use e2e::controller::apply_crd_docs;
use e2e::env::{Env, PodClaim, WAIT, allocation_results, wait_until};
use e2e::env_or_skip;
use gpu_dra_api::miglayout::{APPLIED_CONDITION, MigLayout};
use gpu_dra_api::names::MIG_LAYOUT_CONTROLLER_FIELD_MANAGER;
use k8s_openapi::api::core::v1::Event;
use kube::CustomResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

const TEMPLATE: &str = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: mig-3g
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel:
              expression: "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"
"#;

/// Installs the MigLayout CRD (`MigLayout::crd()`) and waits until it is Established.
async fn install_crd(env: &Env) -> Result<()> {
    let mut body = serde_json::to_value(MigLayout::crd())?;
    body["apiVersion"] = json!("apiextensions.k8s.io/v1");
    body["kind"] = json!("CustomResourceDefinition");
    apply_crd_docs(&env.client, vec![body]).await
}

/// Writes the node's spec as the controller does: `gpus` is `[(uuid, [(profile, start)])]`.
async fn set_spec(env: &Env, node: &str, gpus: &[(&str, &[(&str, u32)])]) -> Result<i64> {
    let gpus: Vec<_> = gpus
        .iter()
        .map(|(uuid, devices)| {
            let devices: Vec<_> = devices
                .iter()
                .map(|(p, s)| json!({"profile": p, "start": s}))
                .collect();
            json!({"uuid": uuid, "devices": devices})
        })
        .collect();
    let body = json!({
        "apiVersion": "nvidia.com/v1alpha1", "kind": "MigLayout",
        "metadata": {"name": node}, "spec": {"gpus": gpus},
    });
    let params = PatchParams::apply(MIG_LAYOUT_CONTROLLER_FIELD_MANAGER).force();
    let l = layouts(env)
        .patch(node, &params, &Patch::Apply(body))
        .await?;
    Ok(l.metadata.generation.unwrap_or_default())
}

fn layouts(env: &Env) -> Api<MigLayout> {
    Api::all(env.client.clone())
}

/// Waits until the plugin has acted on `generation` with `Applied` = `status`; returns the layout.
async fn wait_applied(env: &Env, node: &str, generation: i64, status: &str) -> Result<MigLayout> {
    let what = format!("MigLayout {node} generation {generation} Applied={status}");
    wait_until(&what, WAIT, || async {
        let l = layouts(env).get(node).await?;
        let st = l.status.clone().unwrap_or_default();
        let applied = st.conditions.iter().find(|c| c.type_ == APPLIED_CONDITION);
        let done = st.observed_generation == Some(generation)
            && applied.is_some_and(|c| c.status == status);
        Ok(done.then_some(l))
    })
    .await
}

/// Waits until the node publishes every device of `present` and none of `absent`.
async fn wait_devices(env: &Env, node: &str, present: &[&str], absent: &[&str]) -> Result<()> {
    let what = format!("{node} publishing {present:?} without {absent:?}");
    wait_until(&what, WAIT, || async {
        let d = env.devices(node).await?;
        let ok = present.iter().all(|n| d.contains_key(*n))
            && absent.iter().all(|n| !d.contains_key(*n));
        Ok(ok.then_some(()))
    })
    .await
}

/// How many events with `reason` the node's MigLayout has.
async fn events(env: &Env, node: &str, reason: &str) -> Result<usize> {
    let api: Api<Event> = Api::namespaced(env.client.clone(), "default");
    let lp = ListParams::default().fields(&format!(
        "involvedObject.kind=MigLayout,involvedObject.name={node},reason={reason}"
    ));
    Ok(api.list(&lp).await?.items.len())
}

/// Rewrites the simulated hardware of a stopped plugin: drops `gpu`'s MIG device at `start`.
fn drop_from_hardware(env: &Env, node: &str, gpu: &str, start: u64) -> Result<()> {
    let path = env.node(node).dirs.plugin.join("simulated-mig.json");
    let mut state: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    let devices = state["gpus"][gpu]
        .as_array_mut()
        .with_context(|| format!("{gpu} not in {}", path.display()))?;
    let before = devices.len();
    devices.retain(|d| d["placementStart"].as_u64() != Some(start));
    ensure!(devices.len() + 1 == before, "no device at {start}");
    std::fs::write(&path, serde_json::to_vec(&state)?)?;
    Ok(())
}

/// SIGKILL; delete the node's MigLayout while the plugin is down, start it again and return the
/// GPUs it reports in the MigLayout it creates (what its discovery finds).
async fn restart_without_layout(
    env: &mut Env,
    node: &str,
) -> Result<Vec<gpu_dra_api::miglayout::GpuLayoutStatus>> {
    let before = env.registrations(node);
    env.node_mut(node).plugin.kill9().await?;
    layouts(env).delete(node, &Default::default()).await?;
    wait_until("MigLayout deleted", WAIT, || async {
        Ok(layouts(env).get_opt(node).await?.is_none().then_some(()))
    })
    .await?;
    env.node_mut(node).plugin.restart()?;
    env.wait_registered(node, before).await?;
    let env = &*env;
    wait_until("the restarted plugin reports its GPUs", WAIT, || async {
        let l = layouts(env).get_opt(node).await?;
        let gpus = l.and_then(|l| l.status).map(|s| s.gpus).unwrap_or_default();
        Ok((gpus.len() == 2).then_some(gpus))
    })
    .await
}

/// SIGKILL and start again, as a crash and the DaemonSet's restart would.
async fn restart_plugin(env: &mut Env, node: &str) -> Result<()> {
    let before = env.registrations(node);
    env.node_mut(node).plugin.kill9().await?;
    env.node_mut(node).plugin.restart()?;
    env.wait_registered(node, before).await
}

#[tokio::test]
async fn od1_layout_carves_serves_refuses_and_restores() -> Result<()> {
    let mut env = env_or_skip!("od1_layout_carves_serves_refuses_and_restores");
    install_crd(&env).await?;
    let node = "od1-h100";
    env.add_node(node, &["--profile", "h100-80gb:2", "--on-demand-mig"])
        .await?;
    wait_devices(&env, node, &["gpu-0", "gpu-1"], &[]).await?;
    let reported = wait_until("the plugin reports its GPUs", WAIT, || async {
        let l = layouts(&env).get_opt(node).await?;
        let gpus = l.and_then(|l| l.status).map(|s| s.gpus).unwrap_or_default();
        Ok((gpus.len() == 2).then_some(gpus))
    })
    .await?;
    let uuid = |minor: u32| -> Result<String> {
        let g = reported.iter().find(|g| g.minor == minor);
        let g = g.with_context(|| format!("gpu-{minor} not in status: {reported:?}"))?;
        ensure!(g.mig_capable && g.devices.is_empty(), "gpu-{minor}: {g:?}");
        Ok(g.uuid.clone())
    };
    let (gpu0, gpu1) = (uuid(0)?, uuid(1)?);
    let mig = "gpu-0-mig-3g40gb-9-4";

    // Carve gpu-0: its whole device goes, the 3g.40gb at slice 4 appears; gpu-1 stays whole.
    let generation = set_spec(&env, node, &[(&gpu0, &[("3g.40gb", 4)])]).await?;
    wait_devices(&env, node, &[mig, "gpu-1"], &["gpu-0"]).await?;
    wait_applied(&env, node, generation, "True").await?;

    // A pod gets that MIG device through the real kubelet.
    env.create_from_yaml(TEMPLATE).await?;
    let claim = [PodClaim {
        name: "mig",
        template: "mig-3g",
    }];
    env.create_pod(&env.pod_manifest("od1-pod", Some(node), &claim, None)?)
        .await?;
    env.wait_running("od1-pod").await?;
    let c = env.pod_claim("od1-pod", "mig").await?;
    let got: Vec<String> = allocation_results(&c)
        .into_iter()
        .map(|r| r.device)
        .collect();
    ensure!(got == [mig], "od1-pod got {got:?}, want {mig}");

    // Asking for gpu-0 whole again would destroy the prepared device: refused, the device stays.
    let generation = set_spec(&env, node, &[(&gpu0, &[])]).await?;
    let l = wait_applied(&env, node, generation, "False").await?;
    let st = l.status.unwrap_or_default();
    let cond = st.conditions.iter().find(|c| c.type_ == APPLIED_CONDITION);
    ensure!(cond.is_some_and(|c| c.reason == "InUse"), "{cond:?}");
    let g0 = st.gpus.iter().find(|g| g.uuid == gpu0).context("gpu-0")?;
    ensure!(
        g0.message.as_deref().is_some_and(|m| m.contains(mig)) && g0.devices.len() == 1,
        "gpu-0 status: {g0:?}"
    );
    wait_until("a Warning event on the MigLayout", WAIT, || async {
        Ok((events(&env, node, "MigLayoutRefused").await? > 0).then_some(()))
    })
    .await?;
    wait_devices(&env, node, &[mig], &["gpu-0"]).await?;

    // A restart while the pod runs loses nothing: the plugin, re-creating its MigLayout, reports
    // the device from the (simulated) hardware, and destroying it is refused again.
    let found = restart_without_layout(&mut env, node).await?;
    let g0 = found.iter().find(|g| g.uuid == gpu0).context("gpu-0")?;
    ensure!(g0.devices.len() == 1, "gpu-0 after the restart: {g0:?}");
    let generation = set_spec(&env, node, &[(&gpu0, &[])]).await?;
    let l = wait_applied(&env, node, generation, "False").await?;
    let st = l.status.unwrap_or_default();
    let g0 = st.gpus.iter().find(|g| g.uuid == gpu0).context("gpu-0")?;
    ensure!(
        g0.message.as_deref().is_some_and(|m| m.contains(mig)),
        "{g0:?}"
    );
    wait_devices(&env, node, &[mig], &["gpu-0"]).await?;

    // Once the pod and its claim are gone, the plugin's retry returns gpu-0 to whole.
    env.delete_pod("od1-pod").await?;
    env.wait_pod_gone("od1-pod").await?;
    wait_devices(&env, node, &["gpu-0", "gpu-1"], &[mig]).await?;
    wait_applied(&env, node, generation, "True").await?;

    // A restart right after the spec changes (the change under way or not begun) converges.
    let both = [("3g.40gb", 0), ("3g.40gb", 4)];
    let generation = set_spec(&env, node, &[(&gpu0, &[]), (&gpu1, &both)]).await?;
    restart_plugin(&mut env, node).await?;
    let carved = ["gpu-1-mig-3g40gb-9-0", "gpu-1-mig-3g40gb-9-4", "gpu-0"];
    wait_devices(&env, node, &carved, &["gpu-1"]).await?;
    wait_applied(&env, node, generation, "True").await?;

    // A crash between the two creates leaves gpu-1 with one instance; the restarted plugin starts
    // from that hardware and makes the other (a Normal event says it changed something).
    let applied = events(&env, node, "MigLayoutApplied").await?;
    let before = env.registrations(node);
    env.node_mut(node).plugin.kill9().await?;
    drop_from_hardware(&env, node, &gpu1, 4)?;
    env.node_mut(node).plugin.restart()?;
    env.wait_registered(node, before).await?;
    wait_until(
        "the restarted plugin completes the change",
        WAIT,
        || async { Ok((events(&env, node, "MigLayoutApplied").await? > applied).then_some(())) },
    )
    .await?;
    wait_devices(&env, node, &carved, &["gpu-1"]).await?;
    let l = wait_applied(&env, node, generation, "True").await?;
    let g1 = l.status.unwrap_or_default().gpus;
    let g1 = g1.iter().find(|g| g.uuid == gpu1).context("gpu-1")?;
    ensure!(g1.devices.len() == 2, "gpu-1 after the restart: {g1:?}");

    // The (simulated) hardware outlives the plugin: the re-created MigLayout reports what was made.
    let found = restart_without_layout(&mut env, node).await?;
    let g1 = found.iter().find(|g| g.uuid == gpu1).context("gpu-1")?;
    ensure!(g1.devices.len() == 2, "gpu-1 after the restart: {g1:?}");
    wait_devices(&env, node, &carved, &["gpu-1"]).await?;

    layouts(&env).delete(node, &Default::default()).await?;
    env.check_violations()?;
    env.teardown().await
}
