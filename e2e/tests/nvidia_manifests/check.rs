//! Checking a file's outcome against the table: pods, the devices of their claims, the CDI devices
//! each container reached the runtime with, the scheduler's reason for pods left Pending.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use e2e::env::{Env, WAIT, wait_until, yaml_docs};
use e2e::manifests::{self, Applied};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams};
use kube::discovery::Discovery;
use kube::{Client, ResourceExt};

use super::table::{Expect, Row, Share};

/// `(pool, device)` → the device's `type` attribute, from every slice of the driver.
pub type DeviceTypes = BTreeMap<(String, String), String>;

pub async fn device_types(client: &Client) -> Result<DeviceTypes> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let mut out = DeviceTypes::new();
    for s in api.list(&ListParams::default()).await?.items {
        if s.spec.driver != e2e::DRIVER {
            continue;
        }
        for d in s.spec.devices.unwrap_or_default() {
            let t = d
                .attributes
                .as_ref()
                .and_then(|a| a.get("type"))
                .and_then(|a| a.string.clone())
                .unwrap_or_default();
            out.insert((s.spec.pool.name.clone(), d.name), t);
        }
    }
    Ok(out)
}

/// The line printed for a row that is not applied; for `Unserved`, discovery must agree.
pub fn not_applied(discovery: &Discovery, module: &Path, row: &Row) -> Result<String> {
    match &row.expect {
        Expect::Unserved(why) => {
            let mut unserved = Vec::new();
            for (f, _) in row.file_list() {
                let docs = yaml_docs(&std::fs::read_to_string(module.join(f))?).unwrap_or_default();
                unserved.extend(manifests::unserved(discovery, &docs));
            }
            ensure!(
                !unserved.is_empty(),
                "{}: every API it uses is served",
                row.files
            );
            unserved.dedup();
            Ok(format!(
                "unserved  {:<55} {why}: {}",
                row.files,
                unserved.join(", ")
            ))
        }
        Expect::Listed(why) => Ok(format!("listed    {:<55} {why}", row.files)),
        _ => unreachable!("applied rows are run"),
    }
}

/// Waits for the outcome the row expects; returns a short summary of it.
pub async fn outcome(
    env: &Env,
    applied: &Applied,
    ns: &str,
    expect: &Expect,
    types: &DeviceTypes,
) -> Result<String> {
    let namespaces = applied.namespaces(ns);
    match expect {
        Expect::ApplyFails(text) => {
            let hit = applied.errors.iter().any(|e| e.contains(text));
            ensure!(
                hit,
                "expected an apply error with {text:?}, got {:?}",
                applied.errors
            );
            let pods = pods_of(&env.client, &namespaces).await?;
            ensure!(pods.is_empty(), "pods were created: {}", names(&pods));
            Ok(format!("apply refused: {}", applied.errors.join("; ")))
        }
        _ if !applied.errors.is_empty() => bail!("apply failed: {:?}", applied.errors),
        Expect::Run {
            pods,
            types: want,
            share,
        } => {
            let running = wait_pods(env, &namespaces, *pods, "Running", |p| {
                Ok(phase(p) == "Running")
            })
            .await?;
            check_devices(env, &running, want, *share, types).await
        }
        Expect::Pending { pods, reason } => {
            let p = wait_pods(env, &namespaces, *pods, "unschedulable", |p| {
                Ok(unschedulable(p).is_some_and(|m| m.contains(reason)))
            })
            .await?;
            Ok(format!(
                "Pending: {}",
                unschedulable(&p[0]).unwrap_or_default()
            ))
        }
        Expect::NotPrepared { pods, reason } => not_prepared(env, &namespaces, *pods, reason).await,
        Expect::Unserved(_) | Expect::Listed(_) => unreachable!("not applied"),
    }
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// The scheduler's message while it does not place the pod: Unschedulable (nothing fits), or
/// SchedulerError (a filter failed, e.g. a CEL runtime error in a selector).
fn unschedulable(p: &Pod) -> Option<String> {
    let conds = p.status.as_ref()?.conditions.as_ref()?;
    let c = conds.iter().find(|c| c.type_ == "PodScheduled")?;
    let reason = c.reason.as_deref();
    (c.status == "False" && matches!(reason, Some("Unschedulable" | "SchedulerError")))
        .then(|| c.message.clone().unwrap_or_default())
}

fn names(pods: &[Pod]) -> String {
    pods.iter()
        .map(|p| p.name_any())
        .collect::<Vec<_>>()
        .join(", ")
}

async fn pods_of(client: &Client, namespaces: &[String]) -> Result<Vec<Pod>> {
    let mut out = Vec::new();
    for ns in namespaces {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        out.extend(api.list(&ListParams::default()).await?.items);
    }
    Ok(out)
}

/// Waits until exactly `n` pods exist in `namespaces` and `ok` holds for each.
async fn wait_pods(
    env: &Env,
    namespaces: &[String],
    n: usize,
    what: &str,
    ok: impl Fn(&Pod) -> Result<bool>,
) -> Result<Vec<Pod>> {
    let ok = &ok;
    let r = wait_until(&format!("{n} pods {what}"), WAIT, || async move {
        let pods = pods_of(&env.client, namespaces).await?;
        let good = pods.iter().map(ok).collect::<Result<Vec<bool>>>()?;
        if pods.len() == n && good.iter().all(|g| *g) {
            return Ok(Some(pods));
        }
        bail!(
            "{} pods, {} {what}",
            pods.len(),
            good.iter().filter(|g| **g).count()
        )
    })
    .await;
    if r.is_err() {
        for p in pods_of(&env.client, namespaces).await.unwrap_or_default() {
            println!(
                "nm1: pod {}/{}: {}",
                p.namespace().unwrap_or_default(),
                p.name_any(),
                serde_json::to_string(&p.status).unwrap_or_default()
            );
        }
    }
    r
}

/// A pod's claims: (name in the pod, claim); the extended-resource claim under "".
async fn pod_claims(client: &Client, pod: &Pod) -> Result<Vec<(String, ResourceClaim)>> {
    let ns = pod.namespace().unwrap_or_default();
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
    let status = pod.status.clone().unwrap_or_default();
    let generated = status.resource_claim_statuses.unwrap_or_default();
    let mut out = Vec::new();
    for rc in pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.clone())
        .unwrap_or_default()
    {
        let name = match rc.resource_claim_name {
            Some(n) => n,
            None => generated
                .iter()
                .find(|s| s.name == rc.name)
                .and_then(|s| s.resource_claim_name.clone())
                .with_context(|| format!("pod {}: no claim for {}", pod.name_any(), rc.name))?,
        };
        out.push((rc.name, api.get(&name).await?));
    }
    if let Some(ext) = status.extended_resource_claim_status {
        out.push((String::new(), api.get(&ext.resource_claim_name).await?));
    }
    Ok(out)
}

