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

use super::policy::{priority_class, tenant, Env, Input, Policy};
use super::session;
use crate::balancer::events::Decision;
use crate::config::RouteConfig;
use crate::host::Host;
use crate::reason::Cause;
use crate::redis::scripts::{self, PrefixChain};
use pick::{EndpointPick, Wrap};
use std::rc::Rc;

/// The policy object of a global_least_request route: Redis-backed where the route has a
/// Redis target, else per proxy.
pub fn build(config: &Rc<RouteConfig>) -> Box<dyn Policy> {
    match config.redis {
        Some(_) => Box::new(RedisLeastRequest),
        None => Box::new(local::LocalLeastRequest::new(config)),
    }
}

/// global_least_request with Redis (Higress build).
pub struct RedisLeastRequest;

impl Policy for RedisLeastRequest {
    fn decide(&mut self, host: &mut dyn Host, env: Env, input: &Input) -> Decision {
        acquire(host, env, input, (None, None))
    }
}

/// A Redis acquire for this request: plain least-request (`chain` None) or with a prefix chain.
/// `wrap`: what the policy adds to the lease when Redis answers.
pub fn acquire(
    host: &mut dyn Host,
    env: Env,
    input: &Input,
    (chain, wrap): (Option<Rc<PrefixChain>>, Option<Box<dyn Wrap>>),
) -> Decision {
    let Some(keys) = input.keys else {
        return Decision::Fallback(Cause::NoRoute);
    };
    let class = priority_class(host, env.tel, input.ctx, input.config);
    match EndpointPick::plan(
        host,
        input.config,
        keys,
        input.body_bytes,
        chain,
        input.synced,
        env.rng,
    ) {
        Ok(mut pick) => {
            pick.session = session_key(host, input);
            pick.tenant = tenant(host, input.config, pick.candidates.len());
            pick.wrap = wrap;
            Decision::Acquire(Box::new(pick.with_class(class)))
        }
        Err(cause) => Decision::Fallback(cause),
    }
}

/// The request's session key, when the route is sticky and the request names a session.
fn session_key(host: &dyn Host, input: &Input) -> Option<Rc<str>> {
    let config = input.config.session.as_ref()?;
    let keys = input.keys?;
    let id = session::session_id(host, config, input.read_body.then_some(input.body_bytes))?;
    Some(scripts::session_key(&keys.namespace, &id).into())
}
