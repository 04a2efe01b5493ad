//! Session stickiness: what names a request's session, and where that session's binding
//! lives. In order (docs/sessions-and-queues.md "Sessions", "Agent sessions"):
//! 1. the route's configured header, cookie or body field (the first non-empty one);
//! 2. unless the route turned agent sessions off, an agent's own identity header
//!    (`agents::HEADERS`);
//! 3. then, where the body is read, a Responses request's `previous_response_id` (a
//!    continuation: its binding is the pod that produced that response, continuation.rs);
//! 4. then the body's own conversation id (`conversation`, `prompt_cache_key`,
//!    `metadata.user_id`: `agents::fields`).
//!
//! An empty value means none; any other value, however long or whatever its bytes, is hashed
//! into a fixed-size key. The binding itself is made in the acquire script
//! (docs/redis-data-model.md §10); where no binding is stored (plain Envoy, endpoint_metrics
//! without Redis) the id is hashed onto the CHWBL ring of the endpoints instead ([`ring_key`]).

use crate::agents::{self, Api, Previous};
use crate::balancer::telemetry::Telemetry;
use crate::config::{BodyField, RouteConfig, SessionConfig, DEFAULT_SESSION_TTL_S};
use crate::hash::{self, SplitMix64};
use crate::host::pairs::{self, Pair};
use crate::host::Host;
use crate::reason::Reason;
use crate::redis::{bind, scripts};
use crate::stats::Counter;
use serde_json::Value;
use std::borrow::Cow;

/// What named a request's session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The route's `sessionHeader`, `sessionCookie` or `sessionBodyField`.
    Configured,
    /// An agent's own identity: a recognised header or body field.
    Agent,
    /// A Responses request's `previous_response_id`: the pod that produced that response.
    Continuation,
}

/// A request's session: its id and what named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sticky {
    pub id: Vec<u8>,
    pub kind: Kind,
}

impl Sticky {
    /// The reason of a request kept on its session's pod (a rebound reads `session_rebound`
    /// whatever named it).
    pub fn kept(&self) -> Reason {
        match self.kind {
            Kind::Configured => Reason::Session,
            Kind::Agent => Reason::AgentSession,
            Kind::Continuation => Reason::Continuation,
        }
    }

    /// Its Redis key in `namespace`: a session's, or a response's.
    pub fn redis_key(&self, namespace: &str) -> String {
        match self.kind {
            Kind::Continuation => bind::response_key(namespace, &self.id),
            Kind::Configured | Kind::Agent => scripts::session_key(namespace, &self.id),
        }
    }

    /// How long its binding lives without use: `sessionTTL` for a configured session,
    /// `agentSessionTTL` for the others.
    pub fn ttl_s(&self, config: &RouteConfig) -> u64 {
        match self.kind {
            Kind::Configured => config.session.as_ref().map(|s| s.ttl_s),
            Kind::Agent | Kind::Continuation => config.agents.as_ref().map(|a| a.ttl_s),
        }
        .unwrap_or(DEFAULT_SESSION_TTL_S)
    }
}

/// What a request's headers and body say of its session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    pub sticky: Option<Sticky>,
    /// A Responses request of a route with agent sessions whose answer the server keeps: its
    /// answer's id is recorded against the pod that produced it (continuation.rs).
    pub answer: bool,
}

/// The request body, as far as a decision may read it.
#[derive(Debug, Clone, Copy)]
pub enum Body<'a> {
    /// Not readable (a route deciding at the headers, a body over `maxBodyBytes`, a retry).
    None,
    /// This many bytes, read from the host when a field needs them.
    Host(usize),
    /// Already read by the policy.
    Bytes(&'a [u8]),
}

impl Body<'_> {
    /// `Host(n)` for a body the decision may read (`read`), else None.
    pub fn of(read: bool, bytes: usize) -> Body<'static> {
        if read && bytes > 0 {
            Body::Host(bytes)
        } else {
            Body::None
        }
    }
}

/// The body's bytes, read from the host at most once per decision.
struct Lazy<'a> {
    body: Body<'a>,
    read: Option<Vec<u8>>,
}

