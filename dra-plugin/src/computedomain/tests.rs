use std::sync::Mutex;

use serde_json::json;

use super::*;
use dra_plugin_core::types::{ClaimRef, ConfigEntry, ConfigSource};

#[derive(Default)]
struct FakeLabeler(Mutex<Option<String>>);

impl NodeLabeler for FakeLabeler {
    fn current(&self) -> BoxFuture<'_, Result<Option<String>, Error>> {
        Box::pin(async move { Ok(self.0.lock().unwrap().clone()) })
    }
    fn set<'a>(&'a self, domain: Option<&'a str>) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            *self.0.lock().unwrap() = domain.map(str::to_string);
            Ok(())
        })
    }
    fn clique_id(&self) -> BoxFuture<'_, Result<Option<String>, Error>> {
        Box::pin(async { Ok(Some("fabric-1.3".to_string())) })
    }
}

struct Fixture {
    dir: tempfile::TempDir,
    state: ComputeDomainState,
    labeler: Arc<FakeLabeler>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let channels = dir.path().join("channels");
    std::fs::create_dir_all(&channels).unwrap();
    for n in [0, 1, 2] {
        std::fs::write(channels.join(format!("channel{n}")), "").unwrap();
    }
    let (cp, _) = Checkpoint::load(&dir.path().join("checkpoint.json"), "boot").unwrap();
    let labeler = Arc::new(FakeLabeler::default());
    let state = ComputeDomainState::new(
        cp,
        dir.path().join("cdi"),
        dir.path().join("plugin"),
        channels,
        Some(labeler.clone() as Arc<dyn NodeLabeler>),
    );
    Fixture {
        dir,
        state,
        labeler,
    }
}

fn claim(uid: &str, device: &str, kind: &str, params: serde_json::Value) -> ClaimAllocation {
    let mut p = params;
    p["apiVersion"] = json!("resource.nvidia.com/v1beta1");
    p["kind"] = json!(kind);
    ClaimAllocation {
        claim: ClaimRef {
            uid: uid.into(),
            namespace: "ns".into(),
            name: format!("c-{uid}"),
        },
        pod_claim_name: None,
        devices: vec![AllocatedDevice {
            request: "channel".into(),
            pool: "n1".into(),
            device: device.into(),
            admin_access: false,
            share_id: None,
        }],
        configs: vec![ConfigEntry {
            source: ConfigSource::Claim,
            requests: vec![],
            parameters: p,
            path: "config[0].opaque.parameters".into(),
        }],
    }
}

fn spec(f: &Fixture, uid: &str) -> Spec {
    serde_json::from_slice(&std::fs::read(f.state.spec_path(uid)).unwrap()).unwrap()
}

#[test]
fn publishes_one_channel_and_one_daemon_device() {
    let pool = pool_contents();
    let names: Vec<_> = pool[0].devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["channel-0", "daemon-0"]);
    let attrs = pool[0].devices[0].attributes.as_ref().unwrap();
    assert_eq!(attrs["type"].string.as_deref(), Some("channel"));
    assert_eq!(attrs["id"].int, Some(0));
}

