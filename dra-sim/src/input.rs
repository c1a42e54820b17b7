//! Loading resource.k8s.io/v1 objects from multi-document YAML or JSON files and directories, with
//! errors naming the file, the document (counted from 1, with the object's kind and name) and the
//! field path; fields the API does not know are errors, as with kubectl's strict validation.
use crate::{Error, Result};
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
                .map_err(|source| Error::Io {
                    what: format!("reading directory {}", p.display()),
                    source,
                })?
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

fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(
    v: serde_yaml::Value,
    origin: &str,
) -> Result<T> {
    let json: serde_json::Value = serde_json::to_value(&v).map_err(|source| Error::Encode {
        what: format!("{origin}: not representable as JSON"),
        source,
    })?;
    let t: T = serde_path_to_error::deserialize(&json).map_err(|e| {
        let path = e.path().to_string();
        Error::Invalid(format!(
            "{origin}: field {}: {}",
            if path == "." { "(root)".into() } else { path },
            e.inner()
        ))
    })?;
    // The API server rejects unknown fields (kubectl's default strict validation); here a typo
    // such as `deviceClasName` would otherwise vanish and the answer would be for another claim.
    let back = serde_json::to_value(&t).map_err(|source| Error::Encode {
        what: format!("{origin}: re-encoding"),
        source,
    })?;
    if let Some(path) = unknown_field(&json, &back, &mut String::new()) {
        return Err(Error::Invalid(format!(
            "{origin}: field {path}: unknown field"
        )));
    }
    Ok(t)
}

/// The first field set in `given` (not null) that the typed object `kept` does not have.
fn unknown_field(
    given: &serde_json::Value,
    kept: &serde_json::Value,
    path: &mut String,
) -> Option<String> {
    use serde_json::Value;
    let len = path.len();
    let found = match (given, kept) {
        (Value::Object(g), Value::Object(k)) => g.iter().find_map(|(key, gv)| {
            if gv.is_null() {
                return None;
            }
            path.truncate(len);
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(key);
            match k.get(key) {
                None => Some(path.clone()),
                Some(kv) => unknown_field(gv, kv, path),
            }
        }),
        (Value::Array(g), Value::Array(k)) => {
            g.iter().zip(k).enumerate().find_map(|(i, (gv, kv))| {
                path.truncate(len);
                path.push_str(&format!("[{i}]"));
                unknown_field(gv, kv, path)
            })
        }
        _ => None,
    };
    path.truncate(len);
    found
}

/// Parses every document of `text` (named `name` in errors) into `objs`.
pub fn load_str(name: &str, text: &str, objs: &mut Objects) -> Result<()> {
    // Documents count from 1, as a person counts them in the file.
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let origin = format!("{name}: document {}", i + 1);
        let v = serde_yaml::Value::deserialize(doc)
            .map_err(|e| Error::Invalid(format!("{origin}: {e}")))?;
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
    // The object's own name finds it faster than a count, when the name itself is readable.
    let named = match v
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(|n| n.as_str())
    {
        Some(n) if !kind.is_empty() => format!("{origin} ({kind} {n})"),
        _ => origin.to_string(),
    };
    let origin = named.as_str();
    match kind.as_str() {
        "ResourceSlice" => objs.slices.push(typed(v, origin)?),
        "DeviceClass" => objs.classes.push(typed(v, origin)?),
        "ResourceClaim" => {
            let mut c: ResourceClaim = typed(v, origin)?;
            // as `kubectl apply` would place it, and as claims from templates are named
            c.metadata.namespace.get_or_insert_with(|| "default".into());
            objs.claims.push(c);
        }
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
        "" => return Err(Error::Invalid(format!("{origin}: field kind: missing"))),
        other => {
            return Err(Error::Invalid(format!(
                "{origin}: field kind: unsupported kind {other:?} (want ResourceSlice, DeviceClass, ResourceClaim, ResourceClaimTemplate or Node)"
            )));
        }
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
        let text = std::fs::read_to_string(&f).map_err(|source| Error::Io {
            what: format!("reading {}", f.display()),
            source,
        })?;
        load_str(&f.display().to_string(), &text, objs)?;
    }
    Ok(())
}

pub fn display(p: &Path) -> String {
    p.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Objects> {
        let mut objs = Objects::default();
        load_str("f.yaml", text, &mut objs)?;
        Ok(objs)
    }

    #[test]
    fn unknown_fields_are_named_with_their_path() {
        let err = load(
            "kind: ResourceSlice\napiVersion: resource.k8s.io/v1\nmetadata: {name: s}\n\
             spec: {driver: d, pool: {name: p, generation: 1, resourceSliceCount: 1}, nodeName: n,\n\
             devices: [{name: a}, {name: b, attributes: {x: {int: 1}}, capacitty: {}}]}\n",
        )
        .err()
        .expect("a misspelt field is an error")
        .to_string();
        assert_eq!(
            err,
            "f.yaml: document 1 (ResourceSlice s): field spec.devices[1].capacitty: unknown field"
        );
        let err = load("kind: DeviceClass\nmetadata: {name: c}\nspec: {}\nstatus: {}\n")
            .err()
            .expect("DeviceClass has no status")
            .to_string();
        assert!(err.ends_with("field status: unknown field"), "{err}");
    }

    #[test]
    fn nulls_free_form_maps_and_defaults_pass() {
        let objs = load(
            "kind: ResourceClaim\napiVersion: resource.k8s.io/v1\n\
             metadata: {name: c, creationTimestamp: null, labels: {any/key: v}, annotations: {}}\n\
             spec: {devices: {requests: [{name: r, exactly: {deviceClassName: k, count: 1,\n\
             adminAccess: false, selectors: [], tolerations: null}}], constraints: null}}\n\
             ---\n\
             kind: DeviceClass\nmetadata: {name: k}\nspec: {config: [{opaque: {driver: d,\n\
             parameters: {apiVersion: v, kind: K, anything: {nested: [1, 2]}}}}]}\n",
        )
        .expect("known fields only");
        assert_eq!(
            objs.claims[0].metadata.namespace.as_deref(),
            Some("default")
        );
        assert_eq!(objs.classes.len(), 1);
    }
}