impl<'a> Lazy<'a> {
    fn bytes(&mut self, host: &dyn Host) -> Option<Cow<'_, [u8]>> {
        match self.body {
            Body::None => None,
            Body::Bytes(b) => Some(Cow::Borrowed(b)),
            Body::Host(n) => {
                if self.read.is_none() {
                    self.read = Some(host.request_body(0, n).ok()?);
                }
                self.read.as_deref().map(Cow::Borrowed)
            }
        }
    }
}

/// The request's session and whether its answer's id is to be recorded. Counts a recognised
/// identity (`ai_lb.session.agent`) and a `previous_response_id` that names no response
/// (`ai_lb.session.continuation_unknown`).
pub fn identify(
    host: &mut dyn Host,
    tel: &Telemetry,
    config: &RouteConfig,
    body: Body,
) -> Identity {
    let mut lazy = Lazy { body, read: None };
    let mut sticky = config.session.as_ref().and_then(|s| {
        let id = configured(&*host, s, &mut lazy)?;
        Some(Sticky {
            id,
            kind: Kind::Configured,
        })
    });
    if config.agents.is_none() {
        return Identity {
            sticky,
            answer: false,
        };
    }
    // One host call for the request's headers: most requests carry none of the five agent
    // headers, and a lookup per name cost a host call each (the CPU guard, plugin-cpu.md).
    let map = host.request_header_map().unwrap_or_default();
    let headers = pairs::decode(&map).unwrap_or_default();
    if sticky.is_none() {
        sticky = agent_header(&headers).map(|id| Sticky {
            id,
            kind: Kind::Agent,
        });
    }
    let path = first(&headers, ":path").map(String::from_utf8_lossy);
    let api = Api::of_path(path.as_deref().unwrap_or_default());
    let mut answer = api == Api::Responses;
    // The body is read only for an API that names a conversation in it, and only for what
    // the headers did not say (the Responses `store` flag rides along when it is read).
    if api != Api::Other && sticky.is_none() {
        if let Some(bytes) = lazy.bytes(&*host) {
            let fields = agents::fields(api, &bytes);
            answer &= !fields.unstored;
            let conversation = fields.conversation.map(|id| Sticky {
                id,
                kind: Kind::Agent,
            });
            sticky = match fields.previous {
                Previous::Id(id) => Some(Sticky {
                    id,
                    kind: Kind::Continuation,
                }),
                Previous::Absent => conversation,
                Previous::Garbage => {
                    // Names no response: counted, and the conversation names the session.
                    tel.inc(host, Counter::ContinuationUnknown);
                    conversation
                }
            };
        }
    }
    if sticky.as_ref().is_some_and(|s| s.kind != Kind::Configured) {
        tel.inc(host, Counter::SessionAgent);
    }
    Identity { sticky, answer }
}

/// The first of the agent session headers ([`agents::HEADERS`], in their order) present and
/// not empty.
fn agent_header(headers: &[Pair]) -> Option<Vec<u8>> {
    agents::HEADERS
        .iter()
        .find_map(|name| first(headers, name).filter(|v| !v.is_empty()))
        .map(<[u8]>::to_vec)
}

/// Header `name`'s first value in `headers` (names are lowercase in both hosts' maps), as a
/// lookup by name gives a repeated header.
fn first<'a>(headers: &[Pair<'a>], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name.as_bytes()))
        .map(|(_, v)| *v)
}

/// Where a session id lands on a CHWBL ring (`prefix/chwbl.rs`): FNV-1a, then SplitMix64 to
/// spread the bits. Every worker and every replica computes the same point, so the ring's
/// first endpoint is the session's pod without a stored binding (docs/redis-data-model.md §10).
pub fn ring_key(id: &[u8]) -> u64 {
    SplitMix64(hash::fnv1a(hash::FNV_OFFSET, id)).next_u64()
}

/// The configured session id: the header (a repeated header reads as the host gives it, the
/// first value under Envoy), else the cookie, else the body field.
fn configured(host: &dyn Host, config: &SessionConfig, body: &mut Lazy) -> Option<Vec<u8>> {
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
    let field = config.body_field.as_ref()?;
    body_field(&body.bytes(host)?, field)
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