#[tokio::test]
async fn a_channel_claim_gets_its_device_node_and_labels_the_node() {
    let f = fixture();
    let c = claim(
        "u1",
        "channel-0",
        "ComputeDomainChannelConfig",
        json!({"domainID": "d-1"}),
    );
    let devices = f.state.prepare(&c).await.unwrap();
    assert_eq!(
        devices[0].cdi_device_ids,
        ["k8s.compute-domain.nvidia.com/claim=u1-channel-0"]
    );
    let s = spec(&f, "u1");
    assert_eq!(s.kind, "k8s.compute-domain.nvidia.com/claim");
    assert_eq!(
        s.devices[0].container_edits.device_nodes,
        [DeviceNode {
            path: "/dev/nvidia-caps-imex-channels/channel0".into()
        }]
    );
    assert_eq!(f.labeler.0.lock().unwrap().as_deref(), Some("d-1"));
    assert_eq!(f.state.prepare(&c).await.unwrap(), devices, "idempotent");

    // Another domain's channel cannot share the node.
    let other = claim(
        "u2",
        "channel-0",
        "ComputeDomainChannelConfig",
        json!({"domainID": "d-2"}),
    );
    let e = f.state.prepare(&other).await.unwrap_err().to_string();
    assert!(e.contains("d-1") && e.contains("d-2"), "{e}");
    // The same domain can (a second pod of the workload).
    f.state
        .prepare(&claim(
            "u3",
            "channel-0",
            "ComputeDomainChannelConfig",
            json!({"domainID": "d-1", "allocationMode": "All"}),
        ))
        .await
        .unwrap();
    let nodes: Vec<_> = spec(&f, "u3").devices[0]
        .container_edits
        .device_nodes
        .iter()
        .map(|n| n.path.clone())
        .collect();
    assert_eq!(nodes.len(), 3, "All injects every channel: {nodes:?}");

    f.state.unprepare("u1").await.unwrap();
    assert_eq!(
        f.labeler.0.lock().unwrap().as_deref(),
        Some("d-1"),
        "u3 still holds the domain"
    );
    f.state.unprepare("u3").await.unwrap();
    assert_eq!(
        *f.labeler.0.lock().unwrap(),
        None,
        "label released with the last channel"
    );
    assert!(!f.state.spec_path("u1").exists());
    f.state.unprepare("unknown").await.unwrap();
}

#[tokio::test]
async fn a_daemon_claim_gets_its_domain_directory() {
    let f = fixture();
    f.state
        .prepare(&claim(
            "u1",
            "daemon-0",
            "ComputeDomainDaemonConfig",
            json!({"domainID": "d-9"}),
        ))
        .await
        .unwrap();
    let s = spec(&f, "u1");
    let m = &s.devices[0].container_edits.mounts[0];
    assert_eq!(m.container_path, "/imexd");
    assert!(
        std::path::Path::new(&m.host_path)
            .join("imexd.cfg")
            .exists()
    );
    assert_eq!(
        s.devices[0].container_edits.env,
        ["COMPUTE_DOMAIN_UUID=d-9", "CLIQUE_ID=fabric-1.3"]
    );
    assert_eq!(*f.labeler.0.lock().unwrap(), None, "daemons do not label");
    let _ = &f.dir;
}

#[derive(Default)]
struct FakeFollower(Mutex<Vec<String>>);

impl follow::PeerFollower for FakeFollower {
    fn follow(&self, uid: &str, namespace: &str, path: PathBuf) {
        self.0
            .lock()
            .unwrap()
            .push(format!("follow {uid} {namespace} {}", path.display()));
    }
    fn stop(&self, uid: &str) {
        self.0.lock().unwrap().push(format!("stop {uid}"));
    }
}

/// A fixture whose daemons find their peers as `peers` says, with a recording follower.
fn followed_fixture(peers: Peers) -> (Fixture, Arc<FakeFollower>) {
    let f = fixture();
    let follower = Arc::new(FakeFollower::default());
    let state = f.state.with_peers(
        peers,
        Some(follower.clone() as Arc<dyn follow::PeerFollower>),
    );
    let f = Fixture { state, ..f };
    (f, follower)
}

