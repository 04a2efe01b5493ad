//! The vocabulary of the request state machine (`super::request`): what a policy decides, the
//! events a request receives and the effects it asks the balancer to perform.

use super::holding::{Act, Holding, Outcome};
use super::pick::{Pick, PickReply};
use crate::config::RouteConfig;
use crate::prefix::{PrefixKey, PromptTokens};
use crate::reason::{Cause, Reason};
use crate::redis::scripts::Keys;
use crate::stats::Counter;
use std::rc::Rc;

/// What a policy decided for one request.
#[derive(Debug)]
pub enum Decision {
    /// Acquire in Redis: send this pick.
    Acquire(Box<Pick>),
    /// Chosen; `hold` (the policy's own: a Redis lease, a per-proxy count, a service's
    /// in-flight count) is given back exactly once, at stream end.
    Route {
        endpoint: String,
        fallbacks: Vec<String>,
        reason: Reason,
        hold: Option<Box<dyn Holding>>,
    },
    /// Refuse the request with 429.
    Reject(Rejection),
    /// Redis found no room for this pick and acquired nothing: refused, and if the request
    /// waits, the same pick tries again.
    Full {
        rejection: Rejection,
        pick: Box<Pick>,
    },
    /// Refused for want of room (plain Envoy's prefix_cache), with what was read from the body:
    /// if the request waits, its retry decides with it (see [`PromptRead`]).
    Refused {
        rejection: Rejection,
        read: Rc<PromptRead>,
    },
    /// The policy cannot decide: fail open (or 503 under `failureMode: deny`).
    Fallback(Cause),
}

/// What a Redis reply to a pick (or a pick that could not be sent) comes to: `effects`
/// first, then `decision`, taken as a policy's decision; `if_fallback` is counted when that
/// decision falls back.
#[derive(Debug)]
pub struct Answer {
    pub effects: Vec<Effect>,
    pub decision: Decision,
    pub if_fallback: Vec<Counter>,
}

impl Answer {
    pub fn new(effects: Vec<Effect>, decision: Decision) -> Answer {
        Answer {
            effects,
            decision,
            if_fallback: Vec::new(),
        }
    }
}

/// What plain Envoy's prefix_cache read from a request's body before refusing it for want of
/// room. A held body cannot be read outside its own callback, so a retry from the waiting
/// queue decides with this; without it the request would be balanced without its prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptRead {
    /// The prompt's chained prefix keys (prefix/chain.rs) and its anchor block (prefix/anchor.rs).
    pub keys: Vec<PrefixKey>,
    pub anchor: usize,
    /// The session id, as read with the body (`sessionBodyField` needs it).
    pub session: Option<Vec<u8>>,
    /// The prompt's token estimates (the token gate's, prefix/tokens.rs).
    pub tokens: PromptTokens,
    /// `Canonical::prefix_bytes` (the engine-verified index's prediction, verify.rs).
    pub prefix_bytes: Vec<u64>,
    /// The plugin asked the stream for its usage (`verifyCachedTokens`, verify.rs).
    pub injected: bool,
}

/// Why a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Every endpoint is at `maxRequestCount`.
    MaxRequestCount,
    /// A sheddable request while every endpoint is saturated (endpoint_metrics).
    Shed,
    /// Priority classes: every endpoint is at this request's class cap (docs/sessions-and-queues.md
    /// "Priority classes"); 429 with `Retry-After`.
    ShedPriority,
    /// Tenant fairness: the request's tenant holds its share of the pool while another tenant
    /// is active (docs/sessions-and-queues.md "Tenant fairness"); 429 with `Retry-After`.
    ShedTenant,
    /// cluster_hash: `hash_header` missing or empty (Higress answers 403).
    HashHeaderMissing,
    /// cluster_hash with a `key` block (Higress PR #3921): its key missing or empty (403).
    HashKeyMissing,
    /// A cluster policy could not write `cluster_header` (Higress answers 500).
    ClusterHeaderFailed,
}

/// A response the plugin answers itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub details: &'static str,
    pub body: &'static [u8],
    /// A `retry-after` header of this many seconds (0: none).
    pub retry_after_s: u32,
}

/// The `Retry-After` of a priority shed: load moves within about a second.
pub const SHED_RETRY_AFTER_S: u32 = 1;

