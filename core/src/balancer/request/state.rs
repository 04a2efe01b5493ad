//! What the dispatcher reads of a request's phase (held? replied? what body chunks matter?),
//! and stream end: [`Request::finish`] gives back exactly what is held.

use super::{success, Effect, Held, Phase, Pick, PolicyConfig, Reason, Request};

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

    /// Whether the response status matters (cluster_metrics' success test).
    pub fn wants_status(&self) -> bool {
        matches!(
            self.phase,
            Phase::Routed {
                held: Held::Service { .. },
                ..
            }
        )
    }

    /// Plain Envoy, a least-request pick or a session's prefix_cache pick: the endpoint this
    /// request was counted on, to compare with the one Envoy answered from (docs/plain-envoy.md,
    /// docs/sessions-and-queues.md "Sessions"); None elsewhere.
    pub fn watched_endpoint(&self) -> Option<&str> {
        match &self.phase {
            Phase::Routed {
                held: Held::Local(lease),
                ..
            } if matches!(self.config.policy, PolicyConfig::GlobalLeastRequest)
                || (self.config.session.is_some()
                    && matches!(self.config.policy, PolicyConfig::PrefixCache(_))) =>
            {
                Some(&lease.endpoint)
            }
            _ => None,
        }
    }

    /// The endpoint it was counted on did not answer: its release marks it down.
    pub fn mark_failed(&mut self) {
        if let Phase::Routed {
            held: Held::Local(lease),
            ..
        } = &mut self.phase
        {
            lease.failed = true;
        }
    }

    /// Whether response body chunks still matter (cluster_metrics before its first byte).
    pub fn wants_response_body(&self) -> bool {
        match &self.phase {
            Phase::Routed {
                held: Held::Service { first_byte, .. },
                ..
            } => !first_byte,
            Phase::Routed {
                held: Held::Lease(lease),
                ..
            } => lease.booking.is_some(),
            Phase::Routed {
                held: Held::Local(lease),
                ..
            } => lease.booking.is_some(),
            _ => false,
        }
    }

    /// Whether a reply under `token` still belongs to this request.
    pub fn awaits(&self, token: u32) -> bool {
        matches!(self.phase, Phase::Picking { token: t, .. } if t == token)
    }

    /// The host lost this stream's context while its pick was in flight: the caller undoes the
    /// pick now, and stream end will have nothing left to give back.
    pub fn abandon_pick(&mut self) -> Option<Box<Pick>> {
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

    /// Stream end, whatever ended it: what must be given back, exactly once.
    pub fn finish(self) -> Option<Effect> {
        match self.phase {
            Phase::Routed {
                held: Held::Lease(l),
                ..
            } => Some(Effect::Release(l)),
            Phase::Routed {
                held: Held::Local(l),
                ..
            } => Some(Effect::ReleaseLocal(l)),
            Phase::Routed {
                held: Held::Service { lease, status, .. },
                ..
            } => Some(Effect::ServiceDone {
                lease,
                outcome: Some(success(status)),
            }),
            Phase::Picking { token, pick } => Some(Effect::Orphan { token, pick }),
            _ => None,
        }
    }
}
