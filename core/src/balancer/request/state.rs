//! What the dispatcher reads of a request's phase (held? replied? what body chunks matter?),
//! and stream end: [`Request::finish`] gives back exactly what is held.

use super::{
    Effect, Holding, Outcome, Phase, Pick, ReadResponse, Reader, Reason, Request, UsageRead, Watch,
};

impl Request {
    /// Held by the plugin: buffering the body, or waiting for Redis.
    pub fn is_held(&self) -> bool {
        matches!(
            self.phase,
            Phase::AwaitingBody | Phase::Picking { .. } | Phase::Resending | Phase::Waiting { .. }
        )
    }

    /// A local reply ended the stream: it must not be resumed.
    pub fn replied(&self) -> bool {
        matches!(self.phase, Phase::Settled { replied: true, .. })
    }

    /// Whether body chunks still matter (nothing decided yet).
    pub fn wants_body(&self) -> bool {
        matches!(self.phase, Phase::AwaitingBody)
    }

    /// Plain Envoy: when a request still waiting for its body is balanced without it.
    pub fn body_deadline(&self) -> Option<u64> {
        let wait = self.config.common.max_body_wait_ms;
        (self.wants_body() && wait > 0).then(|| self.since_ms.saturating_add(wait))
    }

    /// Routed: the response's status and first bytes are measured (the request's outcome).
    pub fn routed(&self) -> bool {
        matches!(self.phase, Phase::Routed { .. })
    }

    /// Plain Envoy: the endpoint this request's holding counted and watches for Envoy's
    /// retries elsewhere (docs/plain-envoy.md, docs/sessions-and-queues.md "Sessions"); None
    /// elsewhere.
    pub fn watched_endpoint(&self) -> Option<&str> {
        match &self.phase {
            Phase::Routed { held: Some(h), .. } => h.watched(),
            _ => None,
        }
    }

    /// The endpoint it was counted on did not answer: its give-back marks it down.
    pub fn mark_failed(&mut self) {
        if let Phase::Routed { held: Some(h), .. } = &mut self.phase {
            h.mark_failed();
        }
    }

    /// Whether response body chunks still matter: the first one, when the holding wants it
    /// (the glue ends the others without calling in: docs/plugin-cpu.md).
    pub fn wants_response_body(&self) -> bool {
        matches!(
            &self.phase,
            Phase::Routed { held: Some(h), outcome, .. }
                if outcome.first_byte_ms.is_none() && h.wants_first_bytes()
        )
    }

    /// Reads the response body as `read` asks (the holding's answer at the response headers).
    pub fn read_response(&mut self, read: ReadResponse) {
        if let Phase::Routed { reader, .. } = &mut self.phase {
            *reader = Some(Reader {
                watch: Watch::new(read.take_usage_event),
                usage: read.usage,
            });
        }
    }

    /// Whether the response body is being read.
    pub fn reading(&self) -> bool {
        matches!(
            self.phase,
            Phase::Routed {
                reader: Some(_),
                ..
            }
        )
    }

    /// A response body chunk read (the last when `end`): the chunk to write instead, if any.
    /// At the end the usage is read into the outcome.
    pub fn read_chunk(&mut self, chunk: &[u8], end: bool) -> Option<Vec<u8>> {
        let Phase::Routed {
            reader: Some(r), ..
        } = &mut self.phase
        else {
            return None;
        };
        let out = r.watch.chunk(chunk, end);
        if end {
            self.close_reader();
        }
        out
    }

    /// The response ended (its last chunk, or the stream without one): the usage, if asked
    /// for, is read into the outcome and the reader closed.
    pub fn close_reader(&mut self) {
        if let Phase::Routed {
            reader, outcome, ..
        } = &mut self.phase
        {
            if let Some(r) = reader.take().filter(|r| r.usage) {
                outcome.usage = match r.watch.usage() {
                    Some(u) => UsageRead::Read(u),
                    None => UsageRead::Missing,
                };
            }
        }
    }

    /// The body could not be read: the reader is given up (nothing read, nothing written).
    pub fn drop_reader(&mut self) {
        if let Phase::Routed { reader, .. } = &mut self.phase {
            *reader = None;
        }
    }

    /// The routed request's holding and its outcome so far (its first bytes to tell).
    pub fn holding_mut(&mut self) -> Option<(&mut dyn Holding, &Outcome)> {
        match &mut self.phase {
            Phase::Routed {
                held: Some(h),
                outcome,
                ..
            } => Some((h.as_mut(), outcome)),
            _ => None,
        }
    }

    /// Whether a reply under `token` still belongs to this request.
    pub fn awaits(&self, token: u32) -> bool {
        matches!(self.phase, Phase::Picking { token: t, .. } if t == token)
    }

    /// The host lost this stream's context while its pick was in flight: the caller undoes the
    /// pick now, and stream end will have nothing left to give back.
    pub fn abandon_pick(&mut self) -> Option<Box<dyn Pick>> {
        let settled = Phase::Settled {
            reason: Reason::Pending,
            replied: false,
        };
        match std::mem::replace(&mut self.phase, settled) {
            Phase::Picking { pick, .. } => Some(pick),
            other => {
                self.phase = other;
                None
            }
        }
    }

    /// For the debug header: the endpoint and why.
    pub fn describe(&self) -> (Option<&str>, Reason) {
        match &self.phase {
            Phase::Routed {
                endpoint, reason, ..
            } => (Some(endpoint), *reason),
            Phase::Settled { reason, .. } => (None, *reason),
            Phase::Picking { .. } | Phase::Resending | Phase::Waiting { .. } => {
                (None, Reason::Pending)
            }
            Phase::AwaitingBody => (None, Reason::AwaitingBody),
        }
    }

    /// Stream end at `now_ms` (host clock), whatever ended it: what must be given back,
    /// exactly once.
    pub fn finish(self, now_ms: u64) -> Option<Effect> {
        match self.phase {
            Phase::Routed {
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
            Phase::Picking { token, pick } => Some(Effect::Orphan { token, pick }),
            _ => None,
        }
    }
}
