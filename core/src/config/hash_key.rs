//! cluster_hash's `key` block, from Higress PR #3921 (open; `cluster_hash/lb_policy.go`
//! `parseHashKeyConfig` at the PR's head e9a3dddc): where the hashed key comes from. Read as the
//! PR's Go code reads it (gjson, lenient), with its error texts; a body path is refused where
//! it uses gjson syntax this plugin does not evaluate, since hashing another key than the one
//! written would send each user to a cluster silently chosen by something else.

use super::error::ConfigError;
use super::go::{Field, Go};
use super::read::Reader;
use crate::cluster::json_path;
use serde_json::Value;

/// The PR's default body limit for `source: body` (`DefaultMaxBodyBytes`, 100 MiB).
pub const DEFAULT_KEY_MAX_BODY_BYTES: u64 = 100 * 1024 * 1024;

/// The `key` block's fields the PR reads.
const KEY_FIELDS: &[&str] = &[
    "source",
    "name",
    "jsonPath",
    "json_path",
    "propertyPath",
    "property_path",
    "max_body_bytes",
];

/// Where cluster_hash's key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKey {
    /// A request header's raw bytes (the released plugin's `hash_header`).
    Header(String),
    /// A cookie's value, as Go's `http.Request.Cookie` reads the `Cookie` header.
    Cookie(String),
    /// A field of the JSON request body (gjson path parts), and the longest body held for it.
    Body {
        path: Vec<String>,
        max_body_bytes: u64,
    },
    /// A Wasm property's bytes (`proxywasm.GetProperty(path)`).
    Metadata(Vec<String>),
}

impl HashKey {
    /// `source:detail`, for facts and logs.
    pub fn describe(&self) -> String {
        match self {
            HashKey::Header(n) => format!("header:{n}"),
            HashKey::Cookie(n) => format!("cookie:{n}"),
            HashKey::Body { path, .. } => format!("body:{}", path.join(".")),
            HashKey::Metadata(p) => format!("metadata:{}", p.join(".")),
        }
    }
}

/// The key of a cluster_hash config: `None` without a `key` block (the `hash_header`, answered
/// 403 `hash header required` when missing, as the released plugin does).
pub(super) fn read(
    key: &Field<Go>,
    r: &mut Reader<'_>,
    hash_header: &str,
) -> Result<Option<HashKey>, ConfigError> {
    let Some(k) = key.as_ref() else {
        return Ok(None);
    };
    match &k.0 {
        Value::Object(m) => {
            for name in m.keys().filter(|n| !KEY_FIELDS.contains(&n.as_str())) {
                r.nested("key")
                    .warn(name, "unknown key: ignored, as Higress ignores it");
            }
        }
        Value::Null => {}
        _ => r.warn(
            "key",
            "not an object: read as {}, the header `hash_header` (as Higress's PR reads it)",
        ),
    }
    let mut kr = r.nested("key");
    let field = |name: &str| Field(k.get(name));
    let source = kr.string("source", &field("source")).unwrap_or_default();
    let mut max_body_bytes = DEFAULT_KEY_MAX_BODY_BYTES;
    if let Some(n) = kr.int("max_body_bytes", &field("max_body_bytes")) {
        if n > i64::from(u32::MAX) {
            return Err(kr.err_higress("max_body_bytes", "key.max_body_bytes exceeds uint32 limit"));
        }
        if n > 0 {
            max_body_bytes = n.unsigned_abs();
        }
    }
    let named = |kr: &mut Reader<'_>| kr.string("name", &field("name")).filter(|n| !n.is_empty());
    let key = match source.as_str() {
        "" | "header" => HashKey::Header(named(&mut kr).unwrap_or_else(|| hash_header.to_string())),
        "cookie" => HashKey::Cookie(named(&mut kr).ok_or_else(|| {
            kr.err_higress("name", "key.name is required when key.source is cookie")
        })?),
        "body" => {
            let mut path = normalize(
                &kr.string("jsonPath", &field("jsonPath"))
                    .unwrap_or_default(),
            );
            if path.is_empty() {
                path = normalize(
                    &kr.string("json_path", &field("json_path"))
                        .unwrap_or_default(),
                );
            }
            if path.is_empty() {
                return Err(kr.err_higress(
                    "jsonPath",
                    "key.jsonPath is required when key.source is body",
                ));
            }
            let path = json_path::parse(&path)
                .map_err(|why| kr.err("jsonPath", format!("`{path}`: {why}")))?;
            HashKey::Body {
                path,
                max_body_bytes,
            }
        }
        "metadata" => {
            let mut parts = parts_of(&mut kr, "propertyPath", &field("propertyPath"));
            if parts.is_empty() {
                parts = parts_of(&mut kr, "property_path", &field("property_path"));
            }
            if parts.is_empty() {
                let name = named(&mut kr).ok_or_else(|| {
                    kr.err_higress(
                        "name",
                        "key.name or key.propertyPath is required when key.source is metadata",
                    )
                })?;
                parts = vec!["metadata".to_string(), name];
            }
            HashKey::Metadata(parts)
        }
        other => return Err(kr.err_higress("source", format!("unsupported key.source {other:?}"))),
    };
    Ok(Some(key))
}

/// The PR's `normalizeJSONPath`: spaces trimmed, a leading `$.` dropped, `$` alone is nothing.
fn normalize(path: &str) -> String {
    let p = path.trim();
    let p = p.strip_prefix("$.").unwrap_or(p);
    if p == "$" {
        String::new()
    } else {
        p.to_string()
    }
}

/// gjson `Array()` of a property path, each part's `String()`, empty ones dropped.
fn parts_of(kr: &mut Reader<'_>, key: &str, v: &Field<Go>) -> Vec<String> {
    kr.list(key, v)
        .unwrap_or_default()
        .iter()
        .map(|g| g.string(false).0)
        .filter(|p| !p.is_empty())
        .collect()
}
