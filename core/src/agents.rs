//! What coding agents and the Responses / Messages APIs send that names their conversation,
//! read without any configuration (docs/sessions-and-queues.md "Agent sessions"). Pure: the
//! balancer (balancer/policies/session.rs) reads the headers and the body and hands them here.
//!
//! Sources, each checked against its public code or documentation:
//! - `x-session-affinity`: opencode sends its session id in it (and in `x-session-id`, through
//!   the Vercel AI SDK), anomalyco/opencode PR #31511.
//! - `x-claude-code-session-id`: Claude Code sends it on every API request (Claude Code docs,
//!   "LLM gateway configuration", request headers).
//! - `session_id`: Codex CLI names its conversation in it (openai/codex
//!   `codex-rs/codex-api/src/requests/headers.rs`, `build_conversation_headers`).
//! - `session-id`, `x-session-id`: the generic spellings gateways read (LLM Gateway's
//!   `x-session-id`, GPROXY's `session-id`; opencode's `x-session-id` above).
//! - Responses API body: `previous_response_id` (a continuation, handled apart: it names the
//!   response, whose pod is recorded), `conversation` (a string, or an object with its `id`:
//!   openai-python `types/responses/response_conversation_param.py`), `prompt_cache_key`
//!   (OpenAI's cache routing key; Codex sets it to its conversation id, openai/codex
//!   `codex-rs/core/src/client.rs`).
//! - Anthropic Messages body: `metadata.user_id` (Claude Code puts its session in it).

use serde::Deserialize;
use serde_json::Value;

/// The headers that name an agent's session, in the order they are tried: the first present
/// and non-empty one names it (a repeated header reads as the host gives it).
pub const HEADERS: [&str; 5] = [
    "x-session-affinity",
    "x-claude-code-session-id",
    "session_id",
    "session-id",
    "x-session-id",
];

/// The longest response id kept or looked up, in bytes. OpenAI's and vLLM's ids (`resp_` and
/// 32-48 hex digits) are far shorter: a longer `previous_response_id` names no response this
/// plugin recorded, and a longer answer id is not recorded.
pub const MAX_RESPONSE_ID_BYTES: usize = 256;

/// Which API a request's path names, for what its body may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// OpenAI Responses (`…/responses`): `previous_response_id`, `conversation`,
    /// `prompt_cache_key`; its answer has an `id` a later request may continue.
    Responses,
    /// Anthropic Messages (`…/messages`): `metadata.user_id`.
    Messages,
    /// Anything else: no body field is read (Chat and Completions carry no conversation id
    /// of their own; `sessionBodyField` reads `user` or `metadata.<key>` where configured).
    Other,
}

impl Api {
    /// The API of a request `:path` (its query left out).
    pub fn of_path(path: &str) -> Api {
        let path = path.split(['?', '#']).next().unwrap_or_default();
        let path = path.trim_end_matches('/');
        if path.ends_with("/responses") {
            Api::Responses
        } else if path.ends_with("/messages") {
            Api::Messages
        } else {
            Api::Other
        }
    }
}

/// A body's `previous_response_id`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Previous {
    #[default]
    Absent,
    /// A string of 1 to [`MAX_RESPONSE_ID_BYTES`] bytes.
    Id(Vec<u8>),
    /// Present but not such a string (a number, an object, empty, too long): it names no
    /// response (counted as an unknown continuation).
    Garbage,
}

/// What a body says of its conversation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fields {
    pub previous: Previous,
    /// The conversation's own id: `conversation` (Responses), else `prompt_cache_key`
    /// (Responses), else `metadata.user_id` (Messages); each a non-empty string.
    pub conversation: Option<Vec<u8>>,
    /// False when the body says `"store": false`: its answer is not kept by the server, so no
    /// later request can continue it.
    pub unstored: bool,
}

/// The members read; every other member is skipped unparsed. serde refuses a repeated member:
/// such a body names nothing.
#[derive(Deserialize)]
struct Raw {
    #[serde(default)]
    previous_response_id: Option<Value>,
    #[serde(default)]
    conversation: Option<Value>,
    #[serde(default)]
    prompt_cache_key: Option<Value>,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    store: Option<Value>,
}

/// A non-empty string's bytes.
fn text(v: Option<&Value>) -> Option<Vec<u8>> {
    match v {
        Some(Value::String(s)) if !s.is_empty() => Some(s.as_bytes().to_vec()),
        _ => None,
    }
}

