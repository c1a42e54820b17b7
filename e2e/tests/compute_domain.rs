//! ComputeDomains with NVIDIA's default gates (`ComputeDomainCliques`, `IMEXDaemonsWithDNSNames`)
//! through stock kubelets: two GB200 nodes in one NVLink clique (`nvidia.com/gpu.clique`, as GPU
//! Feature Discovery labels it) run the GPU and the compute-domain plugin. A workload pod per node
//! takes the domain's channel; kube-controller-manager's DaemonSet controller (run for this test)
//! starts the domain's IMEX daemon pods, whose daemon claims the compute-domain plugin prepares.
//!
//! Checked (`cq1`): one ComputeDomainClique with one entry per node (IP, index, Ready) and the
//! domain's status built from it; the daemon's nodes config lists DNS names, and the hosts file
//! mounted over its `/etc/hosts` maps them to the daemon pod IPs, following a node that leaves;
//! deleting the domain deletes the clique. With both gates off (`cq2`): the domain's status lists
//! each node with its clique, and the nodes config lists the clique's daemon IPs once both daemons
//! are there, keeping them when one leaves, as NVIDIA's daemon does.
use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use e2e::controller::{apply_crds, start_controller_with};
use e2e::env::{Env, PodClaim, WAIT, wait_until};
use e2e::env_or_skip;
use e2e::manifests::WorkloadControllers;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use serde_json::{Value, json};

const CD_DRIVER: &str = "compute-domain.nvidia.com";
const CD_LABEL: &str = "resource.nvidia.com/computeDomain";
const CLIQUE: &str = "7c1f3a2e-5b8d-4e6f-9a0b-1c2d3e4f5a6b.1";
const NODES: [&str; 2] = ["cq1-a", "cq1-b"];

