//! Asking for usage on a stream: OpenAI-style engines report a stream's usage only in a last
//! usage-only event, and only when the request sets `stream_options.include_usage`. A
//! streamed Chat / Completions request without `stream_options` gets
//! `"stream_options":{"include_usage":true}` added to its forwarded body; [`super::sse`] takes
//! that event out of the answer again. A request that set `stream_options` itself is left as
//! it is: its usage event, if any, is the client's.

use crate::prefix::{Canonical, StreamOptions};
use serde::Deserialize;

/// What a request body asks of its stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Streamed {
    /// Not streamed: the JSON answer carries its usage.
    No,
    /// Streamed, and the client asked for usage itself: its stream is not touched.
    AskedUsage,
    /// Streamed with `stream_options` that do not ask for usage: left as the client set them
    /// (no verification).
    OwnOptions,
    /// Streamed without `stream_options`: the body to forward instead, which asks for usage.
    Injected(Vec<u8>),
    /// Not a JSON object.
    Malformed,
}

#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    stream: Option<serde_json::Value>,
    #[serde(default)]
    stream_options: Option<serde_json::Value>,
}

const INCLUDE_USAGE: &[u8] = br#""stream_options":{"include_usage":true},"#;

/// Reads `body`'s `stream` and `stream_options` (both top-level) and, where needed, adds the
/// usage request as the object's first member, so the rest of the body is forwarded byte for
/// byte.
pub fn streamed(body: &[u8]) -> Streamed {
    // serde reads a struct from an array too: only an object is a request.
    let Some(open) = body.iter().position(|b| !b.is_ascii_whitespace()) else {
        return Streamed::Malformed;
    };
    if body.get(open) != Some(&b'{') {
        return Streamed::Malformed;
    }
    // Most requests are not streamed: no second parse of their body (the canonicaliser
    // read it already) unless it names `stream` at all.
    if !body.windows(8).any(|w| w == b"\"stream\"") {
        return Streamed::No;
    }
    let Ok(head) = serde_json::from_slice::<Head>(body) else {
        return Streamed::Malformed;
    };
    if head.stream != Some(serde_json::Value::Bool(true)) {
        return Streamed::No;
    }
    match head.stream_options {
        None | Some(serde_json::Value::Null) => {}
        Some(o) if o.get("include_usage") == Some(&serde_json::Value::Bool(true)) => {
            return Streamed::AskedUsage
        }
        Some(_) => return Streamed::OwnOptions,
    }
    injected(body, open)
}

/// [`streamed`] for a body the canonicaliser read into `canon`: its `stream` and
/// `stream_options` are known, so the body is neither scanned nor parsed again (on a long
/// prompt that second reading cost more than the canonicalisation itself).
pub fn streamed_canonical(canon: &Canonical, body: &[u8]) -> Streamed {
    if !canon.stream {
        return Streamed::No;
    }
    match canon.stream_options {
        StreamOptions::IncludeUsage => Streamed::AskedUsage,
        StreamOptions::Own => Streamed::OwnOptions,
        // The canonicaliser accepts only an object: its first byte past the whitespace is `{`.
        StreamOptions::Absent => match body.iter().position(|b| !b.is_ascii_whitespace()) {
            Some(open) if body.get(open) == Some(&b'{') => injected(body, open),
            _ => Streamed::Malformed,
        },
    }
}

/// `body` with the usage request as the first member of the object opening at `open`.
fn injected(body: &[u8], open: usize) -> Streamed {
    let mut out = Vec::with_capacity(body.len() + INCLUDE_USAGE.len());
    out.extend_from_slice(body.get(..=open).unwrap_or_default());
    out.extend_from_slice(INCLUDE_USAGE);
    out.extend_from_slice(body.get(open + 1..).unwrap_or_default());
    Streamed::Injected(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn injected(body: &str) -> serde_json::Value {
        let Streamed::Injected(b) = streamed(body.as_bytes()) else {
            panic!("not injected: {body}");
        };
        serde_json::from_slice(&b).expect("still JSON")
    }

    #[test]
    fn a_stream_without_options_asks_for_usage() {
        let v =
            injected(r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#);
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["messages"][0]["content"], "hi");
        let v = injected(" \n{ \"stream\" : true , \"prompt\":\"x\",\"stream_options\":null}");
        assert_eq!(v["prompt"], "x");
        assert_eq!(v["stream"], true);
    }

    #[test]
    fn the_canonicalisers_reading_agrees_with_a_parse_of_its_own() {
        let cfg = crate::prefix::CanonConfig::default();
        let msgs = r#""messages":[{"role":"user","content":"hi"}]"#;
        for head in [
            r#""stream":true"#,
            r#""stream":true,"stream_options":null"#,
            r#""stream":false"#,
            r#""stream":"true""#,
            r#""stream":true,"stream_options":{"include_usage":true}"#,
            r#""stream":true,"stream_options":{"include_usage":false}"#,
            r#""stream":true,"stream_options":{"continuous_usage_stats":true}"#,
            r#""stream":true,"stream_options":[]"#,
            r#""model":"m""#,
        ] {
            for body in [format!(" {{{head},{msgs}}}"), format!("{{{msgs},{head}}}")] {
                let canon = crate::prefix::canonicalize(body.as_bytes(), &cfg).unwrap();
                let want = streamed(body.as_bytes());
                assert_eq!(streamed_canonical(&canon, body.as_bytes()), want, "{body}");
            }
        }
    }

    #[test]
    fn other_bodies_are_left_alone() {
        for (body, want) in [
            (r#"{"stream":false,"messages":[]}"#, Streamed::No),
            (r#"{"messages":[]}"#, Streamed::No),
            (r#"{"stream":"true"}"#, Streamed::No),
            (
                r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
                Streamed::AskedUsage,
            ),
            (
                r#"{"stream":true,"stream_options":{"include_usage":false}}"#,
                Streamed::OwnOptions,
            ),
            (
                r#"{"stream":true,"stream_options":{"continuous_usage_stats":true}}"#,
                Streamed::OwnOptions,
            ),
            (r#"{"stream":true,"messages":["#, Streamed::Malformed),
            (r#"[{"stream":true}]"#, Streamed::Malformed),
            ("", Streamed::Malformed),
        ] {
            assert_eq!(streamed(body.as_bytes()), want, "{body}");
        }
    }
}
