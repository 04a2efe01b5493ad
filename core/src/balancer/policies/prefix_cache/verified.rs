//! The engine-verified prefix index (docs/redis-data-model.md §5 "Engine-verified keys", §9),
//! as a prefix_cache request's holding: [`Verified`] wraps what the pick holds (a Redis lease,
//! a per-proxy count) with what the decision predicted ([`Expect`]); at the response headers it
//! asks the machine to read the answer's usage (and take out the usage event the plugin asked
//! for), and when it is given back at stream end it compares what the engine cached with the
//! prediction (core/src/verify/, pure). Only a pod found emptied (core/src/verify/flush.rs:
//! unrelated conversations all coming back with nothing cached at once) has its generation
//! bumped — in Redis by one fire-and-forget script call, in the plain-Envoy index directly. A
//! single short answer forgets nothing: its request has just recomputed its prompt on the pod,
//! and its pick already pointed the conversation's keys there.
//!
//! The emptied-pod rule counts per route config (each route's policy owns its [`Flushes`]):
//! the index it corrects is the route's own (its Redis keys of route and cluster, or its
//! shared-data index), so what one route saw says nothing of another's keys. Nothing here holds
//! or fails the request.

use super::expect::{Expect, Index};
use super::index::LocalPrefix;
use crate::balancer::events::Placement;
use crate::balancer::holding::{Holding, Outcome, ReadResponse, Services};
use crate::balancer::pick::{Lease, PickReply};
use crate::balancer::policies::least_request::pick::Wrap;
use crate::host::{Host, LogLevel};
use crate::redis::scripts::SessionState;
use crate::stats::Counter;
use crate::verify::flush::{self, Flushes, FLUSH_CONVERSATIONS};
use crate::verify::{self, Prediction, Shortfall, Tokens};
use std::cell::RefCell;
use std::rc::Rc;

/// Where a shortfall's correction goes: the route's Redis keys (named in the [`Expect`]), or
/// the route's plain-Envoy index.
#[derive(Debug, Clone)]
pub enum Corrects {
    Redis,
    Local(Rc<LocalPrefix>),
}

/// A prefix_cache request's holding while its answer is verified.
#[derive(Debug)]
pub struct Verified {
    inner: Box<dyn Holding>,
    endpoint: String,
    expect: Expect,
    flushes: Rc<RefCell<Flushes>>,
    corrects: Corrects,
    /// The usage is read at the end (a 2xx of a matched pick).
    verify: bool,
}

impl Verified {
    pub fn new(
        inner: Box<dyn Holding>,
        endpoint: String,
        expect: Expect,
        (flushes, corrects): (Rc<RefCell<Flushes>>, Corrects),
    ) -> Verified {
        Verified {
            inner,
            endpoint,
            expect,
            flushes,
            corrects,
            verify: false,
        }
    }

    /// The answer's usage against the prediction: count, and forget what it showed gone.
    fn judge(&self, svc: &mut Services, tokens: Option<Tokens>) {
        let Some(tokens) = tokens else {
            return; // not read
        };
        let Some(usage) = tokens.cache_report() else {
            svc.tel.inc(svc.host, Counter::PrefixVerifyNoUsage);
            return;
        };
        let e = &self.expect;
        let predicted = Prediction::at(&e.prefix_bytes, e.matched.unwrap_or(0))
            .in_engine_tokens(e.estimated_prompt_tokens, usage.prompt_tokens);
        let (host, tel) = (&mut *svc.host, &mut *svc.tel);
        tel.inc(host, Counter::PrefixVerified);
        let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        tel.add(
            host,
            Counter::PrefixPredictedTokens,
            as_i64(predicted.tokens),
        );
        tel.add(
            host,
            Counter::PrefixCachedTokens,
            as_i64(usage.cached_tokens),
        );
        tel.add(
            host,
            Counter::PrefixPromptTokens,
            as_i64(usage.prompt_tokens),
        );
        tel.pods.add(
            host,
            &self.endpoint,
            usage.cached_tokens,
            usage.prompt_tokens,
        );
        let verdict = verify::judge(predicted, usage.cached_tokens);
        match verdict {
            Shortfall::None => {}
            Shortfall::Mild => tel.inc(host, Counter::PrefixShortfallMild),
            Shortfall::Severe => tel.inc(host, Counter::PrefixShortfall),
        }
        let (conversation, anchor) = conversation_of(&e.index);
        let answer = flush::Answer {
            conversation,
            predicted: predicted.tokens > 0,
            verdict,
            cached_tokens: usage.cached_tokens,
            preamble_tokens: Prediction::at(&e.prefix_bytes, anchor)
                .in_engine_tokens(e.estimated_prompt_tokens, usage.prompt_tokens)
                .tokens,
            now_ms: host.now_ms(),
        };
        let emptied = match self.flushes.try_borrow_mut() {
            Ok(mut f) => f.answer(&self.endpoint, answer),
            Err(_) => false,
        };
        if !emptied {
            return;
        }
        tel.log(
            host,
            LogLevel::Info,
            svc.ctx,
            format_args!(
                "{} cached {} of the {} tokens predicted, the {FLUSH_CONVERSATIONS}th unrelated \
                 conversation with nothing cached at once: its older prefixes stop matching",
                self.endpoint, usage.cached_tokens, predicted.tokens
            ),
        );
        self.forget(svc);
    }

