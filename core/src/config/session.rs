//! Session stickiness keys (ours, strict; docs/configuration.md): where a request's session id
//! is read (`sessionHeader`, `sessionCookie`, `sessionBodyField`, tried in that order) and how
//! long a session keeps its pod without a request (`sessionTTL`, refreshed on use; only where a
//! binding is stored in Redis). An option of every endpoint policy (docs/redis-data-model.md §10).

use super::common::is_header_name;
use super::error::ConfigError;
use super::raw::RawLbConfig;
use super::read::In;

pub const SESSION_KEYS: &[&str] = &[
    "sessionHeader",
    "sessionCookie",
    "sessionBodyField",
    "sessionTTL",
];
pub const DEFAULT_SESSION_TTL_S: u64 = 1800;
/// Agents' own identities and Responses continuations, recognised without configuration
/// (docs/sessions-and-queues.md "Agent sessions"): on unless `agentSessions: false`.
pub const AGENT_KEYS: &[&str] = &["agentSessions", "agentSessionTTL"];
/// global_least_request's session guard: a session leaves its pod when the pod carries more
/// than this much load above the least-loaded one... (prefix_cache uses its own
/// `affinityMaxImbalance` / `affinityMaxImbalanceRatio`, whose defaults these are.)
pub const SESSION_MAX_IMBALANCE: u64 = 8;
/// ...and more than this many times its load.
pub const SESSION_MAX_IMBALANCE_RATIO: f64 = 1.5;

/// Which body field names the session (OpenAI's `user`, or one key of `metadata`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyField {
    User,
    Metadata(String),
}

/// Where a route reads a request's session id, and how long a binding lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionConfig {
    /// Lower-case header name.
    pub header: Option<String>,
    pub cookie: Option<String>,
    pub body_field: Option<BodyField>,
    pub ttl_s: u64,
}

/// Agents' own session identities (headers and body fields coding agents and the Responses
/// API send) and Responses continuations (`previous_response_id` → the pod that produced that
/// response), recognised on a route that does not turn them off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSessions {
    /// How long a recognised identity's Redis binding, and a response's pod, is kept without
    /// use (`agentSessionTTL`, s).
    pub ttl_s: u64,
}

/// The route's agent sessions: None with `agentSessions: false`. `agentSessionTTL` defaults
/// to the route's `sessionTTL` when one is set, else to [`DEFAULT_SESSION_TTL_S`]: a KV cache
/// is evicted within minutes on a busy pod, so a continuation sent much later gains little
/// from its pod, while an agent's turn after a long tool call (minutes) still finds it; and the
/// default `sessionTTL` is what a configured session keeps (docs/sessions-and-queues.md).
pub fn agents(
    i: In<'_, '_, RawLbConfig>,
    session_ttl: Option<u64>,
) -> Result<Option<AgentSessions>, ConfigError> {
    let (raw, r) = (i.raw, i.r);
    let on = r.own("agentSessions", &raw.agent_sessions)?.unwrap_or(true);
    let ttl = r.own("agentSessionTTL", &raw.agent_session_ttl)?;
    if !on {
        if ttl.is_some() {
            return Err(r.err(
                "agentSessionTTL",
                "agentSessions is false: no agent session or response is kept",
            ));
        }
        return Ok(None);
    }
    let ttl_s = ttl.or(session_ttl).unwrap_or(DEFAULT_SESSION_TTL_S);
    if !(1..=7 * 86_400).contains(&ttl_s) {
        return Err(r.err("agentSessionTTL", format!("{ttl_s} s is outside 1-604800")));
    }
    Ok(Some(AgentSessions { ttl_s }))
}

/// A cookie name: an RFC 6265 token (no separators, no spaces, no '=' or ';').
fn is_cookie_name(c: &str) -> bool {
    !c.is_empty()
        && c.bytes()
            .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b))
}

/// The route's session settings; None when no session source is configured. `reads_body`
/// is false for a policy that never reads the body (there `sessionBodyField` is refused).
pub fn session(
    i: In<'_, '_, RawLbConfig>,
    reads_body: bool,
) -> Result<Option<SessionConfig>, ConfigError> {
    let (raw, r) = (i.raw, i.r);
    let header = r.own("sessionHeader", &raw.session_header)?;
    if header.as_deref().is_some_and(|h| !is_header_name(h)) {
        return Err(r.err(
            "sessionHeader",
            "must be a header name (letters, digits, '-', '_')",
        ));
    }
    let cookie = r.own("sessionCookie", &raw.session_cookie)?;
    if cookie.as_deref().is_some_and(|c| !is_cookie_name(c)) {
        return Err(r.err("sessionCookie", "must be a cookie name (an RFC 6265 token)"));
    }
    let body_field = match r
        .own("sessionBodyField", &raw.session_body_field)?
        .as_deref()
    {
        None => None,
        Some("user") => Some(BodyField::User),
        Some(f) => match f.strip_prefix("metadata.") {
            Some(key) if !key.is_empty() => Some(BodyField::Metadata(key.to_string())),
            _ => {
                return Err(r.err(
                    "sessionBodyField",
                    format!("unknown value `{f}` (user, metadata.<key>)"),
                ))
            }
        },
    };
    if body_field.is_some() && !reads_body {
        return Err(r.err(
            "sessionBodyField",
            "this route decides at the request headers: use sessionHeader or sessionCookie",
        ));
    }
    let ttl = r.own("sessionTTL", &raw.session_ttl)?;
    if header.is_none() && cookie.is_none() && body_field.is_none() {
        if ttl.is_some() {
            return Err(r.err(
                "sessionTTL",
                "without sessionHeader, sessionCookie or sessionBodyField there is no session",
            ));
        }
        return Ok(None);
    }
    let ttl_s = ttl.unwrap_or(DEFAULT_SESSION_TTL_S);
    if !(1..=7 * 86_400).contains(&ttl_s) {
        return Err(r.err("sessionTTL", format!("{ttl_s} s is outside 1-604800")));
    }
    Ok(Some(SessionConfig {
        header: header.map(|h| h.to_ascii_lowercase()),
        cookie,
        body_field,
        ttl_s,
    }))
}
