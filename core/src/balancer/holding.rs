//! What a routed request holds until its stream ends, and the outcome the machine measures for
//! every request (docs/architecture.md "A request's path", "Holdings").
//!
//! A holding is its policy's own type (a Redis lease, a per-proxy count, a service's in-flight
//! count with its latency): the machine keeps it, unopened, in the request's phase, hands it the
//! request's later events (first response bytes), and gives it back exactly once: by moving the
//! box into [`Holding::give_back`]. Nothing here names a policy.

use super::publish::Placed;
use super::redis_client::RedisClient;
use super::telemetry::Telemetry;
use crate::host::Host;
use crate::verify::Tokens;
use std::fmt;

/// What the machine measured of one request's answer, for every request it routed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Where the request was placed, its destination first (publish.rs).
    pub endpoints: Vec<Placed>,
    /// The response's `:status` as [`response_status`] reads it (None: no response headers
    /// came — a reset, a connect failure, a timeout — or the status was malformed).
    pub status: Option<u32>,
    /// Host clock (µs) at the first response body bytes, measured when the holding asks for
    /// them ([`Holding::wants_first_bytes`]): every other request's body chunks pass the glue
    /// without calling in (docs/plugin-cpu.md).
    pub first_byte_us: Option<u64>,
    /// Host clock (ms) at stream end (set when the holding is given back at stream end).
    pub end_ms: Option<u64>,
    /// The answer's token counts, read from its bounded tail when a holding asked for them
    /// ([`Holding::read_response`]; each count None when the answer did not carry it). None:
    /// not read (no holding asked: reading enters the VM on every chunk the glue otherwise
    /// passes, docs/plugin-cpu.md), or the read was given up.
    pub usage: Option<Tokens>,
    /// The answer's own `id`, read from its bounded head when a holding asked for it
    /// ([`ReadResponse::answer_id`]; verify/answer_id.rs): a Responses answer's `resp_…`, which a
    /// later request may continue. None: not asked, not read, or the answer named none.
    pub answer_id: Option<String>,
}

/// What a holding asks the machine to read of the response body (core/src/verify/: the bounded
/// tail, and the usage-only event of a stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadResponse {
    /// Read the token counts at the end ([`Outcome::usage`]).
    pub usage: bool,
    /// Take the usage-only event out of the stream (the plugin asked for it, the client did
    /// not).
    pub take_usage_event: bool,
    /// Read the answer's own id from its head at the end ([`Outcome::answer_id`]).
    pub answer_id: bool,
}

impl ReadResponse {
    /// What either of two holdings (a wrapper and the holding it wraps) asks to be read: one
    /// reader per response serves both.
    pub fn and(a: Option<ReadResponse>, b: Option<ReadResponse>) -> Option<ReadResponse> {
        match (a, b) {
            (Some(a), Some(b)) => Some(ReadResponse {
                usage: a.usage || b.usage,
                take_usage_event: a.take_usage_event || b.take_usage_event,
                answer_id: a.answer_id || b.answer_id,
            }),
            (a, b) => a.or(b),
        }
    }
}

impl Outcome {
    /// Higress's success test: `:status` exactly 200 (docs/higress-cluster-policies.md §3.3).
    pub fn success(&self) -> bool {
        success(self.status)
    }
}

/// The VM services a holding (or a policy's [`Act`]) may use when the machine runs it: the
/// host, the counters and the Redis client, for request `ctx`.
pub struct Services<'a> {
    pub host: &'a mut dyn Host,
    pub tel: &'a mut Telemetry,
    pub redis: &'a mut RedisClient,
    pub ctx: u32,
}

/// What a routed request holds until its stream ends; given back exactly once.
pub trait Holding: fmt::Debug {
    /// Whether the response's first bytes matter to it (a booking to give back, a TTFT to
    /// record): [`Holding::first_bytes`] is then called once they arrive.
    fn wants_first_bytes(&self) -> bool {
        false
    }

    /// The response's first body bytes arrived (`outcome.first_byte_us` is set).
    fn first_bytes(&mut self, _svc: &mut Services, _outcome: &Outcome) {}

