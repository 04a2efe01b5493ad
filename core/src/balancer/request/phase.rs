//! A request's phase, and what the dispatcher reads of it or does to it (held? replied? what
//! body chunks matter? its holding told the first bytes, its response read) and stream end:
//! [`Phase::finish`] gives back exactly what is held. The transitions between phases are the
//! request's (request.rs); outside the request the phase is opaque.

use crate::balancer::events::{Effect, Pick, PromptRead, Rejection};
use crate::balancer::holding::{Holding, Outcome, ReadResponse, Services};
use crate::reason::Reason;
use crate::verify::Watch;
use std::rc::Rc;

/// A request's phase (docs/architecture.md "A request's path").
#[derive(Debug)]
pub struct Phase(pub(super) State);

#[derive(Debug)]
pub(super) enum State {
    /// Headers held, body being buffered until its end.
    AwaitingBody,
    /// A pick is in flight under `token`; the request owns it until the reply or stream end.
    Picking { token: u32, pick: Box<dyn Pick> },
    /// A pick is being sent again (NOSCRIPT, resync) after its first reply; still held.
    Resending,
    /// Waiting queue: refused for want of room, held until room frees, `rejection` at the
    /// deadline; `again` is how it tries once room may have freed.
    Waiting { rejection: Rejection, again: Again },
    /// The choice is published; `held` is given back at stream end, with `outcome` (what the
    /// machine measured of the answer).
    Routed {
        reason: Reason,
        held: Option<Box<dyn Holding>>,
        outcome: Outcome,
        /// The response body's reader, when the holding asked for one (boxed: most requests
        /// have none, and its buffers are allocated anyway).
        reader: Option<Box<Reader>>,
    },
    /// Decided with nothing held: fallback, or a local reply (`replied`) that ended the stream.
    Settled { reason: Reason, replied: bool },
}

/// How a waiting request tries again.
#[derive(Debug)]
pub(super) enum Again {
    /// Send the same Redis pick (the refused one acquired nothing).
    Pick(Box<dyn Pick>),
    /// Decide again in this proxy (plain Envoy, where the policy counts), with what the first
    /// decision read from the body if it kept it.
    Decide(Option<Rc<PromptRead>>),
}

/// A routed request's response body reader (core/src/verify/): its bounded tail, and the
/// usage-only event taken out of a stream.
#[derive(Debug)]
pub(super) struct Reader {
    watch: Watch,
    /// Read the usage at the end.
    usage: bool,
    /// Read the answer's id (from its head, as soon as the head holds it).
    id: bool,
}

impl Phase {
    /// Held by the plugin: buffering the body, or waiting for Redis.
    pub fn is_held(&self) -> bool {
        matches!(
            self.0,
            State::AwaitingBody | State::Picking { .. } | State::Resending | State::Waiting { .. }
        )
    }

    /// A local reply ended the stream: it must not be resumed.
    pub fn replied(&self) -> bool {
        matches!(self.0, State::Settled { replied: true, .. })
    }

    /// Whether body chunks still matter (nothing decided yet).
    pub fn wants_body(&self) -> bool {
        matches!(self.0, State::AwaitingBody)
    }

    /// Routed: the response's status and first bytes are measured (the request's outcome).
    pub fn routed(&self) -> bool {
        matches!(self.0, State::Routed { .. })
    }

    /// The endpoint this request's holding counted, checked against the one that answers
    /// (`Holding::counted`); None when nothing is held or the holding does not ask.
    pub fn counted_endpoint(&self) -> Option<&str> {
        match &self.0 {
            State::Routed { held: Some(h), .. } => h.counted(),
            _ => None,
        }
    }

    /// The host's retry answered from `served`: the holding learns and moves its count.
    pub fn served_elsewhere(&mut self, svc: &mut Services, served: &str) {
        if let State::Routed { held: Some(h), .. } = &mut self.0 {
            h.served_elsewhere(svc, served);
        }
    }

    /// Whether response body chunks still matter: the first one, when the holding wants it
    /// (the glue ends the others without calling in: docs/plugin-cpu.md).
    pub fn wants_response_body(&self) -> bool {
        matches!(
            &self.0,
            State::Routed { held: Some(h), outcome, .. }
                if outcome.first_byte_us.is_none() && h.wants_first_bytes()
        )
    }

