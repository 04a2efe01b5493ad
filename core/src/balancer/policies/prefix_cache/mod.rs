//! prefix_cache. Higress build ([`RedisPrefixCache`]): the prompt → canonical blocks →
//! chained keys, computed here so the script only reads and writes keys
//! (docs/redis-data-model.md §5). Only the keys from the request's anchor block on are sent
//! (`prefixAnchor`, §5 step 2): a match on the system prompt and tools alone, which many
//! conversations share, is no reason to prefer a pod. The script picks the pod of the deepest known prefix unless
//! it is over the load guard; its reply is an endpoint pick's (`least_request::reply`). A body
//! that is not a usable prompt (or is too large to read) still gets a least-request pick.
//! Plain-Envoy build: [`local::LocalPrefixCache`].

pub mod expect;
mod gate;
mod index;
pub mod latency;
pub mod local;
mod prompt;
mod restarts;
pub mod verified;

use super::least_request;
use super::policy::{Env, Input, Policy};
use super::session::Body;
use crate::balancer::events::Decision;
use crate::balancer::redis_client::RedisClient;
use crate::balancer::telemetry::Telemetry;
use crate::config::{Build, PrefixSettings, RouteConfig};
use crate::host::{Host, LogLevel};
use crate::prefix::{anchor_of, canonicalize, prefix_key, Anchor, Canonical, PromptTokens};
use crate::redis::scripts::{LatencyArgs, PrefixChain};
use crate::verify::flush::Flushes;
use expect::{with_usage_asked, Expect, Index};
use latency::{Latency, LatencyWrap};
use restarts::Restarts;
use std::cell::RefCell;
use std::rc::Rc;
use verified::VerifyReply;

/// The policy object of a prefix_cache route: Redis-backed where the route has a Redis target,
/// else the per-proxy index of route config `position`.
pub fn build(
    position: usize,
    config: &Rc<RouteConfig>,
    settings: &PrefixSettings,
) -> Box<dyn Policy> {
    match config.redis {
        Some(_) => Box::new(RedisPrefixCache {
            settings: settings.clone(),
            restarts: Restarts::default(),
            flushes: Rc::default(),
            latency: settings
                .latency
                .filter(|_| Build::has(Build::Higress))
                .map(|l| Latency::new(l, settings.gate.start_rate())),
        }),
        None => Box::new(local::LocalPrefixCache::new(position, config, settings)),
    }
}

/// prefix_cache with Redis (Higress build).
pub struct RedisPrefixCache {
    settings: PrefixSettings,
    restarts: Restarts,
    /// The engine-verified index's emptied-pod rule, per route (verified.rs).
    flushes: Rc<RefCell<Flushes>>,
    /// Latency-aware placement (`latencyModel`; latency/).
    latency: Option<Latency>,
}

impl Policy for RedisPrefixCache {
    fn decide(&mut self, host: &mut dyn Host, mut env: Env, input: &Input) -> Decision {
        if self.settings.verify {
            let now = host.now_ms();
            if self.restarts.due(now) {
                if let Ok(list) = host.upstream_hosts() {
                    let restarted = self.restarts.check(&list, now);
                    forget_restarted(host, &mut env, input, &restarted);
                }
            }
        }
        let placed = match (&mut self.latency, input.keys) {
            (Some(l), Some(keys)) if input.read_body && Build::has(Build::Higress) => {
                l.args(host, env.tel, (input.ctx, env.rng), (input.config, keys))
            }
            _ => None,
        };
        decide(host, env, input, (&self.settings, &self.flushes), placed)
    }

    fn tick(&mut self, host: &mut dyn Host, tel: &mut Telemetry, redis: &mut RedisClient) {
        match &mut self.latency {
            Some(l) if Build::has(Build::Higress) => l.tick(host, tel, redis),
            _ => {}
        }
    }
}

/// Pods the host list's metrics show restarted: their generation is bumped, so their older
/// prefixes stop matching before any of their conversations comes back short (restarts.rs).
fn forget_restarted(host: &mut dyn Host, env: &mut Env, input: &Input, restarted: &[String]) {
    let (Some(keys), false) = (input.keys, restarted.is_empty()) else {
        return;
    };
    for pod in restarted {
        env.tel.log(
            host,
            LogLevel::Info,
            input.ctx,
            format_args!(
                "{pod} restarted (its start time changed): its older prefixes stop matching"
            ),
        );
        env.redis
            .forget(host, env.tel, input.config, keys, &[], pod);
    }
}

