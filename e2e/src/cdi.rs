//! Reads the CDI spec files a plugin wrote, the way a container runtime would resolve CDI IDs.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// One resolvable CDI device.
#[derive(Debug, Clone)]
pub struct CdiDevice {
    pub file: PathBuf,
    /// Environment of the spec's and the device's container edits, `KEY=VALUE`.
    pub env: Vec<String>,
}

impl CdiDevice {
    pub fn env_value(&self, key: &str) -> Option<&str> {
        self.env
            .iter()
            .rev()
            .find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
    }
}

/// Every spec file (`*.json`, `*.yaml`, `*.yml`) in `dir`.
pub fn spec_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    for entry in rd {
        let p = entry?.path();
        if matches!(
            p.extension().and_then(|e| e.to_str()),
            Some("json" | "yaml" | "yml")
        ) {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

fn env_of(edits: Option<&Value>) -> Vec<String> {
    edits
        .and_then(|e| e.get("env"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// All fully qualified CDI device IDs (`vendor/class=name`) defined in `dir`.
pub fn load(dir: &Path) -> Result<BTreeMap<String, CdiDevice>> {
    let mut out = BTreeMap::new();
    for file in spec_files(dir)? {
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            // Removed between listing and reading (an unprepare in flight).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
        };
        let spec: Value = if file.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).with_context(|| format!("parsing {}", file.display()))?
        } else {
            serde_yaml::from_str(&text).with_context(|| format!("parsing {}", file.display()))?
        };
        if spec.get("cdiVersion").and_then(Value::as_str).is_none() {
            bail!("{}: no cdiVersion", file.display());
        }
        let kind = spec
            .get("kind")
            .and_then(Value::as_str)
            .with_context(|| format!("{}: no kind", file.display()))?;
        if !kind.contains('/') {
            bail!("{}: kind {kind:?} is not vendor/class", file.display());
        }
        let spec_env = env_of(spec.get("containerEdits"));
        for dev in spec
            .get("devices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let name = dev
                .get("name")
                .and_then(Value::as_str)
                .with_context(|| format!("{}: device without name", file.display()))?;
            let mut env = spec_env.clone();
            env.extend(env_of(dev.get("containerEdits")));
            out.insert(
                format!("{kind}={name}"),
                CdiDevice {
                    file: file.clone(),
                    env,
                },
            );
        }
    }
    Ok(out)
}

/// True when `id` has the `vendor/class=name` form of a qualified CDI device name.
pub fn is_qualified(id: &str) -> bool {
    let Some((kind, name)) = id.split_once('=') else {
        return false;
    };
    let Some((vendor, class)) = kind.split_once('/') else {
        return false;
    };
    !vendor.is_empty() && !class.is_empty() && !name.is_empty() && !class.contains('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualified_names() {
        assert!(is_qualified("k8s.gpu.nvidia.com/claim=abc-gpu-0"));
        assert!(!is_qualified("k8s.gpu.nvidia.com/claim"));
        assert!(!is_qualified("claim=abc"));
        assert!(!is_qualified("a/b/c=d"));
    }

    #[test]
    fn loads_json_specs() {
        let dir = std::env::temp_dir().join(format!("e2e-cdi-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("k8s.gpu.nvidia.com-claim_u1.json"),
            r#"{"cdiVersion":"0.6.0","kind":"k8s.gpu.nvidia.com/claim",
               "devices":[{"name":"u1-gpu-0","containerEdits":{"env":["NVIDIA_VISIBLE_DEVICES=GPU-1"]}}]}"#,
        )
        .unwrap();
        let devs = load(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let d = devs
            .get("k8s.gpu.nvidia.com/claim=u1-gpu-0")
            .expect("device");
        assert_eq!(d.env_value("NVIDIA_VISIBLE_DEVICES"), Some("GPU-1"));
        assert_eq!(devs.len(), 1);
    }
}
