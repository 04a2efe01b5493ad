//! The vocabulary of the request state machine (`super::request`): what a policy decides, the
//! events a request receives and the effects it asks the balancer to perform.

use super::holding::{Act, Holding, Outcome, Services};
use super::pick::PickReply;
use super::policies::session::Sticky;
pub use super::publish::Placement;
use super::redis_client::{Decode, RedisClient};
pub use super::rejection::{LocalReply, Rejection, DENIED};
use crate::config::{Policy, RouteConfig};
use crate::host::Host;
use crate::prefix::{PrefixKey, PromptTokens};
use crate::reason::{Cause, Reason};
use crate::redis::scripts::Keys;
use crate::redis::scripts::Scripts;
use crate::stats::{Counter, Outcome as Decided};
use std::fmt;
use std::rc::Rc;

/// What a policy decided for one request.
#[derive(Debug)]
pub enum Decision {
    /// Acquire in Redis: send this pick.
    Acquire(Box<dyn Pick>),
    /// Chosen: where it goes (`place`, applied at publish); `hold` (the policy's own: a Redis
    /// lease, a per-proxy count, a service's in-flight count) is given back exactly once, at
    /// stream end.
    Route {
        place: Placement,
        reason: Reason,
        hold: Option<Box<dyn Holding>>,
    },
    /// Refuse the request with 429.
    Reject(Rejection),
    /// Redis found no room for this pick and acquired nothing: refused, and if the request
    /// waits, the same pick tries again.
    Full {
        rejection: Rejection,
        pick: Box<dyn Pick>,
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

/// A Redis acquire in flight, its policy's own type (docs/architecture.md "Holdings"): built by
/// the policy's decision, sent by the Redis client, owned by its request while in flight, and
/// answered by itself: its reply becomes the request's next decision, or is undone when the
/// stream ended first.
pub trait Pick: fmt::Debug {
    /// The route config it was planned for (its Redis target).
    fn config(&self) -> &Rc<RouteConfig>;

    /// Its script call at `now_ms`; `random` breaks ties in the script.
    fn query(&self, scripts: &Scripts, now_ms: u64, random: u32) -> Vec<u8>;

    /// How its reply reads.
    fn decode(&self) -> Decode;

    /// What Redis's `reply` (Err: never sent, nothing acquired) comes to for its request.
    fn answer(self: Box<Self>, reply: Result<PickReply, Cause>) -> Answer;

    /// Its stream ended before `reply` came: what gives back whatever the reply acquired.
    fn undo(self: Box<Self>, reply: &PickReply) -> Vec<Effect>;

    /// Its reply was lost: gives back every lease its script may have written.
    fn release_all(self: Box<Self>, svc: &mut Services);

    /// A waiting request's retry: what changed while it waited (the endpoints), as `redis`
    /// knows them. Err: the retry falls back.
    fn refresh(&mut self, _host: &dyn Host, _redis: &RedisClient) -> Result<(), Cause> {
        Ok(())
    }

    /// Tests: EVALSHA (true) or EVAL after a NOSCRIPT.
    #[cfg(test)]
    fn by_sha(&self) -> bool;

    /// Tests: the policy's own type.
    #[cfg(test)]
    fn as_any(&self) -> &dyn std::any::Any;

    /// Tests: a copy.
    #[cfg(test)]
    fn clone_box(&self) -> Box<dyn Pick>;
}

#[cfg(test)]
impl Clone for Box<dyn Pick> {
    fn clone(&self) -> Box<dyn Pick> {
        self.clone_box()
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
    /// The session, as read with the body (`sessionBodyField` and the agents' body fields
    /// need it), and whether the answer's id is to be recorded (policies/session.rs).
    pub session: Option<Sticky>,
    pub answer: bool,
    /// The prompt's token estimates (the token gate's, prefix/tokens.rs).
    pub tokens: PromptTokens,
    /// `Canonical::prefix_bytes` (the engine-verified index's prediction, verify.rs).
    pub prefix_bytes: Vec<u64>,
}

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
    /// Body bytes buffered so far (fed only while [`super::request::Phase::wants_body`]).
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
        pick: Box<dyn Pick>,
    },
    PickReply(PickReply),
    /// The choice reached the router (Higress override call or the destination header).
    Published(Result<(), Cause>),
    /// Response headers: the `:status` (None when absent or not a number).
    ResponseHeaders {
        status: Option<u32>,
    },
    /// The first response body chunk, at `now_us` (host clock, µs: a first token can come in
    /// a millisecond; fed only while [`super::request::Phase::wants_response_body`]).
    ResponseBody {
        now_us: u64,
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
    Send(Box<dyn Pick>),
    /// A waiting request's pick, sent again with the endpoints as they are now.
    Retry(Box<dyn Pick>),
    /// Refused for want of room with a queue configured: queue (or re-queue) the request,
    /// answered by [`Event::Waited`].
    Wait(Rejection),
    /// The request leaves the queue: drop its place and its Redis waiter entry, count why.
    LeaveQueue {
        ticket: Ticket,
        why: Leave,
    },
    /// Apply the placement (publish.rs).
    Publish(Placement),
    Reply(LocalReply),
    /// Give a holding back, exactly once: at stream end with the request's outcome, or
    /// without one (the request never got an answer through it).
    GiveBack {
        held: Box<dyn Holding>,
        outcome: Option<Outcome>,
    },
    /// Every lease a pick whose reply was lost may have written.
    ReleaseAll(Box<dyn Pick>),
    /// The response's first bytes arrived: the request's holding is told (a booking given
    /// back, a time to first byte recorded).
    FirstBytes,
    /// A policy's own one-off work a Redis reply asks for (docs/architecture.md "Holdings").
    Act(Box<dyn Act>),
    /// The stream ended while `token` was in flight: whoever handles the reply undoes the pick.
    Orphan {
        token: u32,
        pick: Box<dyn Pick>,
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

/// What refusing a request of policy `kind` with `r` counts and answers.
pub fn refused(r: Rejection, kind: Policy) -> Vec<Effect> {
    let rejected = Counter::Decision(kind, Decided::Rejected429);
    let counters = match r {
        Rejection::MaxRequestCount | Rejection::Shed => vec![rejected],
        Rejection::ShedPriority => vec![rejected, Counter::PriorityShed],
        Rejection::ShedTenant => vec![rejected, Counter::TenantShed],
        Rejection::ShedLatency => vec![rejected, Counter::LatencyShed],
        Rejection::HashHeaderMissing | Rejection::HashKeyMissing => {
            vec![Counter::HashHeaderMissing]
        }
        Rejection::ClusterHeaderFailed => vec![Counter::ClusterHeaderFailed],
    };
    let mut e: Vec<Effect> = counters.into_iter().map(Effect::Count).collect();
    e.push(Effect::Reply(r.reply()));
    e
}

/// What a request of policy `kind` falling back for `cause` counts, logs and answers (503 when
/// `denied`: `failureMode: deny`).
pub fn fell_back(cause: Cause, kind: Policy, denied: bool) -> Vec<Effect> {
    let mut e = vec![
        Effect::Count(Counter::Decision(kind, Decided::FellBack)),
        Effect::FellBack { cause, denied },
    ];
    if denied {
        e.push(Effect::Count(Counter::Decision(kind, Decided::Denied)));
        e.push(Effect::Reply(DENIED));
    }
    e
}