fn nvidia_ns_api(env: &Env, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("resource.nvidia.com", "v1beta1", kind);
    Api::namespaced_with(
        env.client.clone(),
        &env.ns,
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

/// The domain's running daemon pods by node, with their IPs.
async fn daemon_ips(env: &Env, uid: &str) -> Result<BTreeMap<String, String>> {
    let lp = ListParams::default().labels(&format!(
        "{CD_LABEL}={uid},app.kubernetes.io/component=compute-domain-daemon"
    ));
    Ok(env
        .pods()
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p: Pod| {
            let node = p.spec?.node_name?;
            let ip = p.status?.pod_ip?;
            Some((node, ip))
        })
        .collect())
}

fn domain_dir(env: &Env, node: &str, uid: &str) -> Result<PathBuf> {
    let kubelet = env.node(node).kubelet.stock().context("a stock kubelet")?;
    Ok(kubelet.plugin_dir(CD_DRIVER).join("domains").join(uid))
}

/// The clique entries as `(node, ip, index, status)`.
fn entries(clique: &DynamicObject) -> Vec<(String, String, i64, String)> {
    clique.data["daemons"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            (
                d["nodeName"].as_str().unwrap_or_default().to_string(),
                d["ipAddress"].as_str().unwrap_or_default().to_string(),
                d["index"].as_i64().unwrap_or(-9),
                d["status"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The hosts file's daemon lines, `ip → name`.
fn hosts_map(env: &Env, node: &str, uid: &str) -> Result<BTreeMap<String, String>> {
    let text =
        std::fs::read_to_string(domain_dir(env, node, uid)?.join("hosts")).unwrap_or_default();
    Ok(text
        .lines()
        .filter_map(|l| {
            let (ip, name) = l.split_once('\t')?;
            name.starts_with("compute-domain-daemon-")
                .then(|| (ip.to_string(), name.to_string()))
        })
        .collect())
}

/// Two GB200 nodes in clique `CLIQUE`, each with both plugins, and a filler pod on the second so
/// the two daemons' pod IPs differ.
async fn clique_nodes(env: &mut Env, nodes: [&str; 2], cd_plugin_args: &[&str]) -> Result<()> {
    apply_crds(env).await?;
    for node in nodes {
        env.add_node(node, &["--profile", "gb200:4"]).await?;
        env.add_plugin(node, CD_DRIVER, cd_plugin_args).await?;
        let label = json!({ "metadata": { "labels": { "nvidia.com/gpu.clique": CLIQUE } } });
        Api::<Node>::all(env.client.clone())
            .patch(node, &PatchParams::default(), &Patch::Merge(&label))
            .await?;
    }
    // Each node's fake runtime numbers pod IPs from the same start: a pod on the second node first
    // makes the two daemons' IPs differ.
    let filler = format!("{}-filler", nodes[1]);
    env.create_pod(&env.pod_manifest(&filler, Some(nodes[1]), &[], None)?)
        .await?;
    env.wait_running(&filler).await?;
    Ok(())
}

/// The domain `cd1` with `numNodes: 2` and a running workload pod per node taking its channel;
/// returns the domain's UID.
async fn domain_with_workloads(env: &Env, nodes: [&str; 2], prefix: &str) -> Result<String> {
    let cds = nvidia_ns_api(env, "ComputeDomain", "computedomains");
    let cd = json!({
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
        "metadata": { "name": "cd1", "namespace": env.ns },
        "spec": { "numNodes": 2, "channel": { "resourceClaimTemplate": { "name": "cd1-channel" } } },
    });
    let uid = cds
        .create(&PostParams::default(), &serde_json::from_value(cd)?)
        .await?
        .uid()
        .context("uid")?;
    let templates: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
        Api::namespaced(env.client.clone(), &env.ns);
    wait_until("the workload template", WAIT, || async {
        Ok(templates.get_opt("cd1-channel").await?)
    })
    .await?;
    let channel = [PodClaim {
        name: "channel",
        template: "cd1-channel",
    }];
    for (i, node) in nodes.iter().enumerate() {
        let name = format!("{prefix}-work-{i}");
        env.create_pod(&env.pod_manifest(&name, Some(node), &channel, None)?)
            .await?;
        env.wait_running(&name).await?;
    }
    Ok(uid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cq1_cliques_and_dns_names_through_the_kubelet() -> Result<()> {
    let mut env = env_or_skip!("cq1_cliques_and_dns_names_through_the_kubelet");
    clique_nodes(&mut env, NODES, &[]).await?;
    // NVIDIA's defaults: both gates on.
    let mut controller = start_controller_with(&env, "computedomain", &[("FEATURE_GATES", "")])?;
    let daemonsets = WorkloadControllers::start_only(
        &env.kubeconfig,
        &env.work.join("cq1-daemonset-controller.log"),
        "daemonset-controller",
    )?;
    let outcome = scenario(&env).await;
    drop(daemonsets);
    let _ = controller.kill().await;
    outcome?;
    env.check_violations()?;
    env.teardown().await
}

async fn scenario(env: &Env) -> Result<()> {
    let cds = nvidia_ns_api(env, "ComputeDomain", "computedomains");
    let cliques = nvidia_ns_api(env, "ComputeDomainClique", "computedomaincliques");
    let uid = domain_with_workloads(env, NODES, "cq1").await?;

    // The daemons come up on both nodes; the clique lists both, Ready, with their pod IPs.
    let clique_name = format!("{uid}.{CLIQUE}");
    let (ips, clique) = wait_until("a Ready clique entry per daemon pod", WAIT, || async {
        let ips = daemon_ips(env, &uid).await?;
        let Some(c) = cliques.get_opt(&clique_name).await? else {
            return Ok(None);
        };
        let e = entries(&c);
        let all_ready = e.len() == 2
            && e.iter()
                .all(|(n, ip, _, s)| s == "Ready" && ips.get(n) == Some(ip));
        Ok((ips.len() == 2 && all_ready).then_some((ips, c)))
    })
    .await?;
    println!("cq1: clique {}", clique.data["daemons"]);
    let mut indices: Vec<i64> = entries(&clique).iter().map(|e| e.2).collect();
    indices.sort();
    ensure!(indices == [0, 1], "indices {indices:?}");
    let labels = clique.labels();
    ensure!(
        labels.get(CD_LABEL) == Some(&uid)
            && labels
                .get("resource.nvidia.com/computeDomain.cliqueID")
                .map(String::as_str)
                == Some(CLIQUE),
        "clique labels {labels:?}"
    );
    ensure!(
        clique.owner_references().len() == 2
            && clique.owner_references().iter().all(|o| o.kind == "Pod"),
        "owners {:?}",
        clique.owner_references()
    );
    let distinct: std::collections::BTreeSet<&String> = ips.values().collect();
    ensure!(distinct.len() == 2, "daemon pod IPs {ips:?}");

    // The domain's status is the clique's entries; Ready with numNodes nodes ready.
    let status = wait_until("ComputeDomain Ready", WAIT, || async {
        let s = cds.get("cd1").await?.data["status"].clone();
        Ok(
            (s["status"] == "Ready" && s["nodes"].as_array().is_some_and(|n| n.len() == 2))
                .then_some(s),
        )
    })
    .await?;
    for n in status["nodes"].as_array().into_iter().flatten() {
        let node = n["name"].as_str().unwrap_or_default();
        let entry = entries(&clique).into_iter().find(|e| e.0 == node);
        ensure!(
            entry.is_some_and(|e| n["ipAddress"] == e.1
                && n["index"] == e.2
                && n["cliqueID"] == CLIQUE),
            "status node {n} does not match the clique"
        );
    }

    // Each node's daemon config: DNS names in nodes.cfg, and a hosts file mapping them to the IPs.
    let expected: BTreeMap<String, String> = entries(&clique)
        .into_iter()
        .map(|(_, ip, i, _)| (ip, format!("compute-domain-daemon-{i:04}")))
        .collect();
    for node in NODES {
        let dir = domain_dir(env, node, &uid)?;
        let cfg = std::fs::read_to_string(dir.join("imexd.cfg"))?;
        ensure!(
            cfg.contains("IMEX_NODE_CONFIG_FILE=/imexd/nodes.cfg"),
            "{node} imexd.cfg: {cfg}"
        );
        let names = std::fs::read_to_string(dir.join("nodes.cfg"))?;
        ensure!(
            names.lines().count() == 18
                && names.lines().next() == Some("compute-domain-daemon-0000")
                && !names.contains("10."),
            "{node} nodes.cfg: {names}"
        );
        wait_until(
            &format!("{node}: hosts file maps both daemons"),
            WAIT,
            || async { Ok((hosts_map(env, node, &uid)? == expected).then_some(())) },
        )
        .await?;
        ensure_hosts_mount(env, node, &dir)?;
        // The daemon pod learns the node's clique from the CDI spec, as from NVIDIA's plugin.
        let specs = e2e::cdi::load(&env.node(node).dirs.cdi)?;
        let daemon = specs
            .iter()
            .find(|(id, _)| {
                id.starts_with(gpu_dra_api::names::COMPUTE_DOMAIN_CDI_VENDOR)
                    && id.ends_with("-daemon-0")
            })
            .map(|(_, d)| d)
            .with_context(|| format!("{node}: no daemon CDI device in {:?}", specs.keys()))?;
        ensure!(
            daemon.env_value("CLIQUE_ID") == Some(CLIQUE),
            "{node}: daemon CDI env {:?}",
            daemon.env
        );
    }
    println!("cq1: hosts {expected:?}");

    // The second node leaves (its workload goes, so does its label and daemon): the clique and the
    // first node's hosts file keep only the first daemon.
    env.delete_pod("cq1-work-1").await?;
    env.wait_pod_gone("cq1-work-1").await?;
    let left = wait_until("the clique without the second node", WAIT, || async {
        let c = cliques.get(&clique_name).await?;
        let e = entries(&c);
        Ok((e.len() == 1 && e[0].0 == NODES[0]).then_some(e))
    })
    .await?;
    let one = BTreeMap::from([(
        left[0].1.clone(),
        format!("compute-domain-daemon-{:04}", left[0].2),
    )]);
    wait_until("the first node's hosts file follows", WAIT, || async {
        Ok((hosts_map(env, NODES[0], &uid)? == one).then_some(()))
    })
    .await?;

    // Deleting the domain deletes its clique.
    cds.delete("cd1", &DeleteParams::default()).await?;
    wait_until("the ComputeDomain gone", WAIT, || async {
        Ok(cds.get_opt("cd1").await?.is_none().then_some(()))
    })
    .await?;
    let rest = cliques.list(&ListParams::default()).await?.items;
    ensure!(
        rest.is_empty(),
        "cliques left: {:?}",
        rest.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    );
    env.delete_pod("cq1-work-0").await?;
    env.wait_pod_gone("cq1-work-0").await?;
    Ok(())
}

/// The daemon claim's CDI spec mounts the domain directory at `/imexd` and its hosts file over
/// `/etc/hosts`.
fn ensure_hosts_mount(env: &Env, node: &str, dir: &std::path::Path) -> Result<()> {
    let mounts = cdi_mounts(env, node)?;
    let want_hosts = (
        dir.join("hosts").display().to_string(),
        "/etc/hosts".to_string(),
    );
    let want_dir = (dir.display().to_string(), "/imexd".to_string());
    ensure!(
        mounts.contains(&want_hosts) && mounts.contains(&want_dir),
        "{node}: CDI mounts {mounts:?}"
    );
    Ok(())
}

/// Every mount of the node's CDI specs, `(hostPath, containerPath)`.
fn cdi_mounts(env: &Env, node: &str) -> Result<Vec<(String, String)>> {
    let cdi = &env.node(node).dirs.cdi;
    let mut mounts: Vec<(String, String)> = Vec::new();
    for f in e2e::cdi::spec_files(cdi)? {
        let spec: Value = serde_json::from_str(&std::fs::read_to_string(&f)?).unwrap_or_default();
        for d in spec["devices"].as_array().into_iter().flatten() {
            for m in d["containerEdits"]["mounts"]
                .as_array()
                .into_iter()
                .flatten()
            {
                mounts.push((
                    m["hostPath"].as_str().unwrap_or_default().into(),
                    m["containerPath"].as_str().unwrap_or_default().into(),
                ));
            }
        }
    }
    Ok(mounts)
}

const IP_NODES: [&str; 2] = ["cq2-a", "cq2-b"];
const GATES_OFF: &str = "ComputeDomainCliques=false,IMEXDaemonsWithDNSNames=false";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cq2_ip_nodes_config_without_dns_names_through_the_kubelet() -> Result<()> {
    let mut env = env_or_skip!("cq2_ip_nodes_config_without_dns_names_through_the_kubelet");
    clique_nodes(&mut env, IP_NODES, &["--feature-gates", GATES_OFF]).await?;
    let mut controller =
        start_controller_with(&env, "computedomain", &[("FEATURE_GATES", GATES_OFF)])?;
    let daemonsets = WorkloadControllers::start_only(
        &env.kubeconfig,
        &env.work.join("cq2-daemonset-controller.log"),
        "daemonset-controller",
    )?;
    let outcome = ip_scenario(&env).await;
    drop(daemonsets);
    let _ = controller.kill().await;
    outcome?;
    env.check_violations()?;
    env.teardown().await
}

async fn ip_scenario(env: &Env) -> Result<()> {
    let cds = nvidia_ns_api(env, "ComputeDomain", "computedomains");
    let uid = domain_with_workloads(env, IP_NODES, "cq2").await?;

    // Both daemons in the status with their pod IPs and, from the node label, their clique.
    let ips = wait_until("both daemons in the domain status", WAIT, || async {
        let ips = daemon_ips(env, &uid).await?;
        let nodes = cds.get("cd1").await?.data["status"]["nodes"].clone();
        let listed = nodes.as_array().into_iter().flatten().all(|n| {
            n["cliqueID"] == CLIQUE
                && n["name"]
                    .as_str()
                    .and_then(|name| ips.get(name))
                    .is_some_and(|ip| n["ipAddress"] == ip.as_str())
        });
        let complete = ips.len() == 2 && nodes.as_array().is_some_and(|n| n.len() == 2);
        Ok((complete && listed).then_some(ips))
    })
    .await?;
    let mut sorted: Vec<&String> = ips.values().collect();
    sorted.sort();
    sorted.dedup();
    ensure!(sorted.len() == 2, "daemon pod IPs {ips:?}");
    let both: String = sorted.iter().map(|ip| format!("{ip}\n")).collect();

    for node in IP_NODES {
        let dir = domain_dir(env, node, &uid)?;
        wait_until(
            &format!("{node}: nodes.cfg lists both daemon IPs"),
            WAIT,
            || async {
                let text = std::fs::read_to_string(dir.join("nodes.cfg")).unwrap_or_default();
                Ok((text == both).then_some(()))
            },
        )
        .await?;
        let cfg = std::fs::read_to_string(dir.join("imexd.cfg"))?;
        ensure!(
            cfg.contains("IMEX_NODE_CONFIG_FILE=/imexd/nodes.cfg"),
            "{node} imexd.cfg: {cfg}"
        );
        ensure!(!dir.join("hosts").exists(), "{node}: a hosts file");
        let mounts = cdi_mounts(env, node)?;
        ensure!(
            mounts.contains(&(dir.display().to_string(), "/imexd".to_string()))
                && !mounts.iter().any(|m| m.1 == "/etc/hosts"),
            "{node}: CDI mounts {mounts:?}"
        );
    }
    println!("cq2: nodes.cfg {both:?}");

    // The second node leaves: the status lists one of two nodes, and, as NVIDIA's daemon waits for
    // numNodes, the first node's list stays as it was.
    env.delete_pod("cq2-work-1").await?;
    env.wait_pod_gone("cq2-work-1").await?;
    wait_until("the status without the second node", WAIT, || async {
        let nodes = cds.get("cd1").await?.data["status"]["nodes"].clone();
        Ok(nodes.as_array().is_some_and(|n| n.len() == 1).then_some(()))
    })
    .await?;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let kept = std::fs::read_to_string(domain_dir(env, IP_NODES[0], &uid)?.join("nodes.cfg"))?;
    ensure!(
        kept == both,
        "the first node's nodes.cfg changed to {kept:?}"
    );

    cds.delete("cd1", &DeleteParams::default()).await?;
    wait_until("the ComputeDomain gone", WAIT, || async {
        Ok(cds.get_opt("cd1").await?.is_none().then_some(()))
    })
    .await?;
    env.delete_pod("cq2-work-0").await?;
    env.wait_pod_gone("cq2-work-0").await?;
    Ok(())
}