impl Rejection {
    /// A refusal for want of room, which the waiting queue may turn into a wait (README
    /// "Waiting queue"): any such rejection, whichever policy or cap refused (a full pool,
    /// `maxPoolRequests`, answers as `MaxRequestCount` / `ShedPriority`, so it waits too).
    /// A tenant over its share does not wait: the room it is refused is free for the other
    /// tenants, yet a waiter holds it back from lower classes everywhere (its Redis or
    /// shared-data entry) and takes its VM queue's retries as the head, so quiet tenants
    /// behind it would wait for the flooder's own requests to finish; the 429 with
    /// `Retry-After` is the back-pressure fairness means (docs/sessions-and-queues.md "Tenant fairness").
    pub fn may_wait(self) -> bool {
        match self {
            Rejection::MaxRequestCount | Rejection::Shed | Rejection::ShedPriority => true,
            Rejection::ShedTenant
            | Rejection::HashHeaderMissing
            | Rejection::HashKeyMissing
            | Rejection::ClusterHeaderFailed => false,
        }
    }

    pub fn reason(self) -> Reason {
        match self {
            Rejection::MaxRequestCount => Reason::Rejected429,
            Rejection::Shed => Reason::Shed429,
            Rejection::ShedPriority => Reason::ShedPriority,
            Rejection::ShedTenant => Reason::ShedTenant,
            Rejection::HashHeaderMissing => Reason::HashHeaderMissing403,
            Rejection::HashKeyMissing => Reason::HashKeyMissing403,
            Rejection::ClusterHeaderFailed => Reason::ClusterHeaderFailed500,
        }
    }

    pub fn reply(self) -> LocalReply {
        match self {
            Rejection::MaxRequestCount => LocalReply {
                status: 429,
                details: "ai_lb_max_request_count",
                body: b"Exceeded maximum request limit from ai-load-balancer.",
                retry_after_s: 0,
            },
            Rejection::ShedPriority => LocalReply {
                status: 429,
                details: "ai_lb_shed_priority",
                body: b"Every endpoint is saturated for this priority class: rejected by ai-load-balancer.",
                retry_after_s: SHED_RETRY_AFTER_S,
            },
            Rejection::ShedTenant => LocalReply {
                status: 429,
                details: "ai_lb_shed_tenant",
                body: b"This tenant holds its share of the pool while others wait: rejected by ai-load-balancer.",
                retry_after_s: SHED_RETRY_AFTER_S,
            },
            Rejection::Shed => LocalReply {
                status: 429,
                details: "ai_lb_shed",
                body:
                    b"Every endpoint is saturated: sheddable request rejected by ai-load-balancer.",
                retry_after_s: 0,
            },
            // Higress's exact answers (docs/higress-cluster-policies.md §2, §3.3).
            Rejection::HashHeaderMissing => LocalReply {
                status: crate::cluster::hash::MISSING_HEADER_STATUS,
                details: "ai_lb_hash_header_required",
                body: crate::cluster::hash::MISSING_HEADER_BODY.as_bytes(),
                retry_after_s: 0,
            },
            // The PR's answer (`rejectMissingHashKey`).
            Rejection::HashKeyMissing => LocalReply {
                status: crate::cluster::hash::MISSING_HEADER_STATUS,
                details: "ai_lb_hash_key_required",
                body: crate::cluster::hash::MISSING_KEY_BODY.as_bytes(),
                retry_after_s: 0,
            },
            Rejection::ClusterHeaderFailed => LocalReply {
                status: crate::cluster::hash::HEADER_WRITE_FAILED_STATUS,
                details: "ai_lb_cluster_header_failed",
                body: crate::cluster::hash::HEADER_WRITE_FAILED_BODY.as_bytes(),
                retry_after_s: 0,
            },
        }
    }
}

/// The answer under `failureMode: deny`.
pub const DENIED: LocalReply = LocalReply {
    status: 503,
    details: "ai_lb_failure",
    body: b"ai-load-balancer could not pick an endpoint",
    retry_after_s: 0,
};

/// A waiting request's place in its VM's queue (docs/sessions-and-queues.md "Waiting queue"): highest class
/// (`rank` 0) first, then arrival order (`seq`).
#[derive(Debug, Clone)]
pub struct Ticket {
    pub rank: usize,
    pub seq: u64,
    /// When it started waiting and when it gives up (host clock, ms).
    pub since_ms: u64,
    pub deadline_ms: u64,
    /// Its entry among every gateway's (Redis) or worker's (shared data) waiters, with
    /// priority classes.
    pub waiter: Option<Rc<Waiter>>,
}

/// A waiting request's entry among every gateway's (or worker's) waiters
/// (docs/redis-data-model.md §12).
#[derive(Debug)]
pub enum Waiter {
    /// In the route's Redis wait set (Higress build).
    Redis {
        config: Rc<RouteConfig>,
        keys: Rc<Keys>,
        member: String,
    },
    /// In the proxy-wide wait set in shared data (plain Envoy, `super::waiters`).
    Shared { key: Rc<str>, id: u64 },
}

