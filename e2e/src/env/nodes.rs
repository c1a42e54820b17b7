//! Adding nodes to a scenario: a stock kubelet per node (the default), the kubelet-role harness,
//! more plugins on a node, and waiting for the kubelet's registrations.
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{Env, NodeEnv, WAIT, create_node};
use crate::kubelet::Kubelet;
use crate::node_kubelet::NodeKubelet;
use crate::plugin::{NodeDirs, Plugin};
use crate::real_kubelet::RealKubelet;

impl Env {
    /// For tests that inject what the stock kubelet never sends: creates the Node object (Ready,
    /// capacity, no taints, label `e2e-test=<test>`), starts its plugin with `plugin_args` and the
    /// Rust kubelet-role harness, and waits for the plugin's ResourceSlices.
    pub async fn add_harness_node(&mut self, name: &str, plugin_args: &[&str]) -> Result<&NodeEnv> {
        create_node(&self.client, name, &self.test).await?;
        let dirs = NodeDirs::create(&self.work, name)?;
        let mut plugin =
            Plugin::start(&self.plugin_bin, name, &self.kubeconfig, &dirs, plugin_args)?;
        let kubelet =
            match Kubelet::start(self.client.clone(), name, &dirs.registrar, &dirs.cdi, WAIT).await
            {
                Ok(k) => k,
                Err(e) => {
                    plugin.check_alive()?;
                    return Err(e);
                }
            };
        self.nodes.push(NodeEnv {
            name: name.to_string(),
            plugin,
            kubelet: NodeKubelet::Harness(kubelet),
            dirs,
            more_plugins: Vec::new(),
        });
        self.wait_slices(name).await?;
        Ok(self.nodes.last().expect("just pushed"))
    }

    /// Starts a stock kubelet and fake runtime for `name` (the kubelet registers the Node), then
    /// the node's plugin with `plugin_args` in the kubelet's plugin directories; waits until the
    /// kubelet has registered the plugin and the plugin's ResourceSlices are complete.
    pub async fn add_node(&mut self, name: &str, plugin_args: &[&str]) -> Result<&NodeEnv> {
        let setup = self.kubelet_setup.clone().context(
            "no stock kubelet: run through e2e/run.sh (E2E_KUBELET_BIN, E2E_KUBELET_TOOLS)",
        )?;
        let mut dirs = NodeDirs::create(&self.work, name)?;
        let kubelet = RealKubelet::start(
            &self.client,
            &setup,
            name,
            &self.test,
            &dirs.root,
            &dirs.cdi,
        )
        .await?;
        dirs.registrar = kubelet.registrar_dir();
        dirs.plugin = kubelet.plugin_dir(crate::DRIVER);
        for d in [&dirs.registrar, &dirs.plugin] {
            std::fs::create_dir_all(d)?;
        }
        let plugin = Plugin::start(&self.plugin_bin, name, &self.kubeconfig, &dirs, plugin_args)?;
        self.nodes.push(NodeEnv {
            name: name.to_string(),
            plugin,
            kubelet: NodeKubelet::Stock(Box::new(kubelet)),
            dirs,
            more_plugins: Vec::new(),
        });
        self.wait_registered(name, 0).await?;
        self.wait_slices(name).await?;
        Ok(self.nodes.last().expect("just pushed"))
    }

    /// Starts a second plugin on the stock-kubelet node `name` for another driver
    /// (`--driver-name driver`, e.g. compute-domain.nvidia.com) with its own plugin directory and
    /// log (`<node dir>/<driver>/plugin.log`), and waits until the kubelet has registered it.
    pub async fn add_plugin(
        &mut self,
        name: &str,
        driver: &str,
        plugin_args: &[&str],
    ) -> Result<()> {
        let (plugin_bin, kubeconfig) = (self.plugin_bin.clone(), self.kubeconfig.clone());
        let node = self.node_mut(name);
        let kubelet = node
            .kubelet
            .stock()
            .context("add_plugin needs a stock-kubelet node")?;
        let dirs = NodeDirs {
            root: node.dirs.root.join(driver),
            registrar: node.dirs.registrar.clone(),
            plugin: kubelet.plugin_dir(driver),
            cdi: node.dirs.cdi.clone(),
        };
        for d in [&dirs.root, &dirs.plugin] {
            std::fs::create_dir_all(d)?;
        }
        let mut args = vec!["--driver-name", driver];
        args.extend(plugin_args);
        let mut plugin = Plugin::start(&plugin_bin, name, &kubeconfig, &dirs, &args)?;
        let log = dirs.root.join("plugin.log");
        let deadline = Instant::now() + WAIT;
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("registered with the kubelet")
        {
            plugin.check_alive()?;
            if Instant::now() > deadline {
                bail!("the kubelet of {name} did not register the {driver} plugin within {WAIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        node.more_plugins.push(plugin);
        Ok(())
    }

    /// How many times the kubelet of `name` has accepted its plugin's registration so far (the
    /// plugin logs each verdict).
    pub fn registrations(&self, name: &str) -> usize {
        let log = self.node(name).dirs.root.join("plugin.log");
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .matches("registered with the kubelet")
            .count()
    }

    /// Waits until the kubelet of `name` has accepted its plugin's registration more than
    /// `before` times (take `before` from [`Env::registrations`] ahead of a restart).
    pub async fn wait_registered(&mut self, name: &str, before: usize) -> Result<()> {
        let deadline = Instant::now() + WAIT;
        while self.registrations(name) <= before {
            let node = self.node_mut(name);
            node.plugin.check_alive()?;
            if let Some(k) = node.kubelet.stock_mut() {
                k.check_alive()?;
            }
            if Instant::now() > deadline {
                bail!("the kubelet of {name} did not register its plugin within {WAIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }
}
