//! One request's state machine (docs/architecture.md "A request's path"). A [`Request`] owns its
//! phase and, while Redis is answering, its in-flight [`Pick`]. Every transition takes an
//! [`Event`] and returns the [`Effect`]s the balancer performs; nothing here touches the host.
//!
//! The rule that matters: whatever a pick acquired is given back exactly once. An acquire
//! exists in exactly one place at a time — the pick in `State::Picking`, then the holding in
//! `State::Routed` (phase.rs) — and leaves it only through an effect that gives it back: [`Request::finish`]
//! at stream end, a failed publish, a reply naming an endpoint we did not offer, a lost reply
//! ([`Effect::ReleaseAll`]), or, when the stream ended first, [`undo`] on the orphaned pick.
//!
//! Whether the request is held follows from the phase: it is held while buffering its body or
//! while a pick is in flight ([`Phase::is_held`]); the balancer resumes it when an
//! asynchronous event moves it out of a held phase, unless a local reply ended it.
//!
//! Over 400 lines: the transitions of one state machine, the waiting queue's among them, read
//! best together; what the dispatcher reads of a request's phase is in phase.rs.

use super::events::Pick;
use super::events::{self, Answer};
pub use super::events::{
    Decision, Effect, Event, Leave, LocalReply, PromptRead, Rejection, Ticket, WaitAnswer, Waiter,
};
use super::holding::Outcome;
pub use super::orphan::undo;
use super::pick::PickReply;
use crate::config::{FailureMode, RouteConfig};
use crate::reason::{Cause, Reason};
use crate::redis::inflight::InflightKeys;
use crate::redis::scripts::Keys;
use crate::stats::{self, Counter};
use std::rc::Rc;

/// One HTTP request's routing.
#[derive(Debug)]
pub struct Request {
    pub config: Rc<RouteConfig>,
    /// The config's place among the plugin's route configs (global first): its policy's.
    pub route: usize,
    /// Redis keys of (route, cluster); None when the host did not name them.
    pub keys: Option<Rc<Keys>>,
    /// cluster_metrics with `global_inflight_enabled`: the route's count in Redis.
    pub inflight: Option<Rc<InflightKeys>>,
    /// Body bytes buffered so far.
    pub body_bytes: usize,
    /// When the request headers arrived (host clock, ms): the body wait counts from here.
    pub since_ms: u64,
    /// Waiting queue: its place while it waits or retries (None once it left the queue).
    ticket: Option<Ticket>,
    /// How long it waited in the queue (debug header `queued_ms=`), once it left.
    pub queued_ms: Option<u64>,
    phase: Phase,
}

impl Request {
    pub fn new(config: Rc<RouteConfig>, keys: Option<Rc<Keys>>) -> Request {
        Request {
            config,
            route: 0,
            keys,
            inflight: None,
            body_bytes: 0,
            since_ms: 0,
            ticket: None,
            queued_ms: None,
            phase: Phase(State::AwaitingBody),
        }
    }

    /// Its phase, for what the dispatcher reads (phase.rs).
    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// Its phase, for what the dispatcher does to a routed request (its holding told the first
    /// bytes, its response read, its endpoint marked failed) or to an abandoned pick.
    pub fn phase_mut(&mut self) -> &mut Phase {
        &mut self.phase
    }

    /// Plain Envoy: when a request still waiting for its body is balanced without it.
    pub fn body_deadline(&self) -> Option<u64> {
        let wait = self.config.common.max_body_wait_ms;
        (self.phase.wants_body() && wait > 0).then(|| self.since_ms.saturating_add(wait))
    }

    /// Stream end at `now_ms` (host clock), whatever ended it: what must be given back,
    /// exactly once.
    pub fn finish(self, now_ms: u64) -> Option<Effect> {
        self.phase.finish(now_ms)
    }

    pub fn handle(&mut self, event: Event) -> Vec<Effect> {
        let mut e = self.on_event(event);
        // A queued request that ends up routed or settled leaves the queue, exactly once.
        if matches!(self.phase.0, State::Routed { .. } | State::Settled { .. }) {
            if let Some(ticket) = self.ticket.take() {
                let why = match self.phase.0 {
                    State::Routed { .. } => Leave::Admitted,
                    _ => Leave::Other,
                };
                // Before an effect that answers with an event, which must come last.
                e.insert(0, Effect::LeaveQueue { ticket, why });
            }
        }
        e
    }

