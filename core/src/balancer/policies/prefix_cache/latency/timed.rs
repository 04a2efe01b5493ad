//! A latency-aware request's holding: [`Timed`] wraps what the pick holds in either build (a
//! Redis lease, a per-proxy count, and the verification around it) with the features its pick
//! saw and the prediction it made; when the stream ends the answer's TTFT and TPOT are learnt
//! by the route's models (docs/latency-model.md §5).

use super::shared::Shared;
use crate::balancer::events::Placement;
use crate::balancer::holding::{Holding, Outcome, ReadResponse, Services};
use crate::balancer::pick::{Lease, PickReply};
use crate::balancer::policies::least_request::pick::Wrap;
use crate::host::LogLevel;
use crate::latency::model::DRIFT_RUN;
use crate::latency::{Features, Outcome as Measured};
use crate::redis::scripts::Predicted;
use crate::stats::Counter;

/// What a latency-aware pick adds to its lease when Redis answers.
#[derive(Clone)]
pub struct LatencyWrap {
    pub shared: Shared,
    /// The verification's wrap, applied first (None: verification off).
    pub inner: Option<Box<dyn Wrap>>,
    pub prompt_tokens: u64,
    /// A streamed request (only its first bytes time the first token).
    pub stream: bool,
    /// When the pick was planned (host clock, µs).
    pub since_us: u64,
    /// The body with the usage request added, when the verification does not carry it.
    pub body: Option<Vec<u8>>,
}

impl std::fmt::Debug for LatencyWrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LatencyWrap({:?})", self.inner)
    }
}

impl Wrap for LatencyWrap {
    fn wrap(
        self: Box<Self>,
        lease: Lease,
        reply: &PickReply,
        place: &mut Placement,
    ) -> Box<dyn Holding> {
        let LatencyWrap {
            shared,
            inner,
            prompt_tokens,
            stream,
            since_us,
            body,
        } = *self;
        let injected = body.is_some();
        if body.is_some() {
            place.body = body;
        }
        let held = match inner {
            Some(w) => w.wrap(lease, reply, place),
            None => Box::new(lease),
        };
        let PickReply::Picked {
            endpoint,
            load_before,
            booked,
            ..
        } = reply
        else {
            return held;
        };
        let booked = *booked;
        let features = Features {
            ahead_tokens: booked.map_or(0, |b| b.ahead) as f64,
            uncached_tokens: booked.map_or(0, |b| b.tokens) as f64,
            running: load_before.unwrap_or(0) as f64,
            prompt_tokens: prompt_tokens as f64,
        };
        let pick = (endpoint.clone(), features, booked.and_then(|b| b.predicted));
        Box::new(Timed::new(held, shared, pick, (stream, since_us, injected)))
    }

    fn clone_box(&self) -> Box<dyn Wrap> {
        Box::new(self.clone())
    }
}

/// A latency-aware request's holding while its answer is timed.
pub struct Timed {
    inner: Box<dyn Holding>,
    shared: Shared,
    endpoint: String,
    features: Features,
    predicted: Option<Predicted>,
    stream: bool,
    since_us: u64,
    /// This holding added the usage request: the usage event is taken out again.
    injected: bool,
    /// The answer's usage is read (a 2xx).
    read: bool,
    /// The host's retry answered from another endpoint: nothing to learn of this one.
    elsewhere: bool,
}

impl std::fmt::Debug for Timed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Timed({}, {:?})", self.endpoint, self.inner)
    }
}

impl Timed {
    /// `inner` timed for the models of `shared`, a pick of `endpoint` with the `features` it
    /// saw and what it `predicted` (None: not placed by the models); `stream`: a streamed
    /// request, timed from `since_us`; `injected`: this holding added the usage request to
    /// the body (no verification took it). Both builds' picks: the Redis reply's lease
    /// ([`LatencyWrap`]), the plain-Envoy count (prefix_cache/local.rs).
    pub fn new(
        inner: Box<dyn Holding>,
        shared: Shared,
        (endpoint, features, predicted): (String, Features, Option<Predicted>),
        (stream, since_us, injected): (bool, u64, bool),
    ) -> Timed {
        Timed {
            inner,
            shared,
            endpoint,
            features,
            predicted,
            stream,
            since_us,
            injected,
            read: false,
            elsewhere: false,
        }
    }

