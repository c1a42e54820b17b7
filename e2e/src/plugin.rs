//! One `dra-plugin` process per node, with its own registrar, plugin and CDI directories.
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::process::{Child, Command};

/// The directories a node's plugin and its kubelet share.
#[derive(Debug, Clone)]
pub struct NodeDirs {
    pub root: PathBuf,
    pub registrar: PathBuf,
    pub plugin: PathBuf,
    pub cdi: PathBuf,
}

impl NodeDirs {
    pub fn create(work: &Path, node: &str) -> Result<NodeDirs> {
        let root = work.join("nodes").join(node);
        let dirs = NodeDirs {
            registrar: root.join("registry"),
            plugin: root.join("plugin"),
            cdi: root.join("cdi"),
            root,
        };
        for d in [&dirs.registrar, &dirs.plugin, &dirs.cdi] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        Ok(dirs)
    }
}

/// A running `dra-plugin run` for one node. Killed when dropped.
pub struct Plugin {
    bin: PathBuf,
    args: Vec<String>,
    dirs: NodeDirs,
    child: Option<Child>,
    starts: u32,
}

impl Plugin {
    /// Starts `BIN run --backend simulated` for `node` with `extra` arguments (profiles, MIG layout,
    /// feature gates; a `--backend` there replaces the simulated one). Output goes to
    /// `<node dir>/plugin.log`.
    pub fn start(
        bin: &Path,
        node: &str,
        kubeconfig: &Path,
        dirs: &NodeDirs,
        extra: &[&str],
    ) -> Result<Plugin> {
        let mut args: Vec<String> = vec![
            "run".into(),
            "--node-name".into(),
            node.into(),
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--registrar-dir".into(),
            dirs.registrar.display().to_string(),
            "--plugin-dir".into(),
            dirs.plugin.display().to_string(),
            "--cdi-root".into(),
            dirs.cdi.display().to_string(),
            "--metrics-port".into(),
            "0".into(),
            "--healthcheck-port".into(),
            "0".into(),
        ];
        // `extra` may pick another backend (`--backend nvml`); clap refuses the flag twice.
        if !extra
            .iter()
            .any(|a| *a == "--backend" || a.starts_with("--backend="))
        {
            args.extend(["--backend".into(), "simulated".into()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut p = Plugin {
            bin: bin.to_path_buf(),
            args,
            dirs: dirs.clone(),
            child: None,
            starts: 0,
        };
        p.spawn()?;
        Ok(p)
    }

    fn spawn(&mut self) -> Result<()> {
        let log_path = self.dirs.root.join("plugin.log");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        use std::io::Write;
        writeln!(
            &log,
            "=== start #{}: {} {}",
            self.starts + 1,
            self.bin.display(),
            self.args.join(" ")
        )?;
        let child = Command::new(&self.bin)
            .args(&self.args)
            .env(
                "RUST_LOG",
                std::env::var("E2E_PLUGIN_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "starting {} (build it with cargo build -p dra-plugin)",
                    self.bin.display()
                )
            })?;
        if let Some(pid) = child.id() {
            std::fs::write(self.dirs.root.join("plugin.pid"), pid.to_string())?;
        }
        self.child = Some(child);
        self.starts += 1;
        Ok(())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Fails when the process has exited on its own.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(c) = self.child.as_mut()
            && let Some(status) = c.try_wait()?
        {
            bail!(
                "dra-plugin exited with {status}; see {}",
                self.dirs.root.join("plugin.log").display()
            );
        }
        Ok(())
    }

    /// SIGKILL, as a crash or an OOM kill would do.
    pub async fn kill9(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            c.start_kill()?;
            c.wait().await?;
        }
        Ok(())
    }

    /// SIGTERM and wait (SIGKILL after 20 s).
    pub async fn stop(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            if let Some(pid) = c.id() {
                let _ = Command::new("kill")
                    .arg("-TERM")
                    .arg(pid.to_string())
                    .status()
                    .await;
            }
            if tokio::time::timeout(Duration::from_secs(20), c.wait())
                .await
                .is_err()
            {
                c.start_kill()?;
                c.wait().await?;
            }
        }
        Ok(())
    }

    /// Starts the process again with the same arguments and directories.
    pub fn restart(&mut self) -> Result<()> {
        if self.child.is_some() {
            bail!("plugin still running");
        }
        self.spawn()
    }

    pub fn dirs(&self) -> &NodeDirs {
        &self.dirs
    }
}