    fn on_event(&mut self, event: Event) -> Vec<Effect> {
        match event {
            Event::Headers {
                end_of_stream,
                withheld,
            } => self.on_headers(end_of_stream, withheld),
            Event::BodyTimeout if self.phase.wants_body() => vec![
                Effect::NoBody(Cause::BodyTimeout),
                Effect::Decide { read_body: false },
            ],
            Event::BodyTimeout => Vec::new(),
            Event::Body {
                size,
                end_of_stream,
            } => self.on_body(size, end_of_stream),
            Event::Decided(d) => self.on_decided(d),
            Event::Sent { result, pick } => self.on_sent(result, pick),
            Event::PickReply(r) => self.on_pick_reply(r),
            Event::Published(r) => self.on_published(r),
            Event::ResponseHeaders { status } => {
                if let State::Routed { outcome, .. } = &mut self.phase.0 {
                    outcome.status = status;
                }
                Vec::new()
            }
            Event::ResponseBody { now_us } => self.on_response_body(now_us),
            Event::Waited { rejection, answer } => self.on_waited(rejection, answer),
            Event::Admit => self.on_admit(),
            Event::QueueTimeout => match &self.phase.0 {
                State::Waiting { rejection, .. } => {
                    let r = *rejection;
                    self.time_out(r)
                }
                _ => Vec::new(),
            },
        }
    }

    fn on_headers(&mut self, end_of_stream: bool, withheld: bool) -> Vec<Effect> {
        // The Redis keys are named after the route and cluster: without them nothing to pick.
        // Cluster policies name no route keys (they choose the cluster); endpoint_metrics keeps
        // only session bindings there and consistent-hashes sessions without them.
        if self.keys.is_none() && self.config.needs_route_keys() {
            return self.fall_back(Cause::NoRoute);
        }
        if end_of_stream || self.config.decide_at_headers {
            vec![Effect::Decide { read_body: true }]
        } else if withheld {
            // Holding would only wait for the deadline: the body comes after the release.
            vec![
                Effect::NoBody(Cause::BodyWithheld),
                Effect::Decide { read_body: false },
            ]
        } else {
            // Under ABI 0_2_100 (Higress) a Pause holds the headers and still delivers the
            // body; plain Envoy does so with `allow_on_headers_stop_iteration`
            // (docs/higress-abi.md §10), and `body_deadline` bounds the wait without it.
            Vec::new()
        }
    }

    fn on_body(&mut self, size: usize, end_of_stream: bool) -> Vec<Effect> {
        if !self.phase.wants_body() {
            return Vec::new();
        }
        self.body_bytes = size;
        if size > self.config.common.max_body_bytes {
            // Do not hold a huge body: balance without reading it, right now (counted and
            // warned like a fallback: docs/metrics.md "Logs").
            return vec![
                Effect::NoBody(Cause::BodyTooLarge),
                Effect::Decide { read_body: false },
            ];
        }
        if end_of_stream {
            vec![Effect::Decide { read_body: true }]
        } else {
            Vec::new() // keep buffering until the whole body is here
        }
    }

    fn on_decided(&mut self, decision: Decision) -> Vec<Effect> {
        match decision {
            Decision::Acquire(pick) => vec![Effect::Send(pick)],
            Decision::Route {
                place,
                reason,
                hold,
            } => {
                self.phase.0 = State::Routed {
                    reason,
                    held: hold,
                    outcome: Outcome {
                        endpoints: place.endpoints(),
                        ..Outcome::default()
                    },
                    reader: None,
                };
                vec![Effect::Publish(place)]
            }
            Decision::Reject(r) => self.refuse(r, Again::Decide(None)),
            Decision::Full { rejection, pick } => self.refuse(rejection, Again::Pick(pick)),
            Decision::Refused { rejection, read } => {
                self.refuse(rejection, Again::Decide(Some(read)))
            }
            Decision::Fallback(cause) => self.fall_back(cause),
        }
    }

    fn on_sent(&mut self, result: Result<u32, Cause>, pick: Box<dyn Pick>) -> Vec<Effect> {
        match result {
            Ok(token) => {
                self.phase.0 = State::Picking { token, pick };
                Vec::new()
            }
            // Never sent: nothing acquired.
            Err(cause) => self.answered(pick.answer(Err(cause))),
        }
    }

    fn on_pick_reply(&mut self, reply: PickReply) -> Vec<Effect> {
        let State::Picking { pick, .. } = std::mem::replace(&mut self.phase.0, State::Resending)
        else {
            return Vec::new();
        };
        self.answered(pick.answer(Ok(reply)))
    }

    /// What a reply came to: its effects, then its decision as a policy's.
    fn answered(&mut self, answer: Answer) -> Vec<Effect> {
        let Answer {
            mut effects,
            decision,
            if_fallback,
        } = answer;
        let fell_back = matches!(decision, Decision::Fallback(_));
        effects.extend(self.on_decided(decision));
        if fell_back {
            effects.extend(if_fallback.into_iter().map(Effect::Count));
        }
        effects
    }

