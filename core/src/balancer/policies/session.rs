//! Session stickiness: a request's session id, read from the route's configured header,
//! cookie or body field (in that order; the first non-empty one names the session), and its
//! Redis key. The binding itself is made in the acquire script (docs/redis-data-model.md §10).
//! An empty value means no session; any other value, however long or whatever its bytes, is
//! hashed into a fixed-size key. Where no binding is stored (plain Envoy, endpoint_metrics) the
//! id is hashed onto the CHWBL ring of the endpoints instead ([`ring_key`]).

use crate::config::{BodyField, SessionConfig};
use crate::hash::{self, SplitMix64};
use crate::host::Host;
use serde_json::Value;

/// Where a session id lands on a CHWBL ring (`prefix/chwbl.rs`): FNV-1a, then SplitMix64 to
/// spread the bits. Every worker and every replica computes the same point, so the ring's
/// first endpoint is the session's pod without a stored binding (docs/redis-data-model.md §10).
pub fn ring_key(id: &[u8]) -> u64 {
    SplitMix64(hash::fnv1a(hash::FNV_OFFSET, id)).next_u64()
}

/// The session id: the configured header (a repeated header reads as the host gives it, the
/// first value under Envoy), else the cookie, else the body field (`body_bytes`: None when
/// the body is not read).
pub fn session_id(
    host: &dyn Host,
    config: &SessionConfig,
    body_bytes: Option<usize>,
) -> Option<Vec<u8>> {
    if let Some(name) = &config.header {
        if let Ok(Some(v)) = host.request_header_bytes(name) {
            if !v.is_empty() {
                return Some(v);
            }
        }
    }
    if let Some(name) = &config.cookie {
        if let Ok(Some(v)) = host.request_header("cookie") {
            if let Some(c) = cookie(&v, name).filter(|c| !c.is_empty()) {
                return Some(c.as_bytes().to_vec());
            }
        }
    }
    match (&config.body_field, body_bytes) {
        (Some(field), Some(n)) if n > 0 => {
            let body = host.request_body(0, n).ok()?;
            body_field(&body, field)
        }
        _ => None,
    }
}

/// The value of cookie `name` in a `Cookie` header (`a=1; b=2`; Envoy joins repeated cookie
/// headers with `; `). Quotes around the value are kept: they are part of the id.
pub fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        (k.trim() == name).then_some(v.trim())
    })
}

/// The body's `user`, or `metadata.<key>`: a non-empty string; anything else names no session.
pub fn body_field(body: &[u8], field: &BodyField) -> Option<Vec<u8>> {
    let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(body) else {
        return None;
    };
    let value = match field {
        BodyField::User => map.get("user"),
        BodyField::Metadata(k) => map.get("metadata").and_then(|m| m.get(k)),
    };
    match value {
        Some(Value::String(s)) if !s.is_empty() => Some(s.as_bytes().to_vec()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_values() {
        assert_eq!(cookie("a=1; sid=xyz; b=2", "sid"), Some("xyz"));
        assert_eq!(cookie("sid=xyz", "sid"), Some("xyz"));
        assert_eq!(cookie("asid=1; sid=2", "sid"), Some("2"));
        assert_eq!(cookie("a=1", "sid"), None);
        assert_eq!(cookie("sid=", "sid"), Some(""));
        assert_eq!(cookie("sid", "sid"), None);
        assert_eq!(cookie("", "sid"), None);
    }

    #[test]
    fn body_fields() {
        let b = br#"{"model":"m","user":"u-1","metadata":{"session":"s-9","n":3}}"#;
        assert_eq!(body_field(b, &BodyField::User), Some(b"u-1".to_vec()));
        let s = BodyField::Metadata("session".into());
        assert_eq!(body_field(b, &s), Some(b"s-9".to_vec()));
        // Not a string, empty, absent, not JSON: no session.
        assert_eq!(body_field(b, &BodyField::Metadata("n".into())), None);
        assert_eq!(body_field(br#"{"user":""}"#, &BodyField::User), None);
        assert_eq!(body_field(br#"{"model":"m"}"#, &BodyField::User), None);
        assert_eq!(body_field(b"{not json", &BodyField::User), None);
        assert_eq!(body_field(br#"["user"]"#, &BodyField::User), None);
        let uni = "{\"user\":\"\u{7528}\u{6237}-\u{1F600}\"}";
        assert_eq!(
            body_field(uni.as_bytes(), &BodyField::User),
            Some("\u{7528}\u{6237}-\u{1F600}".as_bytes().to_vec())
        );
    }
}
