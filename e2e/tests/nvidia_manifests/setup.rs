//! The node setups the table's files run on: which hardware each node's plugin simulates and with
//! which flags (NVIDIA's Helm values of the bats file or demo), and switching the two nodes from one
//! setup to the next as `helm upgrade` does between NVIDIA's bats files.
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use e2e::env::{Env, WAIT, wait_until};
use e2e::plugin::Plugin;
use gpu_dra_api::simulated::{GpuGroup, simulate_node};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams};

use crate::fake_pci::{FakePci, NVIDIA, VFIO_PCI};

pub const NODES: [&str; 2] = ["nv-0", "nv-1"];

/// `demo/specs/quickstart/mig-parted-config.yaml`'s `half-balanced`: GPUs 0-3 with two 1g.5gb, a
/// 2g.10gb and a 3g.20gb each, 4-7 whole (the machine of the quickstart README).
const HALF_BALANCED: &str = "gpus:
- {profile: a100-40gb, count: 4, migLayout: '1g.5gb,1g.5gb,2g.10gb,3g.20gb'}
- {profile: a100-40gb, count: 4, migLayout: disabled}
";

/// The passthrough node's GPUs: enough for the fabric-manager demo's two GPUs per claim.
const VFIO_PROFILE: &str = "h100-80gb:4";

/// What the plugins of `nv-0` and `nv-1` run with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Setup {
    /// nv-0: A100 40GB ×8 half-balanced (static MIG), nv-1: H100 80GB ×8; both with
    /// TimeSlicingSettings and MPSSupport (test_gpu_sharing's values).
    Standard,
    /// nv-0: H100 NVL ×8 with DynamicMIG and TimeSlicingSettings (test_gpu_dynmig's values; NVIDIA
    /// refuses DynamicMIG with MPSSupport); nv-1 no plugin.
    DynMig,
    /// nv-0: H100 80GB ×8 with ConsumableShares and `--consumable-shares MODE`; nv-1 no plugin.
    Shares(&'static str),
    /// nv-0: H100 80GB ×4 with PassthroughSupport on a fake PCI bus (`vfio/fake_pci.rs`), no NVSwitch
    /// fabric; nv-1 no plugin.
    Vfio,
    /// nv-0: GB200 ×4 with the compute-domain plugin beside the GPU plugin; nv-1 no plugin.
    ComputeDomain,
}

const CD_DRIVER: &str = "compute-domain.nvidia.com";

/// What the setups need on the host: the hardware file of the static-MIG node and nv-0's fake PCI
/// bus, both kept for the whole test.
pub struct Host {
    hw: PathBuf,
    pub pci: FakePci,
}

impl Host {
    pub fn create(work: &Path) -> Result<Host> {
        let hw = work.join("nv-half-balanced.yaml");
        std::fs::write(&hw, HALF_BALANCED)?;
        let pci = FakePci::start(&work.join("nv-0-host"), &pci_functions()?)?;
        Ok(Host { hw, pci })
    }

    /// After the passthrough files: a GPU was bound to vfio-pci (for gpu-test-vfiopci's pod),
    /// every GPU is back on nvidia, and the fake kernel refused no write.
    pub async fn check_pci(&self) -> Result<()> {
        let addrs: Vec<String> = pci_functions()?.into_iter().map(|f| f.0).collect();
        wait_until("nv-0's GPUs back on nvidia", WAIT, || async {
            Ok(addrs
                .iter()
                .all(|a| self.pci.driver_of(a).as_deref() == Some(NVIDIA))
                .then_some(()))
        })
        .await?;
        let log = self.pci.log();
        ensure!(
            !log.iter().any(|l| l.contains("refused")),
            "the fake kernel refused writes: {log:?}"
        );
        let bound = format!("{VFIO_PCI}/bind ");
        ensure!(
            log.iter().any(|l| l.starts_with(&bound)),
            "no GPU was bound to {VFIO_PCI}: {log:?}"
        );
        Ok(())
    }
}

/// `(PCI address, IOMMU group, PCI device ID)` of each GPU the Vfio setup's plugin simulates.
fn pci_functions() -> Result<Vec<(String, u32, u16)>> {
    let inv = simulate_node(NODES[0], &[GpuGroup::parse(VFIO_PROFILE)?], None)?;
    inv.gpus
        .iter()
        .map(|g| {
            let p = g.pci.as_ref().context("a simulated GPU without PCI")?;
            let group = p.iommu_group.context("a simulated GPU without group")?;
            Ok((g.pci_bus_id.clone(), group, p.device_id))
        })
        .collect()
}