#[tokio::test]
async fn dns_names_give_the_daemon_a_name_list_and_a_followed_hosts_file() {
    let (f, follower) = followed_fixture(Peers::DnsNames { max_nodes: 3 });
    f.state
        .prepare(&claim(
            "u1",
            "daemon-0",
            "ComputeDomainDaemonConfig",
            json!({"domainID": "d-9"}),
        ))
        .await
        .unwrap();
    let s = spec(&f, "u1");
    let mounts: Vec<(&str, &str)> = s.devices[0]
        .container_edits
        .mounts
        .iter()
        .map(|m| (m.host_path.as_str(), m.container_path.as_str()))
        .collect();
    let dir = f.dir.path().join("plugin/domains/d-9");
    let hosts_path = dir.join("hosts");
    assert_eq!(
        mounts,
        [
            (dir.to_str().unwrap(), "/imexd"),
            (hosts_path.to_str().unwrap(), "/etc/hosts")
        ]
    );
    let cfg = std::fs::read_to_string(dir.join("imexd.cfg")).unwrap();
    assert!(
        cfg.contains("IMEX_NODE_CONFIG_FILE=/imexd/nodes.cfg"),
        "{cfg}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("nodes.cfg")).unwrap(),
        "compute-domain-daemon-0000\ncompute-domain-daemon-0001\ncompute-domain-daemon-0002\n"
    );
    let hosts_text = std::fs::read_to_string(&hosts_path).unwrap();
    assert!(
        hosts_text.starts_with("127.0.0.1\tlocalhost\n"),
        "{hosts_text}"
    );
    assert_eq!(
        *follower.0.lock().unwrap(),
        [format!("follow d-9 ns {}", hosts_path.display())]
    );
    f.state.unprepare("u1").await.unwrap();
    assert_eq!(follower.0.lock().unwrap().last().unwrap(), "stop d-9");
}

/// `IMEXDaemonsWithDNSNames` off: the nodes config starts empty (the daemon waits), the follower
/// keeps it, and a re-prepare after a restart keeps the list it has.
#[tokio::test]
async fn without_dns_names_the_follower_keeps_an_ip_list() {
    let (f, follower) = followed_fixture(Peers::Ips);
    let daemon = claim(
        "u1",
        "daemon-0",
        "ComputeDomainDaemonConfig",
        json!({"domainID": "d-9"}),
    );
    f.state.prepare(&daemon).await.unwrap();
    let dir = f.dir.path().join("plugin/domains/d-9");
    let nodes = dir.join("nodes.cfg");
    let mounts: Vec<String> = spec(&f, "u1").devices[0]
        .container_edits
        .mounts
        .iter()
        .map(|m| m.container_path.clone())
        .collect();
    assert_eq!(mounts, ["/imexd"], "no hosts file without DNS names");
    let cfg = std::fs::read_to_string(dir.join("imexd.cfg")).unwrap();
    assert!(
        cfg.contains("IMEX_NODE_CONFIG_FILE=/imexd/nodes.cfg"),
        "{cfg}"
    );
    assert_eq!(std::fs::read_to_string(&nodes).unwrap(), "");
    assert_eq!(
        *follower.0.lock().unwrap(),
        [format!("follow d-9 ns {}", nodes.display())]
    );

    std::fs::write(&nodes, "10.0.0.1\n10.0.0.2\n").unwrap();
    f.state.unprepare("u1").await.unwrap();
    f.state.prepare(&daemon).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(&nodes).unwrap(),
        "10.0.0.1\n10.0.0.2\n"
    );
}

#[test]
fn the_hosts_mapping_is_the_clique_that_lists_this_node() {
    let c = |name: &str, nodes: &[(&str, &str, i32)]| {
        let v = json!({
            "metadata": { "name": name },
            "daemons": nodes.iter().map(|(n, ip, i)| json!({
                "nodeName": n, "ipAddress": ip, "cliqueID": "c", "index": i, "status": "Ready",
            })).collect::<Vec<_>>(),
        });
        Arc::new(serde_json::from_value(v).unwrap())
    };
    let cliques = vec![
        c("d.c1", &[("x", "10.0.0.9", 0)]),
        c("d.c2", &[("me", "10.0.0.1", 0), ("y", "10.0.0.2", 1)]),
    ];
    assert_eq!(
        hosts::mapping_for(&cliques, "me"),
        "10.0.0.1\tcompute-domain-daemon-0000\n10.0.0.2\tcompute-domain-daemon-0001\n"
    );
    assert_eq!(hosts::mapping_for(&cliques, "nobody"), "");
}