/// `latency`: the request's latency-aware placement (None: the token gate places it).
fn decide(
    host: &mut dyn Host,
    env: Env,
    input: &Input,
    (settings, flushes): (&PrefixSettings, &Rc<RefCell<Flushes>>),
    latency: Option<(Option<LatencyArgs>, latency::Shared)>,
) -> Decision {
    let Some(keys) = input.keys else {
        return least_request::acquire(host, env, input, (None, None, None), Body::None);
    };
    if !input.read_body {
        return least_request::acquire(host, env, input, (None, None, None), Body::None);
    }
    let body = host.request_body(0, input.body_bytes).unwrap_or_default();
    match canonicalize(&body, &settings.canon) {
        Ok(canon) => {
            let chain = anchored_chain(&canon, settings.anchor, &keys.namespace);
            let chain = Rc::new(with_tokens(chain, &canon, input.body_bytes));
            let mut verify = None;
            // The answer's usage is read for the verification and for the latency models
            // (its output tokens time each one): asked for once, by whichever wraps first.
            let usage_asked = (settings.verify || latency.is_some())
                .then(|| with_usage_asked(&canon, &body))
                .flatten();
            if settings.verify {
                let body = usage_asked.clone();
                let index = Index::Redis {
                    config: input.config.clone(),
                    keys: keys.clone(),
                    chain: chain.clone(),
                    anchor: anchor_of(canon.blocks(), settings.anchor),
                };
                verify = Some(Box::new(VerifyReply {
                    expect: Expect::new(
                        canon.prefix_bytes(),
                        chain.prompt_tokens,
                        body.is_some(),
                        index,
                    ),
                    flushes: flushes.clone(),
                    body,
                }) as Box<dyn least_request::pick::Wrap>);
            }
            let (args, wrap) = match latency {
                Some((args, shared)) => {
                    let wrap = LatencyWrap {
                        shared,
                        // The verification carries the rewritten body when it is on.
                        body: usage_asked.filter(|_| verify.is_none()),
                        inner: verify,
                        prompt_tokens: chain.prompt_tokens,
                        stream: chain.stream,
                        since_us: host.now_us(),
                    };
                    (
                        args,
                        Some(Box::new(wrap) as Box<dyn least_request::pick::Wrap>),
                    )
                }
                None => (None, verify),
            };
            let parts = (Some(chain), wrap, args);
            least_request::acquire(host, env, input, parts, Body::Bytes(&body))
        }
        Err(e) => {
            env.tel.bad_prompt(host, input.ctx, &e);
            least_request::acquire(host, env, input, (None, None, None), Body::Bytes(&body))
        }
    }
}

/// The Redis keys of `canon`'s chain from its `anchor` block on, shortest prefix first. Keys
/// before the anchor name a prefix of the shared preamble alone: sending them would let every
/// new conversation under one system prompt match the pod that saw the prompt first and pile
/// onto it (the plain-Envoy index reads from the same block: docs/redis-data-model.md §9).
pub fn anchored_chain(canon: &Canonical, anchor: Anchor, namespace: &str) -> Vec<String> {
    let from = anchor_of(canon.blocks(), anchor);
    canon
        .chain_keys()
        .iter()
        .skip(from)
        .map(|k| prefix_key(namespace, k))
        .collect()
}

/// `keys` with the token estimates the gate weighs them by (docs/redis-data-model.md §13): the
/// prompt's tokens up to the end of each key's block, and the whole prompt's.
fn with_tokens(keys: Vec<String>, canon: &Canonical, body_bytes: usize) -> PrefixChain {
    let t = PromptTokens::of(canon, body_bytes);
    PrefixChain {
        cached_tokens: t.ends[t.ends.len().saturating_sub(keys.len())..].to_vec(),
        keys,
        prompt_tokens: t.total,
        stream: t.stream,
    }
}

#[cfg(test)]
mod tests;