/// One allocated device of a claim: `(claim uid, request, pool, device)`.
type Dev = (String, String, String, String);

fn devices_of(claim: &ResourceClaim) -> Vec<Dev> {
    let uid = claim.uid().unwrap_or_default();
    e2e::env::allocation_results(claim)
        .into_iter()
        .filter(|r| r.driver == e2e::DRIVER)
        .map(|r| (uid.clone(), r.request, r.pool, r.device))
        .collect()
}

/// Types per pod, distinct/shared devices, and the CDI devices of every container at the runtime.
async fn check_devices(
    env: &Env,
    pods: &[Pod],
    want: &[&str],
    share: Share,
    types: &DeviceTypes,
) -> Result<String> {
    let mut by_claim: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    let mut per_pod = Vec::new();
    for pod in pods {
        let claims = pod_claims(&env.client, pod).await?;
        let devs: Vec<Dev> = claims.iter().flat_map(|(_, c)| devices_of(c)).collect();
        let mut got: Vec<String> = devs
            .iter()
            .map(|(_, _, pool, d)| {
                types
                    .get(&(pool.clone(), d.clone()))
                    .cloned()
                    .unwrap_or_else(|| format!("?{d}"))
            })
            .collect();
        got.sort();
        ensure!(
            got == want,
            "pod {}: device types {got:?}, expected {want:?} ({devs:?})",
            pod.name_any()
        );
        for (uid, _, pool, d) in &devs {
            by_claim
                .entry(uid.clone())
                .or_default()
                .insert((pool.clone(), d.clone()));
        }
        check_cdi(env, pod, &claims)?;
        let set: BTreeSet<(String, String)> = devs
            .iter()
            .map(|(_, _, p, d)| (p.clone(), d.clone()))
            .collect();
        per_pod.push(set);
    }
    check_share(share, &by_claim, &per_pod)?;
    let shown: Vec<String> = per_pod
        .iter()
        .map(|s| {
            s.iter()
                .map(|(p, d)| format!("{p}/{d}"))
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    Ok(format!("{} Running: {}", pods.len(), shown.join(", ")))
}

/// The claims' devices against the row's `share`.
fn check_share(
    share: Share,
    by_claim: &BTreeMap<String, BTreeSet<(String, String)>>,
    per_pod: &[BTreeSet<(String, String)>],
) -> Result<()> {
    // How many claims hold each device.
    let mut holders: BTreeMap<&(String, String), usize> = BTreeMap::new();
    for d in by_claim.values().flatten() {
        *holders.entry(d).or_default() += 1;
    }
    match share {
        Share::One => ensure!(per_pod.len() == 1, "{} pods", per_pod.len()),
        Share::Same => ensure!(
            per_pod.windows(2).all(|w| w[0] == w[1]),
            "pods got different devices: {per_pod:?}"
        ),
        Share::Distinct => ensure!(
            holders.values().all(|n| *n == 1),
            "a device in two claims: {by_claim:?}"
        ),
        Share::UpTo(max) => ensure!(
            holders.values().any(|n| *n > 1) && holders.values().all(|n| *n <= max),
            "want some device in 2 to {max} claims: {by_claim:?}"
        ),
    }
    Ok(())
}

/// Each container reached the runtime with a CDI device for every device of the claims (and
/// requests) it names, and with none of another claim.
fn check_cdi(env: &Env, pod: &Pod, claims: &[(String, ResourceClaim)]) -> Result<()> {
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let uid = pod.uid().unwrap_or_default();
    let records = env
        .node(&node)
        .kubelet
        .stock()
        .context("stock kubelet")?
        .containers()?;
    let uids: Vec<String> = claims
        .iter()
        .map(|(_, c)| c.uid().unwrap_or_default())
        .collect();
    let mappings = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .map(|e| e.request_mappings.clone())
        .unwrap_or_default();
    for c in pod
        .spec
        .as_ref()
        .map(|s| s.containers.clone())
        .unwrap_or_default()
    {
        let ids: BTreeSet<String> = records
            .iter()
            .filter(|r| r.pod_uid == uid && r.container == c.name && r.error.is_empty())
            .flat_map(|r| r.cdi_devices.clone())
            .collect();
        let mut want: Vec<String> = Vec::new();
        let refs = c
            .resources
            .as_ref()
            .and_then(|r| r.claims.clone())
            .unwrap_or_default();
        for r in refs {
            let claim = claims.iter().find(|(n, _)| *n == r.name).map(|(_, c)| c);
            for (cuid, req, _, dev) in claim.map(devices_of).unwrap_or_default() {
                let named = r
                    .request
                    .as_ref()
                    .is_none_or(|q| req == *q || req.starts_with(&format!("{q}/")));
                if named {
                    want.push(format!("={cuid}-{dev}"));
                }
            }
        }
        for m in mappings.iter().filter(|m| m.container_name == c.name) {
            let claim = claims.iter().find(|(n, _)| n.is_empty()).map(|(_, c)| c);
            for (cuid, req, _, dev) in claim.map(devices_of).unwrap_or_default() {
                if req == m.request_name {
                    want.push(format!("={cuid}-{dev}"));
                }
            }
        }
        for w in &want {
            ensure!(
                ids.iter().any(|i| i.ends_with(w.as_str())),
                "container {}/{}: runtime got {ids:?}, no {w}",
                pod.name_any(),
                c.name
            );
        }
        let foreign: Vec<&String> = ids
            .iter()
            .filter(|i| !uids.iter().any(|u| i.contains(&format!("={u}-"))))
            .collect();
        ensure!(
            foreign.is_empty(),
            "container {}/{}: CDI devices of other claims {foreign:?}",
            pod.name_any(),
            c.name
        );
        ensure!(
            want.is_empty() || !ids.is_empty(),
            "container {} got no CDI device",
            c.name
        );
    }
    Ok(())
}

/// Pods scheduled but never started: the kubelet reports the prepare failure as an Event.
async fn not_prepared(env: &Env, namespaces: &[String], n: usize, reason: &str) -> Result<String> {
    let pods = wait_pods(env, namespaces, n, "scheduled", |p| {
        Ok(p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
    })
    .await?;
    let msg = wait_until(
        &format!("a prepare failure mentioning {reason}"),
        WAIT,
        || async {
            for p in &pods {
                let ns = p.namespace().unwrap_or_default();
                let events: Api<Event> = Api::namespaced(env.client.clone(), &ns);
                let lp =
                    ListParams::default().fields(&format!("involvedObject.name={}", p.name_any()));
                for e in events.list(&lp).await?.items {
                    let m = e.message.unwrap_or_default();
                    if m.contains(reason) {
                        return Ok(Some(m));
                    }
                }
            }
            Ok(None)
        },
    )
    .await?;
    for p in pods_of(&env.client, namespaces).await? {
        ensure!(phase(&p) != "Running", "pod {} runs", p.name_any());
    }
    Ok(format!("not prepared: {msg}"))
}