/// The balancer's answer to [`Effect::Wait`].
#[derive(Debug, Clone)]
pub enum WaitAnswer {
    /// Queued (or queued again after a retry found no room): wait for a slot.
    Wait(Ticket),
    /// `maxQueued` requests already wait in this VM: refused at once.
    Full,
    /// Its deadline passed: refused.
    Timeout,
}

/// Why a request left the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leave {
    /// Routed (`ai_lb.queue.admitted`).
    Admitted,
    /// `queueTimeoutMs` passed (`ai_lb.queue.timeout`).
    Timeout,
    /// The stream ended while it waited (`ai_lb.queue.abandoned`).
    Abandoned,
    /// Ended otherwise (a fallback while retrying: counted as that fallback).
    Other,
}

/// Everything that happens to a request, in the order the host and Redis deliver it.
#[derive(Debug)]
pub enum Event {
    /// `withheld`: this VM learned that the host never shows a held request's body (plain
    /// Envoy without `allow_on_headers_stop_iteration`): do not wait for it.
    Headers {
        end_of_stream: bool,
        withheld: bool,
    },
    /// Body bytes buffered so far (fed only while [`Request::wants_body`]).
    Body {
        size: usize,
        end_of_stream: bool,
    },
    /// The body did not arrive within `maxBodyWaitMs` (plain Envoy).
    BodyTimeout,
    Decided(Decision),
    /// The acquire was handed to the host (its token) or could not be.
    Sent {
        result: Result<u32, Cause>,
        pick: Box<Pick>,
    },
    PickReply(PickReply),
    /// The choice reached the router (Higress override call or the destination header).
    Published(Result<(), Cause>),
    /// Response headers: the `:status` (None when absent or not a number).
    ResponseHeaders {
        status: Option<u32>,
    },
    /// The first response body chunk, at `now_ms` (host clock; fed only while
    /// [`super::request::Request::wants_response_body`]).
    ResponseBody {
        now_ms: u64,
    },
    /// The answer to [`Effect::Wait`] for `rejection`.
    Waited {
        rejection: Rejection,
        answer: WaitAnswer,
    },
    /// Room may have freed: a waiting request tries again (one acquire).
    Admit,
    /// A waiting request's deadline passed.
    QueueTimeout,
}

/// What the balancer performs for a request. A batch holds at most one effect that answers
/// with an event (`Decide`, `Send`, `Retry`, `Wait`, `Publish`), and it comes last.
#[derive(Debug)]
pub enum Effect {
    /// Run the route's policy; `read_body`: the body may be read (false for an oversized one).
    Decide {
        read_body: bool,
    },
    /// A waiting request decides again (plain Envoy) with what the first decision read from
    /// its body.
    Redecide(Rc<PromptRead>),
    Send(Box<Pick>),
    /// A waiting request's pick, sent again with the endpoints as they are now.
    Retry(Box<Pick>),
    /// Refused for want of room with a queue configured: queue (or re-queue) the request,
    /// answered by [`Event::Waited`].
    Wait(Rejection),
    /// The request leaves the queue: drop its place and its Redis waiter entry, count why.
    LeaveQueue {
        ticket: Ticket,
        why: Leave,
    },
    Publish {
        endpoint: String,
        fallbacks: Vec<String>,
    },
    Reply(LocalReply),
    /// Give a holding back, exactly once: at stream end with the request's outcome, or
    /// without one (the request never got an answer through it).
    GiveBack {
        held: Box<dyn Holding>,
        outcome: Option<Outcome>,
    },
    /// Every lease a pick whose reply was lost may have written.
    ReleaseAll(Box<Pick>),
    /// The response's first bytes arrived: the request's holding is told (a booking given
    /// back, a time to first byte recorded).
    FirstBytes,
    /// A policy's own one-off work a Redis reply asks for (docs/architecture.md "Holdings").
    Act(Box<dyn Act>),
    /// The stream ended while `token` was in flight: whoever handles the reply undoes the pick.
    Orphan {
        token: u32,
        pick: Box<Pick>,
    },
    Count(Counter),
    /// Balanced without reading the body (over `maxBodyBytes`, its wait timed out, or the
    /// host withholds it): count the cause and say why (rate-limited).
    NoBody(Cause),
    /// The request fell back: count the cause and log it (rate-limited).
    FellBack {
        cause: Cause,
        denied: bool,
    },
    /// Redis holds (or no longer holds) this VM's endpoint set for `namespace`.
    Synced {
        namespace: String,
        fingerprint: Rc<str>,
    },
    Unsynced {
        namespace: String,
    },
}