    fn on_published(&mut self, result: Result<(), Cause>) -> Vec<Effect> {
        let State::Routed { reason, .. } = &self.phase.0 else {
            return Vec::new();
        };
        let reason = *reason;
        match result {
            Ok(()) => {
                let routed = Counter::Decision(self.config.policy.kind(), stats::Outcome::Routed);
                let mut e = vec![Effect::Count(routed)];
                e.extend(stats::routed_as(reason).map(Effect::Count));
                e
            }
            Err(cause) => {
                let State::Routed { held, .. } =
                    std::mem::replace(&mut self.phase.0, State::Resending)
                else {
                    return Vec::new();
                };
                let mut e: Vec<Effect> = held
                    .map(|held| Effect::GiveBack {
                        held,
                        outcome: None,
                    })
                    .into_iter()
                    .collect();
                if self.config.policy.is_cluster() {
                    // Higress answers 500 when it cannot write `cluster_header`: the route
                    // cannot reach the chosen cluster any other way.
                    e.extend(self.reject(Rejection::ClusterHeaderFailed));
                } else {
                    e.extend(self.fall_back(cause));
                }
                e
            }
        }
    }

    /// The first response bytes: measured, and told to the holding if it wants them.
    fn on_response_body(&mut self, now_us: u64) -> Vec<Effect> {
        let State::Routed { held, outcome, .. } = &mut self.phase.0 else {
            return Vec::new();
        };
        if outcome.first_byte_us.is_some() {
            return Vec::new();
        }
        outcome.first_byte_us = Some(now_us);
        match held {
            Some(h) if h.wants_first_bytes() => vec![Effect::FirstBytes],
            _ => Vec::new(),
        }
    }

    fn reject(&mut self, r: Rejection) -> Vec<Effect> {
        self.phase.0 = State::Settled {
            reason: r.reason(),
            replied: true,
        };
        events::refused(r, self.config.policy.kind())
    }

    /// Fail open to the cluster's own load balancing, or 503 under `failureMode: deny`.
    fn fall_back(&mut self, cause: Cause) -> Vec<Effect> {
        let denied = self.config.common.failure_mode == FailureMode::Deny;
        self.phase.0 = State::Settled {
            reason: Reason::Fallback(cause),
            replied: denied,
        };
        events::fell_back(cause, self.config.policy.kind(), denied)
    }

    // The waiting queue (docs/sessions-and-queues.md "Waiting queue"): refused for want of
    // room a request waits, holding nothing; room may free (one more acquire), or its deadline
    // passes (the 429 it would have got at once).

    /// The waiting queue's place of this request (the balancer's index follows it).
    pub fn ticket(&self) -> Option<&Ticket> {
        self.ticket.as_ref()
    }

    /// Whether it waits in the queue now (not retrying).
    pub fn is_waiting(&self) -> bool {
        matches!(self.phase.0, State::Waiting { .. })
    }

    /// Stream end while queued (waiting or retrying): its place and Redis waiter go. Whatever
    /// a retry in flight acquired goes back through [`Request::finish`]'s orphan.
    pub fn leave_queue(&mut self) -> Option<Effect> {
        let ticket = self.ticket.take()?;
        Some(Effect::LeaveQueue {
            ticket,
            why: Leave::Abandoned,
        })
    }

    fn on_waited(&mut self, rejection: Rejection, answer: WaitAnswer) -> Vec<Effect> {
        if !self.is_waiting() {
            return Vec::new();
        }
        match answer {
            WaitAnswer::Wait(ticket) => {
                self.ticket = Some(ticket);
                Vec::new()
            }
            WaitAnswer::Full => self.reject(rejection),
            WaitAnswer::Timeout => self.time_out(rejection),
        }
    }

    /// Room may have freed: one more acquire (the same pick, or the policy again).
    fn on_admit(&mut self) -> Vec<Effect> {
        let State::Waiting { again, .. } = std::mem::replace(&mut self.phase.0, State::Resending)
        else {
            return Vec::new();
        };
        match again {
            Again::Pick(pick) => vec![Effect::Retry(pick)],
            Again::Decide(Some(read)) => vec![Effect::Redecide(read)],
            // The body is not read again: a held body is not readable outside its callback.
            Again::Decide(None) => vec![Effect::Decide { read_body: false }],
        }
    }

    /// The deadline passed: the 429 it would have got at once, and out of the queue.
    fn time_out(&mut self, rejection: Rejection) -> Vec<Effect> {
        let mut e = Vec::new();
        if let Some(ticket) = self.ticket.take() {
            e.push(Effect::LeaveQueue {
                ticket,
                why: Leave::Timeout,
            });
        }
        e.extend(self.reject(rejection));
        e
    }

    /// A refusal: with a waiting queue, one for want of room waits instead (docs/sessions-and-queues.md
    /// "Waiting queue"); `again` is how it tries again.
    fn refuse(&mut self, r: Rejection, again: Again) -> Vec<Effect> {
        if self.config.common.queue.is_some() && r.may_wait() {
            self.phase.0 = State::Waiting {
                rejection: r,
                again,
            };
            return vec![Effect::Wait(r)];
        }
        self.reject(r)
    }
}

mod phase;

pub use phase::Phase;
use phase::{Again, State};

#[cfg(test)]
mod service_tests;
#[cfg(test)]
mod tests;
