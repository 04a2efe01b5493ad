//! The engine-verified prefix index, the balancer's part (docs/redis-data-model.md §5
//! "Engine-verified keys", §9): a prefix_cache decision leaves an [`Expect`] (expect.rs: its prompt's
//! block sizes, whether it asked a stream for usage, which index to correct); the pick's
//! answer says how deep it matched; the response is watched to its end (core/src/verify/,
//! pure), and a pod found emptied (core/src/verify/flush.rs: unrelated conversations all back
//! with nothing cached at once) has its generation bumped — in Redis by one fire-and-forget
//! script call, in the plain-Envoy build through the route's policy. A single short answer
//! forgets nothing: its request has just recomputed its prompt on the pod, and its pick
//! already pointed the conversation's keys there. Nothing here holds or fails the request:
//! every host call that fails is logged and the verification dropped.

use super::expect::{Expect, Index};
use super::pick::PickReply;
use super::Balancer;
use crate::config::BYTES_PER_TOKEN;
use crate::host::{Host, LogLevel};
use crate::redis::scripts::SessionState;
use crate::stats::Counter;
use crate::verify::flush::{self, FLUSH_CONVERSATIONS};
use crate::verify::{self, Prediction, Shortfall, Watch};

impl Balancer {
    /// A Redis pick's answer: how deep its chain matched (keys past the anchor block) on the
    /// endpoint it chose. A spill or a session's pod is not the matched one: nothing predicted.
    pub(super) fn verify_picked(&mut self, ctx: u32, reply: &PickReply) {
        let PickReply::Picked {
            depth,
            spilled,
            session,
            ..
        } = reply
        else {
            return;
        };
        let elsewhere = *spilled || matches!(session, SessionState::Kept | SessionState::Rebound);
        if let Some(e) = self.expects.get_mut(&ctx) {
            if let Index::Redis { anchor, .. } = e.index {
                e.matched = Some(match *depth {
                    0 => 0,
                    _ if elsewhere => 0,
                    d => anchor + d as usize,
                });
            }
        }
    }

    /// The response headers: watch the body if a decision left an expectation. Verified only
    /// when the request was routed to an endpoint and the answer is 2xx.
    pub(super) fn verify_headers(&mut self, host: &mut dyn Host, ctx: u32) {
        let Some(e) = self.expects.get_mut(&ctx) else {
            return;
        };
        let routed = self
            .requests
            .get(&ctx)
            .and_then(|r| r.describe().0)
            .is_some();
        let ok = routed
            && e.matched.is_some()
            && host
                .response_status()
                .ok()
                .flatten()
                .is_some_and(|s| s.len() == 3 && s.first() == Some(&b'2'));
        // The usage event is taken out of an uncompressed event stream only: anything else
        // would be held back looking for an event's end that never comes.
        let edit = e.injected && plain_event_stream(host);
        if !ok && !edit {
            self.expects.remove(&ctx);
            return;
        }
        e.watch = Some((Watch::new(edit), ok));
    }

    pub(super) fn verify_watching(&self, ctx: u32) -> bool {
        self.expects.get(&ctx).is_some_and(|e| e.watch.is_some())
    }

    /// A response body chunk of a watched response; at its end, the verdict.
    pub(super) fn verify_body(&mut self, host: &mut dyn Host, ctx: u32, size: usize, end: bool) {
        let Some((watch, _)) = self.expects.get_mut(&ctx).and_then(|e| e.watch.as_mut()) else {
            return;
        };
        let chunk = match host.response_body(0, size) {
            Ok(c) => c,
            Err(err) => {
                // Never write a chunk that could not be read: stop watching (an event held
                // back, if any, is lost; the rest of the stream passes as it is).
                self.tel.log(
                    host,
                    LogLevel::Warn,
                    ctx,
                    format_args!("{err}: not verified"),
                );
                self.expects.remove(&ctx);
                return;
            }
        };
        if let Some(out) = watch.chunk(&chunk, end) {
            if let Err(err) = host.set_response_body(&out) {
                self.tel
                    .log(host, LogLevel::Warn, ctx, format_args!("{err}"));
            }
        }
        if end {
            self.verify_end(host, ctx);
        }
    }

    /// The response ended (or the stream did, without a last body chunk): compare, count,
    /// correct.
    pub(super) fn verify_end(&mut self, host: &mut dyn Host, ctx: u32) {
        let Some(e) = self.expects.remove(&ctx) else {
            return;
        };
        let Some((watch, true)) = &e.watch else {
            return;
        };
        let endpoint = match self.requests.get(&ctx).and_then(|r| r.describe().0) {
            Some(ep) => ep.to_string(),
            None => return,
        };
        let Some(usage) = watch.usage() else {
            self.tel.inc(host, Counter::PrefixVerifyNoUsage);
            return;
        };
        let predicted = Prediction::at(&e.prefix_bytes, e.matched.unwrap_or(0));
        let tel = &mut self.tel;
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
        tel.pods
            .add(host, &endpoint, usage.cached_tokens, usage.prompt_tokens);
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
            preamble_tokens: e
                .prefix_bytes
                .get(anchor)
                .map_or(0, |b| b / BYTES_PER_TOKEN),
            now_ms: host.now_ms(),
        };
        if !self.shortfalls.answer(&endpoint, answer) {
            return;
        }
        tel.log(
            host,
            LogLevel::Info,
            ctx,
            format_args!(
                "{endpoint} cached {} of the {} tokens predicted, the {FLUSH_CONVERSATIONS}th \
                 unrelated conversation with nothing cached at once: its older prefixes stop \
                 matching",
                usage.cached_tokens, predicted.tokens
            ),
        );
        self.forget(host, ctx, &endpoint, &e);
    }

    /// `endpoint` was emptied: its generation is bumped, and this request's prompt (which it
    /// just computed) re-recorded under the new one.
    fn forget(&mut self, host: &mut dyn Host, ctx: u32, endpoint: &str, e: &Expect) {
        match &e.index {
            Index::Redis {
                config,
                keys,
                chain,
                ..
            } => {
                self.redis
                    .forget(host, &mut self.tel, config, keys, &chain.keys, endpoint);
            }
            Index::Local { .. } => {
                let Some(route) = self.requests.get(&ctx).map(|r| r.route) else {
                    return;
                };
                let Some(r) = self.routes.get_mut(route) else {
                    return;
                };
                if r.policy.forget(host, &self.tel, ctx, endpoint, e) {
                    self.tel.inc(host, Counter::PrefixGenerationBump);
                }
            }
        }
    }
}

/// The conversation a prediction is for (its anchor block's chain key, as a number) and that
/// block's position: the first past the shared preamble (`prefixAnchor`, docs/redis-data-model.md
/// §9 1.). Redis sends its chain from there; the plain-Envoy window ends there.
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
fn plain_event_stream(host: &dyn Host) -> bool {
    let header = |name: &str| host.response_header_bytes(name).ok().flatten();
    let sse = header("content-type").is_some_and(|t| t.starts_with(b"text/event-stream"));
    let encoded = header("content-encoding").is_some_and(|c| !c.eq_ignore_ascii_case(b"identity"));
    sse && !encoded
}