#[tokio::test]
async fn bad_configs_are_per_claim_errors_naming_the_field() {
    let f = fixture();
    let cases = [
        (
            claim(
                "a",
                "channel-0",
                "ComputeDomainChannelConfig",
                json!({"domainId": "x"}),
            ),
            "domainId",
        ),
        (
            claim(
                "b",
                "channel-0",
                "ComputeDomainDaemonConfig",
                json!({"domainID": "x"}),
            ),
            "no opaque ComputeDomainChannelConfig",
        ),
        (
            claim(
                "c",
                "channel-0",
                "ComputeDomainChannelConfig",
                json!({"domainID": ""}),
            ),
            "config[0].opaque.parameters.domainID",
        ),
        (
            claim("e", "channel-0", "GpuConfig", json!({})),
            "config[0].opaque.parameters.kind",
        ),
        (
            claim(
                "d",
                "gpu-0",
                "ComputeDomainChannelConfig",
                json!({"domainID": "x"}),
            ),
            "not a device",
        ),
    ];
    for (c, want) in cases {
        let e = f.state.prepare(&c).await.unwrap_err().to_string();
        assert!(e.contains(want), "{}: {e}", c.claim.uid);
    }
    assert!(f.state.checkpoint().claims().is_empty());
}

#[tokio::test]
async fn allocation_mode_is_read_as_nvidia_reads_it() {
    let f = fixture();
    // Only the exact spelling `All` injects every channel; any other value is one channel.
    for (uid, mode, want) in [
        ("m1", json!("All"), 3),
        ("m2", json!("all"), 1),
        ("m3", json!("Single"), 1),
        ("m4", json!("whatever"), 1),
        ("m5", json!(null), 1),
    ] {
        f.state
            .prepare(&claim(
                uid,
                "channel-0",
                "ComputeDomainChannelConfig",
                json!({"domainID": "d-1", "allocationMode": mode}),
            ))
            .await
            .unwrap();
        assert_eq!(
            spec(&f, uid).devices[0].container_edits.device_nodes.len(),
            want,
            "{mode}"
        );
        f.state.unprepare(uid).await.unwrap();
    }
}

#[tokio::test]
async fn configs_are_chosen_and_checked_as_nvidia_does() {
    let f = fixture();
    let entry = |requests: &[&str], kind: &str, body: serde_json::Value, i: usize| {
        let mut p = body;
        p["apiVersion"] = json!("resource.nvidia.com/v1beta1");
        p["kind"] = json!(kind);
        ConfigEntry {
            source: ConfigSource::Claim,
            requests: requests.iter().map(|r| r.to_string()).collect(),
            parameters: p,
            path: format!("config[{i}].opaque.parameters"),
        }
    };
    let with = |uid: &str, configs: Vec<ConfigEntry>| {
        let mut c = claim(uid, "channel-0", "ComputeDomainChannelConfig", json!({}));
        c.configs = configs;
        c
    };
    // A request-less daemon config does not apply to a channel; the channel config below it does.
    f.state
        .prepare(&with(
            "p1",
            vec![
                entry(
                    &[],
                    "ComputeDomainChannelConfig",
                    json!({"domainID": "d-1"}),
                    0,
                ),
                entry(
                    &[],
                    "ComputeDomainDaemonConfig",
                    json!({"domainID": "d-9"}),
                    1,
                ),
            ],
        ))
        .await
        .unwrap();
    f.state.unprepare("p1").await.unwrap();
    let refused = [
        // Naming the channel's request with a daemon config.
        (
            with(
                "p2",
                vec![entry(
                    &["channel"],
                    "ComputeDomainDaemonConfig",
                    json!({"domainID": "d-1"}),
                    0,
                )],
            ),
            "config[0].opaque.parameters",
        ),
        // A malformed config that applies to no device still fails the claim.
        (
            with(
                "p3",
                vec![
                    entry(
                        &[],
                        "ComputeDomainChannelConfig",
                        json!({"domainID": "d-1"}),
                        0,
                    ),
                    entry(
                        &["other"],
                        "ComputeDomainChannelConfig",
                        json!({"domainID": "d-1", "mode": "All"}),
                        1,
                    ),
                ],
            ),
            "config[1].opaque.parameters.mode",
        ),
    ];
    for (c, want) in refused {
        let e = f.state.prepare(&c).await.unwrap_err().to_string();
        assert!(e.contains(want), "{}: {e}", c.claim.uid);
    }
}