/// The fields of `body` that `api` carries. A body that is not a JSON object (or repeats a
/// member read here) names nothing.
pub fn fields(api: Api, body: &[u8]) -> Fields {
    // serde would read a struct from an array too: only an object names anything.
    let object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    if api == Api::Other || !object {
        return Fields::default();
    }
    let Ok(raw) = serde_json::from_slice::<Raw>(body) else {
        return Fields::default();
    };
    match api {
        Api::Responses => {
            let previous = match &raw.previous_response_id {
                None | Some(Value::Null) => Previous::Absent,
                Some(Value::String(s)) if (1..=MAX_RESPONSE_ID_BYTES).contains(&s.len()) => {
                    Previous::Id(s.as_bytes().to_vec())
                }
                Some(_) => Previous::Garbage,
            };
            // `conversation` is a conversation's id, or an object naming it.
            let conversation = match &raw.conversation {
                Some(Value::Object(o)) => text(o.get("id")),
                other => text(other.as_ref()),
            };
            Fields {
                previous,
                conversation: conversation.or_else(|| text(raw.prompt_cache_key.as_ref())),
                unstored: raw.store == Some(Value::Bool(false)),
            }
        }
        Api::Messages => Fields {
            conversation: text(raw.metadata.as_ref().and_then(|m| m.get("user_id"))),
            ..Fields::default()
        },
        Api::Other => Fields::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_api() {
        assert_eq!(Api::of_path("/v1/responses"), Api::Responses);
        assert_eq!(Api::of_path("/v1/responses?x=1"), Api::Responses);
        assert_eq!(Api::of_path("/route/v1/responses/"), Api::Responses);
        assert_eq!(Api::of_path("/v1/messages"), Api::Messages);
        assert_eq!(Api::of_path("/v1/chat/completions"), Api::Other);
        assert_eq!(Api::of_path("/v1/responses/resp_1/cancel"), Api::Other);
        assert_eq!(Api::of_path(""), Api::Other);
    }

    #[test]
    fn responses_bodies_name_their_previous_response_and_conversation() {
        let f = fields(
            Api::Responses,
            br#"{"model":"m","input":"hi","previous_response_id":"resp_1","store":true}"#,
        );
        assert_eq!(f.previous, Previous::Id(b"resp_1".to_vec()));
        assert_eq!((f.conversation, f.unstored), (None, false));
        let f = fields(Api::Responses, br#"{"conversation":"conv_9","input":[]}"#);
        assert_eq!(f.conversation, Some(b"conv_9".to_vec()));
        let f = fields(Api::Responses, br#"{"conversation":{"id":"conv_8"}}"#);
        assert_eq!(f.conversation, Some(b"conv_8".to_vec()));
        // Codex: its conversation id as the cache key, and nothing stored.
        let f = fields(
            Api::Responses,
            br#"{"prompt_cache_key":"019a-c0de","store":false}"#,
        );
        assert_eq!(f.conversation, Some(b"019a-c0de".to_vec()));
        assert!(f.unstored);
        // `conversation` wins over the cache key.
        let f = fields(
            Api::Responses,
            br#"{"prompt_cache_key":"k","conversation":"c"}"#,
        );
        assert_eq!(f.conversation, Some(b"c".to_vec()));
    }

    #[test]
    fn garbage_previous_response_ids_name_no_response() {
        let long = format!(r#"{{"previous_response_id":"{}"}}"#, "r".repeat(10_000));
        for body in [
            r#"{"previous_response_id":7}"#,
            r#"{"previous_response_id":""}"#,
            r#"{"previous_response_id":{"id":"resp_1"}}"#,
            r#"{"previous_response_id":["resp_1"]}"#,
            long.as_str(),
        ] {
            let f = fields(Api::Responses, body.as_bytes());
            assert_eq!(f.previous, Previous::Garbage, "{body:.60}");
        }
        let f = fields(Api::Responses, br#"{"previous_response_id":null}"#);
        assert_eq!(f.previous, Previous::Absent);
        let at_limit = format!(
            r#"{{"previous_response_id":"{}"}}"#,
            "r".repeat(MAX_RESPONSE_ID_BYTES)
        );
        let f = fields(Api::Responses, at_limit.as_bytes());
        assert!(matches!(f.previous, Previous::Id(id) if id.len() == MAX_RESPONSE_ID_BYTES));
        // Unicode ids are bytes like any other.
        let f = fields(
            Api::Responses,
            "{\"previous_response_id\":\"\u{4f1a}\u{8bdd}\"}".as_bytes(),
        );
        assert_eq!(
            f.previous,
            Previous::Id("\u{4f1a}\u{8bdd}".as_bytes().to_vec())
        );
    }

    #[test]
    fn messages_bodies_name_the_metadata_user() {
        let f = fields(
            Api::Messages,
            br#"{"model":"m","messages":[],"metadata":{"user_id":"user_ab_session_cd"}}"#,
        );
        assert_eq!(f.conversation, Some(b"user_ab_session_cd".to_vec()));
        // A Messages body's Responses fields are not read, nor the other way round.
        let f = fields(Api::Messages, br#"{"previous_response_id":"resp_1"}"#);
        assert_eq!(f, Fields::default());
        let f = fields(Api::Responses, br#"{"metadata":{"user_id":"u"}}"#);
        assert_eq!(f.conversation, None);
        for body in [
            r#"{"metadata":{"user_id":""}}"#,
            r#"{"metadata":{"user_id":5}}"#,
            r#"{"metadata":"user_id"}"#,
        ] {
            assert_eq!(fields(Api::Messages, body.as_bytes()), Fields::default());
        }
    }

    #[test]
    fn bodies_that_are_not_one_object_name_nothing() {
        for body in [
            &b""[..],
            b"not json",
            b"[1,2]",
            br#"{"previous_response_id":"a","previous_response_id":"b"}"#,
            br#"{"previous_response_id":"resp_1""#,
        ] {
            assert_eq!(fields(Api::Responses, body), Fields::default());
        }
        assert_eq!(
            fields(Api::Other, br#"{"previous_response_id":"resp_1"}"#),
            Fields::default()
        );
    }
}