    /// The response headers arrived (`outcome.status` is set): what of its body the machine
    /// is to read for it, if anything. One reader per response, whoever asks.
    fn read_response(&mut self, _svc: &mut Services, _outcome: &Outcome) -> Option<ReadResponse> {
        None
    }

    /// The answer's own id was read from its head (`outcome.answer_id` is set) for a holding
    /// that asked for it: told once, as soon as it is known, before the chunk that completed it
    /// goes on to the client (a stream's first event carries it).
    fn answer_id(&mut self, _svc: &mut Services, _outcome: &Outcome) {}

    /// Gives back what is held, exactly once: at stream end with the request's `outcome`, or
    /// with None when the request never got an answer through this holding (a failed publish,
    /// a Redis reply that is not used, an orphaned pick).
    fn give_back(self: Box<Self>, svc: &mut Services, outcome: Option<&Outcome>);

    /// The endpoint this holding counted, when the answer may come from another: the host's
    /// retry sends a failed try elsewhere (plain Envoy: the next endpoint of the override
    /// list; Higress: the cluster's own balancing, docs/higress-abi.md §8), and the machine
    /// compares the endpoint that answered (docs/redis-data-model.md §14 "Served elsewhere").
    fn counted(&self) -> Option<&str> {
        None
    }

    /// The host's retry answered from `served`, not from the endpoint [`Holding::counted`]
    /// names: that endpoint failed (failure memory learns it) and the count moves to
    /// `served`. Called at most once, at the response headers.
    fn served_elsewhere(&mut self, _svc: &mut Services, _served: &str) {}

    /// What the debug header adds for this holding (`; name=value` pairs), if anything.
    fn debug(&self) -> Option<String> {
        None
    }

    /// Tests' ledgers: what it holds, by name.
    #[cfg(test)]
    fn ledger(&self) -> Vec<String>;

    /// Tests: the policy's own type.
    #[cfg(test)]
    fn as_any(&self) -> &dyn std::any::Any;
}

/// A policy's own host work that a Redis reply asks for besides its decision (count a service
/// in this proxy's statistics, mark an endpoint as sent to): run once by the performer.
pub trait Act: fmt::Debug {
    fn run(self: Box<Self>, svc: &mut Services);

    /// Tests' ledgers: what it takes, by name.
    #[cfg(test)]
    fn ledger(&self) -> Vec<String> {
        Vec::new()
    }

    /// Tests: the policy's own type.
    #[cfg(test)]
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Higress's success test: `:status` exactly 200; anything else, or no status (reset, timeout
/// before headers), is an error (docs/higress-cluster-policies.md §3.3).
pub fn success(status: Option<u32>) -> bool {
    status == Some(200)
}

/// The response's `:status`, as [`success`] reads it: an HTTP status is three digits, the
/// first not 0; anything else reads as None, so that only the exact `200` that Go's string
/// compare accepts is a success (not `0200` nor `+200`).
pub fn response_status(host: &mut dyn Host) -> Option<u32> {
    let value = host.response_status().ok().flatten()?;
    let [a @ b'1'..=b'9', b @ b'0'..=b'9', c @ b'0'..=b'9'] = value.as_slice() else {
        return None;
    };
    Some(u32::from(a - b'0') * 100 + u32::from(b - b'0') * 10 + u32::from(c - b'0'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::mock::MockHost;

    #[test]
    fn a_status_is_read_only_when_it_is_all_digits() {
        let mut host = MockHost::new();
        assert_eq!(response_status(&mut host), None, "no status header");
        for (value, read) in [
            ("200", Some(200)),
            ("503", Some(503)),
            ("0200", None),
            ("099", None),
            ("100", Some(100)),
            ("+200", None),
            ("", None),
            ("2x0", None),
            (" 200", None),
            ("2000", None),
        ] {
            host.response_headers = vec![(":status".into(), value.into())];
            assert_eq!(response_status(&mut host), read, "{value:?}");
            assert_eq!(success(read), value == "200", "{value:?}");
        }
    }
}