    /// Reads the response body as `read` asks (the holding's answer at the response headers).
    pub fn read_response(&mut self, read: ReadResponse) {
        if let State::Routed { reader, .. } = &mut self.0 {
            *reader = Some(Box::new(Reader {
                watch: Watch::new(read.take_usage_event),
                usage: read.usage,
                id: read.answer_id,
            }));
        }
    }

    /// Whether the response body is being read.
    pub fn reading(&self) -> bool {
        matches!(
            self.0,
            State::Routed {
                reader: Some(_),
                ..
            }
        )
    }

    /// A response body chunk read (the last when `end`): the chunk to write instead, if any,
    /// and whether this chunk completed the answer's id (now in the outcome: its holding is
    /// told before the chunk goes on to the client). At the end the usage is read into the
    /// outcome.
    pub fn read_chunk(&mut self, chunk: &[u8], end: bool) -> (Option<Vec<u8>>, bool) {
        let State::Routed {
            reader: Some(r),
            outcome,
            ..
        } = &mut self.0
        else {
            return (None, false);
        };
        let out = r.watch.chunk(chunk, end);
        let mut found = false;
        if r.id && outcome.answer_id.is_none() {
            outcome.answer_id = r.watch.answer_id();
            found = outcome.answer_id.is_some();
            // A head that is full without one names none: not scanned again.
            r.id = !found && !r.watch.head_full();
        }
        // Nothing more to read or take out: the rest of the answer passes without the VM.
        let done = !r.usage && !r.id && !r.watch.filtering();
        if end || done {
            self.close_reader();
        }
        (out, found)
    }

    /// The response ended (its last chunk, or the stream without one): the usage and the
    /// answer's id, as asked for, are read into the outcome and the reader closed.
    pub fn close_reader(&mut self) {
        if let State::Routed {
            reader, outcome, ..
        } = &mut self.0
        {
            if let Some(r) = reader.take() {
                if r.usage {
                    outcome.usage = Some(r.watch.tokens());
                }
                if r.id && outcome.answer_id.is_none() {
                    outcome.answer_id = r.watch.answer_id();
                }
            }
        }
    }

    /// The body could not be read: the reader is given up (nothing read, nothing written).
    pub fn drop_reader(&mut self) {
        if let State::Routed { reader, .. } = &mut self.0 {
            *reader = None;
        }
    }

    /// The routed request's holding and its outcome so far (its first bytes to tell).
    pub fn holding(&self) -> Option<&dyn Holding> {
        match &self.0 {
            State::Routed { held: Some(h), .. } => Some(h.as_ref()),
            _ => None,
        }
    }

    pub fn holding_mut(&mut self) -> Option<(&mut dyn Holding, &Outcome)> {
        match &mut self.0 {
            State::Routed {
                held: Some(h),
                outcome,
                ..
            } => Some((h.as_mut(), outcome)),
            _ => None,
        }
    }

    /// Whether a reply under `token` still belongs to this request.
    pub fn awaits(&self, token: u32) -> bool {
        matches!(self.0, State::Picking { token: t, .. } if t == token)
    }

    /// The host lost this stream's context while its pick was in flight: the caller undoes the
    /// pick now, and stream end will have nothing left to give back.
    pub fn abandon_pick(&mut self) -> Option<Box<dyn Pick>> {
        let settled = State::Settled {
            reason: Reason::Pending,
            replied: false,
        };
        match std::mem::replace(&mut self.0, settled) {
            State::Picking { pick, .. } => Some(pick),
            other => {
                self.0 = other;
                None
            }
        }
    }

    /// For the debug header: the endpoint and why.
    pub fn describe(&self) -> (Option<&str>, Reason) {
        match &self.0 {
            State::Routed {
                outcome, reason, ..
            } => (
                outcome.endpoints.first().map(|p| p.endpoint.as_str()),
                *reason,
            ),
            State::Settled { reason, .. } => (None, *reason),
            State::Picking { .. } | State::Resending | State::Waiting { .. } => {
                (None, Reason::Pending)
            }
            State::AwaitingBody => (None, Reason::AwaitingBody),
        }
    }

    /// Stream end at `now_ms` (host clock), whatever ended it: what must be given back,
    /// exactly once.
    pub fn finish(self, now_ms: u64) -> Option<Effect> {
        match self.0 {
            State::Routed {
                held: Some(held),
                mut outcome,
                ..
            } => {
                outcome.end_ms = Some(now_ms);
                Some(Effect::GiveBack {
                    held,
                    outcome: Some(outcome),
                })
            }
            State::Picking { token, pick } => Some(Effect::Orphan { token, pick }),
            _ => None,
        }
    }
}