    /// What the answer measured: its time to first bytes (a stream's first token) and its time
    /// per output token after them. None: nothing to learn (not a stream, no first bytes).
    fn measured(&self, o: &Outcome) -> Option<Measured> {
        let first = o.first_byte_us.filter(|_| self.stream)?;
        let ttft_ms = first.checked_sub(self.since_us)? as f64 / 1000.0;
        let first_ms = first / 1000;
        let tpot_ms = match (o.end_ms, o.usage.and_then(|u| u.output)) {
            (Some(end), Some(out)) if out >= 2 && end >= first_ms => {
                Some((end - first_ms) as f64 / (out - 1) as f64)
            }
            _ => None,
        };
        Some(Measured { ttft_ms, tpot_ms })
    }
}

impl Holding for Timed {
    fn wants_first_bytes(&self) -> bool {
        true
    }

    fn first_bytes(&mut self, svc: &mut Services, outcome: &Outcome) {
        if self.inner.wants_first_bytes() {
            self.inner.first_bytes(svc, outcome);
        }
    }

    fn read_response(&mut self, svc: &mut Services, outcome: &Outcome) -> Option<ReadResponse> {
        let inner = self.inner.read_response(svc, outcome);
        self.read = outcome.status.is_some_and(|s| (200..300).contains(&s));
        let edit = self.injected && super::super::verified::plain_event_stream(svc.host);
        let mine = (self.read || edit).then_some(ReadResponse {
            usage: self.read,
            take_usage_event: edit,
            answer_id: false,
        });
        ReadResponse::and(inner, mine)
    }

    fn answer_id(&mut self, svc: &mut Services, outcome: &Outcome) {
        self.inner.answer_id(svc, outcome);
    }

    fn give_back(self: Box<Self>, svc: &mut Services, outcome: Option<&Outcome>) {
        let learn = self.read && !self.elsewhere;
        if let Some(m) = outcome.filter(|_| learn).and_then(|o| self.measured(o)) {
            let learnt = match self.shared.book.try_borrow_mut() {
                Ok(mut book) => book.learn(&self.endpoint, &self.features, &m).ok(),
                Err(_) => None,
            };
            let counter = match learnt {
                Some(_) => Counter::LatencySamples,
                None => Counter::LatencyBadSamples,
            };
            svc.tel.inc(svc.host, counter);
            if learnt == Some(true) {
                svc.tel.inc(svc.host, Counter::LatencyDrift);
                svc.tel.log(
                    svc.host,
                    LogLevel::Info,
                    svc.ctx,
                    format_args!(
                        "{}: {DRIFT_RUN} answers in a row far from its predictions: its latency model \
                         starts again (counted in ai_lb.latency.drift)",
                        self.endpoint
                    ),
                );
            }
        }
        let Timed { inner, .. } = *self;
        inner.give_back(svc, outcome);
    }

    fn counted(&self) -> Option<&str> {
        self.inner.counted()
    }

    fn served_elsewhere(&mut self, svc: &mut Services, served: &str) {
        // The answer is another pod's: its timing says nothing of the pod predicted.
        self.elsewhere = true;
        self.inner.served_elsewhere(svc, served);
    }

    fn debug(&self) -> Option<String> {
        let Some(p) = self.predicted else {
            return self.inner.debug();
        };
        let inner = self.inner.debug().unwrap_or_default();
        Some(format!(
            "{inner}; predicted_ttft_ms={:.1}; predicted_tpot_ms={:.1}",
            p.ttft_us as f64 / 1000.0,
            p.tpot_us as f64 / 1000.0
        ))
    }

    #[cfg(test)]
    fn ledger(&self) -> Vec<String> {
        self.inner.ledger()
    }

    #[cfg(test)]
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
