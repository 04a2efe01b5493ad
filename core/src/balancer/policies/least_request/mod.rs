//! global_least_request. Higress build ([`RedisLeastRequest`]): one atomic script call picks
//! the least-loaded healthy endpoint across every gateway and counts it
//! (docs/redis-data-model.md §4); the reply is read in [`reply`]. Plain-Envoy build
//! ([`local::LocalLeastRequest`]): per-proxy counts in shared data ([`counts`]), and a session
//! consistent-hashed onto the ring of the endpoints.

pub mod counts;
pub mod health;
#[cfg(test)]
mod health_tests;
pub mod holding;
pub mod lease;
pub mod local;
pub mod pick;
pub mod prefill;
pub mod reply;

use super::continuation::{Record, Store};
use super::policy::{priority_class, tenant, Env, Input, Policy};
use super::session::{self, Body};
use crate::balancer::events::Decision;
use crate::config::RouteConfig;
use crate::host::Host;
use crate::reason::Cause;
use crate::redis::scripts::{LatencyArgs, PrefixChain};
use pick::{EndpointPick, Wrap};
use std::rc::Rc;

/// The policy object of a global_least_request route: Redis-backed where the route has a
/// Redis target, else per proxy (`position`: the config's place among the plugin's route
/// configs, naming its shared data).
pub fn build(position: usize, config: &Rc<RouteConfig>) -> Box<dyn Policy> {
    match config.redis {
        Some(_) => Box::new(RedisLeastRequest),
        None => Box::new(local::LocalLeastRequest::new(position, config)),
    }
}

/// global_least_request with Redis (Higress build).
pub struct RedisLeastRequest;

impl Policy for RedisLeastRequest {
    fn decide(&mut self, host: &mut dyn Host, env: Env, input: &Input) -> Decision {
        let body = Body::of(input.read_body, input.body_bytes);
        acquire(host, env, input, (None, None, None), body)
    }
}

/// What prefix_cache adds to an acquire: its chain, what it wraps the lease in, and its
/// latency-aware placement.
pub type Extra = (
    Option<Rc<PrefixChain>>,
    Option<Box<dyn Wrap>>,
    Option<LatencyArgs>,
);

/// A Redis acquire for this request: plain least-request (`chain` None) or with a prefix chain.
/// `wrap`: what the policy adds to the lease when Redis answers; `latency`: prefix_cache's
/// latency-aware placement; `body`: the request body as the policy may read it (for a session
/// id in it).
pub fn acquire(
    host: &mut dyn Host,
    env: Env,
    input: &Input,
    (chain, wrap, latency): Extra,
    body: Body,
) -> Decision {
    let Some(keys) = input.keys else {
        return Decision::Fallback(Cause::NoRoute);
    };
    let who = session::identify(host, env.tel, input.config, body);
    let class = priority_class(host, env.tel, input.ctx, input.config);
    let healthy = env
        .hosts
        .get(host, &keys.namespace, input.config.common.dp.size);
    match healthy.map(|h| {
        EndpointPick::plan(
            host,
            (input.config, keys),
            input.body_bytes,
            (h, input.synced),
            chain,
            env.rng,
        )
    }) {
        Ok(mut pick) => {
            if let Some(sticky) = &who.sticky {
                pick.session = Some(sticky.redis_key(&keys.namespace).into());
                pick.session_kind = sticky.kind;
                pick.session_ttl_s = sticky.ttl_s(input.config);
            }
            pick.record = who.answer.then(|| Record {
                store: Store::Redis {
                    config: input.config.clone(),
                    keys: keys.clone(),
                },
                ttl_s: input.config.agents.as_ref().map_or(0, |a| a.ttl_s),
            });
            pick.tenant = tenant(host, input.config, pick.candidates.len());
            pick.wrap = wrap;
            pick.latency = latency;
            Decision::Acquire(Box::new(pick.with_class(class)))
        }
        Err(cause) => Decision::Fallback(cause),
    }
}
