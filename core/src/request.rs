//! One request's state machine. Transitions are pure; the engine performs the host calls
//! they imply. The invariant that matters: a lease acquired in Redis is given back exactly
//! once, whichever way the stream ends.

use crate::redis::scripts::Keys;
use std::rc::Rc;

/// What an acquired pick must give back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub keys: Rc<Keys>,
    pub member: String,
}

/// A per-proxy load count in shared data (plain-Envoy global_least_request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalLease {
    pub key: Rc<str>,
    pub endpoint: String,
}

/// Where a request is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Headers held, body being buffered until its end.
    AwaitingBody,
    /// A pick is in flight in Redis under this token.
    Picking { token: u32 },
    /// The override is set; the lease is released at stream end. `reason` names how the
    /// endpoint was chosen (`least_request`, `prefix_hit`, `prefix_miss`, `prefix_spill`).
    Routed {
        endpoint: String,
        lease: Lease,
        reason: &'static str,
    },
    /// Decided in this proxy (endpoint_metrics, plain-Envoy least request); `local` is given
    /// back at stream end.
    Picked {
        endpoint: String,
        reason: &'static str,
        local: Option<LocalLease>,
    },
    /// Decided without a lease (fallback, 429, 503): nothing to release.
    Settled { reason: &'static str },
}

/// What stream end requires of the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtDone {
    Nothing,
    /// Give this lease back now.
    Release(Lease),
    /// Give this per-proxy count back now.
    ReleaseLocal(LocalLease),
    /// The pick's reply has not arrived: whoever handles it must release what it acquired.
    Orphan {
        token: u32,
    },
}

impl Phase {
    pub fn at_done(self) -> AtDone {
        match self {
            Phase::Routed { lease, .. } => AtDone::Release(lease),
            Phase::Picked { local: Some(l), .. } => AtDone::ReleaseLocal(l),
            Phase::Picked { .. } => AtDone::Nothing,
            Phase::Picking { token } => AtDone::Orphan { token },
            Phase::AwaitingBody | Phase::Settled { .. } => AtDone::Nothing,
        }
    }

    /// Whether a reply under `token` still belongs to this request.
    pub fn awaits(&self, token: u32) -> bool {
        matches!(self, Phase::Picking { token: t } if *t == token)
    }

    /// For the debug header: the endpoint and why.
    pub fn describe(&self) -> (Option<&str>, &'static str) {
        match self {
            Phase::Routed {
                endpoint, reason, ..
            }
            | Phase::Picked {
                endpoint, reason, ..
            } => (Some(endpoint), reason),
            Phase::Settled { reason } => (None, reason),
            Phase::Picking { .. } => (None, "pending"),
            Phase::AwaitingBody => (None, "awaiting_body"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease() -> Lease {
        Lease {
            keys: Rc::new(Keys::new("p", "r", "c")),
            member: "id|h:1|1".into(),
        }
    }

    #[test]
    fn only_routed_and_in_flight_requests_need_work_at_done() {
        let routed = Phase::Routed {
            endpoint: "h:1".into(),
            lease: lease(),
            reason: "least_request",
        };
        assert_eq!(routed.at_done(), AtDone::Release(lease()));
        assert_eq!(
            Phase::Picking { token: 7 }.at_done(),
            AtDone::Orphan { token: 7 }
        );
        assert_eq!(Phase::AwaitingBody.at_done(), AtDone::Nothing);
        assert_eq!(
            Phase::Settled { reason: "fallback" }.at_done(),
            AtDone::Nothing
        );
    }

    #[test]
    fn a_reply_belongs_only_to_the_pick_that_sent_it() {
        assert!(Phase::Picking { token: 7 }.awaits(7));
        assert!(!Phase::Picking { token: 11 }.awaits(7));
        assert!(!Phase::AwaitingBody.awaits(7));
    }
}
