//! Loading the files users have, as `kubectl apply -f` reads them: any number of files and
//! directories (`-R` recursive), multi-document YAML or JSON, `List` kinds. Errors name the file,
//! the document (counted from 1, with the object's kind and name) and the field path; fields the
//! API does not know are errors, as with kubectl's strict validation.
//!
//! What each document becomes: resource.k8s.io objects (`v1`, or `v1beta1` / `v1beta2` converted
//! to v1 with a note), Nodes, workloads (see [`workload::WORKLOAD_KINDS`]), or an ignored object
//! (Namespace, ConfigMap, RBAC, custom resources, ...), listed so the user sees it was read.
mod convert;
mod kinds;
mod strict;
pub mod workload;

use crate::workloads::Workload;
use crate::{Error, Result};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Default)]
pub struct Objects {
    pub slices: Vec<ResourceSlice>,
    pub classes: Vec<DeviceClass>,
    pub claims: Vec<ResourceClaim>,
    pub templates: Vec<ResourceClaimTemplate>,
    pub nodes: Vec<Node>,
    pub workloads: Vec<Workload>,
    /// Objects read but without effect on allocation, each with where it is and why.
    pub ignored: Vec<String>,
    /// What the user should know about the input, such as a version conversion.
    pub notes: Vec<String>,
}

impl Objects {
    /// The claims of a pod made of every claim and template of the input (the input has no
    /// workloads): ResourceClaims as they are, and one claim per template.
    pub fn standalone_claims(&self) -> Vec<ResourceClaim> {
        let mut claims = self.claims.clone();
        claims.extend(self.templates.iter().map(claim_from_template));
        claims
    }

    /// Adds `other`'s objects to these.
    pub fn extend(&mut self, other: Objects) {
        self.slices.extend(other.slices);
        self.classes.extend(other.classes);
        self.claims.extend(other.claims);
        self.templates.extend(other.templates);
        self.nodes.extend(other.nodes);
        self.workloads.extend(other.workloads);
        self.ignored.extend(other.ignored);
        self.notes.extend(other.notes);
    }
}

/// Expands directories as `kubectl apply -f DIR` does: their `*.yaml|*.yml|*.json` files, sorted;
/// with `recursive`, those of every directory below too.
pub fn expand(paths: &[PathBuf], recursive: bool) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            expand_dir(p, recursive, &mut out)?;
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

fn expand_dir(dir: &Path, recursive: bool, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| Error::Io {
            what: format!("reading directory {}", dir.display()),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            if recursive {
                expand_dir(&path, recursive, out)?;
            }
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            out.push(path);
        }
    }
    Ok(())
}

/// Parses every document of `text` (named `name` in errors) into `objs`.
pub fn load_str(name: &str, text: &str, objs: &mut Objects) -> Result<()> {
    // Documents count from 1, as a person counts them in the file.
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let origin = format!("{name}: document {}", i + 1);
        let v = serde_yaml::Value::deserialize(doc)
            .map_err(|e| Error::Invalid(format!("{origin}: {e}")))?;
        if v.is_null() {
            continue;
        }
        let json: serde_json::Value = serde_json::to_value(&v).map_err(|source| Error::Encode {
            what: format!("{origin}: not representable as JSON"),
            source,
        })?;
        kinds::add(json, &origin, objs)?;
    }
    Ok(())
}

/// A claim as the resourceclaim controller would create it from a template, named `name`.
pub fn claim_named(t: &ResourceClaimTemplate, name: String, namespace: &str) -> ResourceClaim {
    let spec = t.spec.clone().unwrap_or_default();
    let mut meta = spec.metadata.clone().unwrap_or_default();
    meta.name = Some(name);
    meta.namespace = Some(namespace.to_string());
    ResourceClaim {
        metadata: meta,
        spec: spec.spec,
        status: None,
    }
}

/// A claim from a template when no pod names it: `<template>-claim`.
pub fn claim_from_template(t: &ResourceClaimTemplate) -> ResourceClaim {
    let name = format!("{}-claim", t.metadata.name.as_deref().unwrap_or("template"));
    let namespace = t.metadata.namespace.as_deref().unwrap_or("default");
    claim_named(t, name, namespace)
}

/// Loads files and directories (`-` is stdin) into `objs`.
pub fn load_paths(paths: &[PathBuf], objs: &mut Objects) -> Result<()> {
    load_paths_with(paths, false, objs)
}

/// Like [`load_paths`]; with `recursive`, directories below the given ones too (`-R`).
pub fn load_paths_with(paths: &[PathBuf], recursive: bool, objs: &mut Objects) -> Result<()> {
    for f in expand(paths, recursive)? {
        let text = if f.as_os_str() == "-" {
            std::io::read_to_string(std::io::stdin()).map_err(|source| Error::Io {
                what: "reading stdin".into(),
                source,
            })?
        } else {
            std::fs::read_to_string(&f).map_err(|source| Error::Io {
                what: format!("reading {}", f.display()),
                source,
            })?
        };
        load_str(&f.display().to_string(), &text, objs)?;
    }
    Ok(())
}

pub fn display(p: &Path) -> String {
    p.display().to_string()
}

#[cfg(test)]
mod tests;
