//! Strict decoding, as `kubectl apply` validates by default: a field the API does not know is an
//! error naming its path, never a silently different object.
use crate::{Error, Result};

/// Decodes `json` as `T`; the error names `origin` and the field path.
pub fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(
    json: &serde_json::Value,
    origin: &str,
) -> Result<T> {
    let t: T = serde_path_to_error::deserialize(json).map_err(|e| {
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
    if let Some(path) = unknown_field(json, &back, &mut String::new()) {
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