impl Setup {
    /// In the order they run; the first starts the nodes, so it has a plugin on each.
    pub const ALL: [Setup; 7] = [
        Setup::Standard,
        Setup::DynMig,
        Setup::Shares("4"),
        Setup::Shares("memory"),
        Setup::Shares("unlimited"),
        Setup::Vfio,
        Setup::ComputeDomain,
    ];

    pub fn slug(self) -> String {
        match self {
            Setup::Standard => "std".into(),
            Setup::DynMig => "dynmig".into(),
            Setup::Shares(m) => format!("shares-{m}"),
            Setup::Vfio => "vfio".into(),
            Setup::ComputeDomain => "cd".into(),
        }
    }

    /// The plugin flags of node `i`, `None` for no plugin.
    fn plugin_args(self, i: usize, host: &Host) -> Option<Vec<String>> {
        let v = |a: &[&str]| Some(a.iter().map(|s| s.to_string()).collect());
        let sharing = "TimeSlicingSettings=true,MPSSupport=true";
        match (self, i) {
            (Setup::Standard, 0) => v(&[
                "--hardware-file",
                &host.hw.display().to_string(),
                "--feature-gates",
                sharing,
            ]),
            (Setup::Standard, _) => v(&["--profile", "h100-80gb:8", "--feature-gates", sharing]),
            (Setup::DynMig, 0) => v(&[
                "--profile",
                "h100-nvl:8",
                "--feature-gates",
                "DynamicMIG=true,TimeSlicingSettings=true",
            ]),
            (Setup::Shares(mode), 0) => v(&[
                "--profile",
                "h100-80gb:8",
                "--feature-gates",
                "ConsumableShares=true,MPSSupport=true",
                "--consumable-shares",
                mode,
            ]),
            (Setup::Vfio, 0) => v(&[
                "--profile",
                VFIO_PROFILE,
                "--feature-gates",
                "PassthroughSupport=true",
                "--host-sysfs-root",
                &host.pci.sys.display().to_string(),
                "--host-dev-root",
                &host.pci.dev.display().to_string(),
            ]),
            (Setup::ComputeDomain, 0) => v(&["--profile", "gb200:4"]),
            _ => None,
        }
    }
}

/// Brings both nodes to `to`: new nodes on the first call, else each plugin stopped, its slices
/// deleted and started again with the setup's flags (no plugin where the setup has none).
pub async fn switch(env: &mut Env, from: Option<Setup>, to: Setup, host: &Host) -> Result<()> {
    for (i, node) in NODES.iter().enumerate() {
        let args = to.plugin_args(i, host);
        let argv: Vec<&str> = args.iter().flatten().map(String::as_str).collect();
        if from.is_none() {
            // A stock kubelet per node for the whole test; a node without plugin has no slices.
            env.add_node(node, &argv).await?;
            if args.is_none() {
                stop_plugin(env, node).await?;
            }
            continue;
        }
        stop_plugin(env, node).await?;
        if args.is_some() {
            let before = env.registrations(node);
            let n = env.node(node);
            let plugin = Plugin::start(&env.plugin_bin, node, &env.kubeconfig, &n.dirs, &argv)?;
            env.node_mut(node).plugin = plugin;
            env.wait_registered(node, before).await?;
            env.wait_slices(node).await?;
            if to == Setup::ComputeDomain {
                env.add_plugin(node, CD_DRIVER, &[]).await?;
            }
        }
    }
    println!("nm1: setup {to:?}");
    Ok(())
}

/// Stops the node's plugins and deletes their slices, so no file of the next setup is scheduled
/// against devices of the previous one.
async fn stop_plugin(env: &mut Env, node: &str) -> Result<()> {
    let n = env.node_mut(node);
    n.plugin.stop().await?;
    for mut p in std::mem::take(&mut n.more_plugins) {
        p.stop().await?;
    }
    let api: Api<ResourceSlice> = Api::all(env.client.clone());
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    api.delete_collection(&DeleteParams::default(), &lp).await?;
    wait_until(&format!("slices of {node} gone"), WAIT, || async {
        Ok(api.list(&lp).await?.items.is_empty().then_some(()))
    })
    .await
}