    /// The endpoint was emptied: its generation is bumped, and this request's prompt (which it
    /// just computed) re-recorded under the new one — in Redis by one script call, in the
    /// plain-Envoy index directly.
    fn forget(&self, svc: &mut Services) {
        let endpoint = self.endpoint.as_str();
        match (&self.expect.index, &self.corrects) {
            (
                Index::Redis {
                    config,
                    keys,
                    chain,
                    ..
                },
                _,
            ) => {
                svc.redis
                    .forget(svc.host, svc.tel, config, keys, &chain.keys, endpoint);
            }
            (Index::Local { keys, window }, Corrects::Local(index)) => {
                let now = svc.host.now_ms();
                let (host, tel, ctx) = (&mut *svc.host, &*svc.tel, svc.ctx);
                if index.forget(host, tel, ctx, endpoint, keys, window, now) {
                    svc.tel.inc(svc.host, Counter::PrefixGenerationBump);
                }
            }
            (Index::Local { .. }, Corrects::Redis) => {}
        }
    }
}

impl Holding for Verified {
    fn wants_first_bytes(&self) -> bool {
        self.inner.wants_first_bytes()
    }

    fn first_bytes(&mut self, svc: &mut Services, outcome: &Outcome) {
        self.inner.first_bytes(svc, outcome);
    }

    /// Verified only when the pick said how deep it matched and the answer is a 2xx; the usage
    /// event the plugin asked for is taken out of an uncompressed event stream only: anything
    /// else would be held back looking for an event's end that never comes.
    fn read_response(&mut self, svc: &mut Services, outcome: &Outcome) -> Option<ReadResponse> {
        let ok = self.expect.matched.is_some()
            && outcome.status.is_some_and(|s| (200..300).contains(&s));
        let edit = self.expect.injected && plain_event_stream(svc.host);
        self.verify = ok;
        (ok || edit).then_some(ReadResponse {
            usage: ok,
            take_usage_event: edit,
            answer_id: false,
        })
    }

    fn answer_id(&mut self, svc: &mut Services, outcome: &Outcome) {
        self.inner.answer_id(svc, outcome);
    }

    fn give_back(self: Box<Self>, svc: &mut Services, outcome: Option<&Outcome>) {
        if let Some(o) = outcome.filter(|_| self.verify) {
            self.judge(svc, o.usage);
        }
        let Verified { inner, .. } = *self;
        inner.give_back(svc, outcome);
    }

    fn counted(&self) -> Option<&str> {
        self.inner.counted()
    }

    fn served_elsewhere(&mut self, svc: &mut Services, served: &str) {
        self.inner.served_elsewhere(svc, served);
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

/// What a Redis pick's reply adds to its lease: the verification, knowing how deep the chain
/// matched (keys past the anchor block) on the endpoint it chose. A spill or a session's pod is
/// not the matched one: nothing predicted.
#[derive(Debug, Clone)]
pub struct VerifyReply {
    pub expect: Expect,
    pub flushes: Rc<RefCell<Flushes>>,
    /// The body with the usage request added (`Expect::injected`), placed with the choice.
    pub body: Option<Vec<u8>>,
}

impl Wrap for VerifyReply {
    fn wrap(
        self: Box<Self>,
        lease: Lease,
        reply: &PickReply,
        place: &mut Placement,
    ) -> Box<dyn Holding> {
        let PickReply::Picked {
            endpoint,
            depth,
            spilled,
            session,
            ..
        } = reply
        else {
            return Box::new(lease);
        };
        let VerifyReply {
            mut expect,
            flushes,
            body,
        } = *self;
        place.body = body;
        let elsewhere = *spilled || matches!(session, SessionState::Kept | SessionState::Rebound);
        if let Index::Redis { anchor, .. } = expect.index {
            expect.matched = Some(match *depth {
                0 => 0,
                _ if elsewhere => 0,
                d => anchor + d as usize,
            });
        }
        let held = Box::new(lease);
        let corrects = (flushes, Corrects::Redis);
        Box::new(Verified::new(held, endpoint.clone(), expect, corrects))
    }

    fn clone_box(&self) -> Box<dyn Wrap> {
        Box::new(self.clone())
    }
}

/// The conversation a prediction is for (its anchor block's chain key, as a number) and that
/// block's position: the first past the shared preamble (`prefixAnchor`,
/// docs/redis-data-model.md §9 1.). Redis sends its chain from there; the plain-Envoy window
/// ends there.
fn conversation_of(index: &Index) -> (u64, usize) {
    match index {
        Index::Redis { chain, anchor, .. } => {
            let key = chain.keys.first().map_or(&[][..], |k| k.as_bytes());
            (crate::hash::fnv1a(crate::hash::FNV_OFFSET, key), *anchor)
        }
        Index::Local { keys, window } => {
            let anchor = window.iter().copied().min().unwrap_or(0);
            let key = keys.get(anchor).map_or(0, |k| u64::from_le_bytes(*k));
            (key, anchor)
        }
    }
}

/// Whether the response is a server-sent event stream without a content encoding.
pub(super) fn plain_event_stream(host: &dyn Host) -> bool {
    let header = |name: &str| host.response_header_bytes(name).ok().flatten();
    let sse = header("content-type").is_some_and(|t| t.starts_with(b"text/event-stream"));
    let encoded = header("content-encoding").is_some_and(|c| !c.eq_ignore_ascii_case(b"identity"));
    sse && !encoded
}
