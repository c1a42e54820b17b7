//! Loading resource.k8s.io/v1 objects from multi-document YAML or JSON files and directories, with
//! errors naming the file, the document index and the field path.
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use std::path::{Path, PathBuf};

#[derive(Default)]
pub struct Objects {
    pub slices: Vec<ResourceSlice>,
    pub classes: Vec<DeviceClass>,
    pub claims: Vec<ResourceClaim>,
    pub nodes: Vec<Node>,
}

/// Expands directories (non-recursive, `*.yaml|*.yml|*.json`, sorted).
pub fn expand(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading directory {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| {
                    matches!(
                        f.extension().and_then(|e| e.to_str()),
                        Some("yaml" | "yml" | "json")
                    )
                })
                .collect();
            v.sort();
            out.extend(v);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

fn typed<T: serde::de::DeserializeOwned>(v: serde_yaml::Value, origin: &str) -> Result<T> {
    let json: serde_json::Value =
        serde_json::to_value(&v).with_context(|| format!("{origin}: not representable as JSON"))?;
    serde_path_to_error::deserialize(json).map_err(|e| {
        let path = e.path().to_string();
        anyhow::anyhow!(
            "{origin}: field {}: {}",
            if path == "." { "(root)".into() } else { path },
            e.inner()
        )
    })
}

/// Parses every document of `text` (named `name` in errors) into `objs`.
pub fn load_str(name: &str, text: &str, objs: &mut Objects) -> Result<()> {
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let origin = format!("{name}: document {i}");
        let v =
            serde_yaml::Value::deserialize(doc).map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
        add_value(v, &origin, objs)?;
    }
    Ok(())
}

use serde::Deserialize;

fn add_value(v: serde_yaml::Value, origin: &str, objs: &mut Objects) -> Result<()> {
    if v.is_null() {
        return Ok(());
    }
    let kind = v
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or("")
        .to_string();
    match kind.as_str() {
        "ResourceSlice" => objs.slices.push(typed(v, origin)?),
        "DeviceClass" => objs.classes.push(typed(v, origin)?),
        "ResourceClaim" => objs.claims.push(typed(v, origin)?),
        "ResourceClaimTemplate" => {
            let t: ResourceClaimTemplate = typed(v, origin)?;
            objs.claims.push(claim_from_template(&t));
        }
        "Node" => objs.nodes.push(typed(v, origin)?),
        "List" | "ResourceSliceList" | "DeviceClassList" | "ResourceClaimList" | "NodeList" => {
            if let Some(items) = v.get("items").and_then(|i| i.as_sequence()) {
                for (j, item) in items.iter().enumerate() {
                    add_value(item.clone(), &format!("{origin}: items[{j}]"), objs)?;
                }
            }
        }
        "" => bail!("{origin}: field kind: missing"),
        other => bail!(
            "{origin}: field kind: unsupported kind {other:?} (want ResourceSlice, DeviceClass, ResourceClaim, ResourceClaimTemplate or Node)"
        ),
    }
    Ok(())
}

/// A claim as the resourceclaim controller would create it from a template.
pub fn claim_from_template(t: &ResourceClaimTemplate) -> ResourceClaim {
    let spec = t.spec.clone().unwrap_or_default();
    let mut meta = spec.metadata.clone().unwrap_or_default();
    meta.name = Some(format!(
        "{}-claim",
        t.metadata.name.as_deref().unwrap_or("template")
    ));
    meta.namespace = Some(
        t.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
    );
    ResourceClaim {
        metadata: meta,
        spec: spec.spec,
        status: None,
    }
}

pub fn load_paths(paths: &[PathBuf], objs: &mut Objects) -> Result<()> {
    for f in expand(paths)? {
        let text =
            std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        load_str(&f.display().to_string(), &text, objs)?;
    }
    Ok(())
}

pub fn display(p: &Path) -> String {
    p.display().to_string()
}
