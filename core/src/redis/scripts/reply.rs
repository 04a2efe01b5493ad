//! The scripts' replies, typed: what an acquire answered, whether a release released, and the
//! errors a reply can carry instead.

use crate::redis::resp::{self, Value};

/// How the session fared in an acquire (the script's fifth reply item).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionState {
    /// No session in this request.
    #[default]
    None,
    /// The session stayed on its endpoint.
    Kept,
    /// The session had no endpoint: bound to the one picked.
    New,
    /// The session's endpoint left or was over the guard: bound to the one picked.
    Rebound,
}

/// prefix_cache: the uncached prompt tokens an acquire booked on its endpoint, and the
/// endpoint's booked tokens before them (docs/redis-data-model.md §13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Booked {
    pub ahead: u64,
    pub tokens: u64,
    /// Latency-aware placement: what the script predicted on the endpoint (§15).
    pub predicted: Option<Predicted>,
}

/// A latency-aware pick's prediction for its endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Predicted {
    pub ttft_us: u64,
    pub tpot_us: u64,
}

/// What an acquire answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireReply {
    /// `depth`: prefix blocks matched (0 = none); `spilled`: the match was too loaded;
    /// `load_before`: the endpoint's load before this request (None: the session binding
    /// call, which counts nothing).
    Picked {
        endpoint: String,
        depth: u32,
        spilled: bool,
        session: SessionState,
        load_before: Option<u64>,
        /// prefix_cache's booking (None: nothing booked, or another script).
        booked: Option<Booked>,
        /// Every endpoint was ejected: chosen as if none were (health.lua).
        all_ejected: bool,
    },
    /// Every endpoint is at the cap, or the pool at its cap: nothing was incremented.
    Full,
    /// The pool is at its cap: nothing was incremented.
    PoolFull,
    /// The request's tenant is at its share while another tenant is active.
    Tenant,
    /// Redis does not have this caller's endpoint set: resend with the list.
    Sync,
    /// No endpoints at all in Redis.
    Empty,
    /// Latency-aware placement shed the request: no endpoint was predicted to meet its
    /// objectives (the best's prediction); nothing was acquired.
    Shed(Predicted),
}

/// A reply that is not what the script returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyError {
    /// The script is not cached in Redis: resend with EVAL.
    NoScript,
    /// Redis answered an error (`-ERR`, `-NOAUTH`, `-MOVED`, ...).
    Redis(String),
    /// Not RESP, or not the shape the script returns.
    Malformed(String),
}

impl std::fmt::Display for ReplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplyError::NoScript => write!(f, "NOSCRIPT"),
            ReplyError::Redis(e) => write!(f, "redis error: {e}"),
            ReplyError::Malformed(e) => write!(f, "malformed reply: {e}"),
        }
    }
}

pub(in crate::redis) fn decode(raw: &[u8]) -> Result<Value, ReplyError> {
    match resp::decode_exact(raw) {
        Ok(Value::Error(e)) if e.starts_with("NOSCRIPT") => Err(ReplyError::NoScript),
        Ok(Value::Error(e)) => Err(ReplyError::Redis(e)),
        Ok(v) => Ok(v),
        Err(e) => Err(ReplyError::Malformed(e.to_string())),
    }
}

pub fn parse_acquire(raw: &[u8]) -> Result<AcquireReply, ReplyError> {
    let value = decode(raw)?;
    let Value::Array(Some(items)) = &value else {
        return Err(ReplyError::Malformed(format!(
            "expected an array, got {value:?}"
        )));
    };
    let tag = items.first().and_then(Value::as_str);
    match (tag, items.get(1).and_then(Value::as_str)) {
        (Some("OK"), Some(ep)) if !ep.is_empty() => {
            // {OK, endpoint, depth, spilled, session state, load before[, prefill ahead,
            // tokens booked]}; the session binding call (session_bind.lua) stops after the
            // state, global_least_request after the load.
            let int = |i: usize| items.get(i).and_then(Value::as_i64);
            let session = match int(4) {
                Some(0) => SessionState::None,
                Some(1) => SessionState::Kept,
                Some(2) => SessionState::New,
                Some(3) => SessionState::Rebound,
                _ => {
                    return Err(ReplyError::Malformed(format!(
                        "unexpected session state in {items:?}"
                    )))
                }
            };
            Ok(AcquireReply::Picked {
                endpoint: ep.to_string(),
                depth: int(2).unwrap_or(0).clamp(0, i64::from(u32::MAX)) as u32,
                spilled: int(3) == Some(1),
                session,
                load_before: int(5).and_then(|l| u64::try_from(l).ok()),
                // Latency-aware picks report their prediction and the tokens ahead even when
                // nothing was booked (a fully cached prompt).
                booked: match (int(6), int(7), predicted(int(9), int(10))) {
                    (Some(ahead), Some(tokens), predicted) if tokens > 0 || predicted.is_some() => {
                        Some(Booked {
                            ahead: u64::try_from(ahead).unwrap_or(0),
                            tokens: u64::try_from(tokens).unwrap_or(0),
                            predicted,
                        })
                    }
                    _ => None,
                },
                all_ejected: int(8) == Some(1),
            })
        }
        (Some("FULL"), _) => Ok(AcquireReply::Full),
        (Some("SHED"), _) => {
            let int = |i: usize| items.get(i).and_then(Value::as_i64);
            Ok(AcquireReply::Shed(predicted(int(1), int(2)).unwrap_or(
                Predicted {
                    ttft_us: 0,
                    tpot_us: 0,
                },
            )))
        }
        (Some("TENANT"), _) => Ok(AcquireReply::Tenant),
        (Some("POOL"), _) => Ok(AcquireReply::PoolFull),
        (Some("SYNC"), _) => Ok(AcquireReply::Sync),
        (Some("EMPTY"), _) => Ok(AcquireReply::Empty),
        _ => Err(ReplyError::Malformed(format!(
            "unexpected acquire reply {items:?}"
        ))),
    }
}

/// A prediction the script reported (-1 or absent: none).
fn predicted(ttft: Option<i64>, tpot: Option<i64>) -> Option<Predicted> {
    match (ttft, tpot) {
        (Some(t), Some(p)) if t >= 0 && p >= 0 => Some(Predicted {
            ttft_us: t as u64,
            tpot_us: p as u64,
        }),
        _ => None,
    }
}

/// Whether a lease was released.
/// What a release did (release.lua's reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// No lease among the members was there (released before, or reclaimed).
    Nothing,
    Released,
    /// Released, and its endpoint ejected.
    Ejected,
    /// Released; its endpoint failed enough to be ejected, but too many already were.
    EjectionRefused,
}

pub fn parse_release(raw: &[u8]) -> Result<Released, ReplyError> {
    match decode(raw)? {
        Value::Integer(0) => Ok(Released::Nothing),
        Value::Integer(1) => Ok(Released::Released),
        Value::Integer(2) => Ok(Released::Ejected),
        Value::Integer(3) => Ok(Released::EjectionRefused),
        other => Err(ReplyError::Malformed(format!(
            "unexpected release reply {other:?}"
        ))),
    }
}
