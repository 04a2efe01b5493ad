//! What an endpoint pick holds until its stream ends, and how it is given back: a Redis lease
//! (global_least_request, prefix_cache with Redis: release.lua, its prefill booking back at the
//! first bytes, batched) or a per-proxy count in shared data (the plain-Envoy build: counts.rs,
//! its booking back at the first bytes through prefill.rs). Both teach failure memory what the
//! request's outcome says of its endpoint.

use super::health::Lesson;
use super::lease::LocalLease;
use super::{counts, prefill};
use crate::balancer::holding::{Holding, Outcome, Services};
use crate::balancer::pick::Lease;
use crate::balancer::redis_client::LeaseKeys;
use crate::redis::scripts::{self, release::Learned};
use crate::stats::Counter;

impl Holding for Lease {
    fn wants_first_bytes(&self) -> bool {
        self.booking.is_some()
    }

    fn first_bytes(&mut self, svc: &mut Services, _outcome: &Outcome) {
        if let Some(booking) = self.booking.take() {
            svc.redis.first_bytes(svc.host, svc.tel, self, booking);
        }
    }

    fn counted(&self) -> Option<&str> {
        self.id_and_endpoint().map(|(_, endpoint)| endpoint)
    }

    /// One moved.lua call: the lease moves to `served` under the same id, and its endpoint's
    /// failure is learned; the stream end then releases the moved lease. A move that fails
    /// leaves both leases to the reclaim (leaseTTL), as any lost release does.
    fn served_elsewhere(&mut self, svc: &mut Services, served: &str) {
        let Some(moved) = scripts::moved_member(&self.member, served) else {
            return;
        };
        if self.config.common.ejection.on() {
            svc.tel.inc(svc.host, Counter::EjectFailures);
        }
        let now_ms = svc.host.now_ms();
        let keys = LeaseKeys::Moved {
            keys: self.keys.clone(),
            booked: self.prefix,
            to: served.to_string(),
            now_ms,
            expiry_ms: now_ms.saturating_add(self.config.common.lease_ttl_ms),
        };
        let old = std::mem::replace(&mut self.member, moved);
        // The booking went with the failed try (moved.lua).
        self.booking = None;
        svc.redis
            .release(svc.host, svc.tel, &self.config, keys, vec![old]);
    }

    fn give_back(self: Box<Self>, svc: &mut Services, outcome: Option<&Outcome>) {
        let learned = learned(outcome);
        if learned == Learned::Failed && self.config.common.ejection.on() {
            svc.tel.inc(svc.host, Counter::EjectFailures);
        }
        let keys = LeaseKeys::Endpoint {
            keys: self.keys,
            booked: self.prefix,
            learned,
            // The stream's end, which the machine already read (no second clock call).
            now_ms: outcome
                .and_then(|o| o.end_ms)
                .unwrap_or_else(|| svc.host.now_ms()),
        };
        svc.redis
            .release(svc.host, svc.tel, &self.config, keys, vec![self.member]);
    }

    #[cfg(test)]
    fn ledger(&self) -> Vec<String> {
        vec![self.member.clone()]
    }

    #[cfg(test)]
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// What a request's outcome teaches about its endpoint (failure memory): a 5xx is a failure
/// (Envoy answers a connect failure, a reset before the response or a timeout with its own
/// 503 / 504, which the filter sees as the response); any other status is an answer, a 4xx
/// being the client's; no response (the client left first) or no outcome teaches nothing.
fn learned(outcome: Option<&Outcome>) -> Learned {
    match outcome.and_then(|o| o.status) {
        Some(s) if s >= 500 => Learned::Failed,
        Some(_) => Learned::Answered,
        None => Learned::Nothing,
    }
}

impl Holding for LocalLease {
    fn wants_first_bytes(&self) -> bool {
        self.booking.is_some()
    }

    fn first_bytes(&mut self, svc: &mut Services, _outcome: &Outcome) {
        if let Some(booking) = self.booking.take() {
            prefill::first_bytes(svc.host, svc.tel, self, booking);
        }
    }

    /// A count whose move failed settles where it is, as unreached (docs/plain-envoy.md
    /// "Failure memory").
    fn give_back(self: Box<Self>, svc: &mut Services, outcome: Option<&Outcome>) {
        let lesson = if self.failed {
            Lesson::Unreached
        } else {
            Lesson::from(learned(outcome))
        };
        let now = outcome
            .and_then(|o| o.end_ms)
            .unwrap_or_else(|| svc.host.now_ms());
        counts::release(svc.host, svc.tel, *self, (lesson, now));
    }

    /// Counted while failure memory is on: Envoy's retry elsewhere is what it learns of a
    /// connect failure or a reset.
    fn counted(&self) -> Option<&str> {
        self.memory.map(|_| self.endpoint.as_str())
    }

    /// This endpoint was not reached: learned now, and the count moves to `served`
    /// (counts.rs `moved`).
    fn served_elsewhere(&mut self, svc: &mut Services, served: &str) {
        let now = svc.host.now_ms();
        counts::moved(svc.host, svc.tel, self, served, now);
    }

    #[cfg(test)]
    fn ledger(&self) -> Vec<String> {
        vec![format!("local|{}", self.endpoint)]
    }

    #[cfg(test)]
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
