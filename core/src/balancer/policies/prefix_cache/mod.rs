//! prefix_cache. Higress build ([`RedisPrefixCache`]): the prompt → canonical blocks →
//! chained keys, computed here so the script only reads and writes keys
//! (docs/redis-data-model.md §5). The script picks the pod of the deepest known prefix unless
//! it is over the load guard; its reply is an endpoint pick's (`least_request::reply`). A body
//! that is not a usable prompt (or is too large to read) still gets a least-request pick.
//! Plain-Envoy build: [`local::LocalPrefixCache`].

mod index;
pub mod local;

use super::least_request;
use super::policy::{Env, Input, Policy};
use crate::balancer::events::Decision;
use crate::config::{PrefixSettings, RouteConfig};
use crate::host::{Host, LogLevel};
use crate::prefix::{canonicalize, prefix_key};
use crate::reason::Cause;
use crate::stats::Counter;
use std::rc::Rc;

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
        }),
        None => Box::new(local::LocalPrefixCache::new(position, config, settings)),
    }
}

/// prefix_cache with Redis (Higress build).
pub struct RedisPrefixCache {
    settings: PrefixSettings,
}

impl Policy for RedisPrefixCache {
    fn decide(&mut self, host: &mut dyn Host, env: Env, input: &Input) -> Decision {
        decide(host, env, input, &self.settings)
    }
}

fn decide(host: &mut dyn Host, env: Env, input: &Input, settings: &PrefixSettings) -> Decision {
    let Some(keys) = input.keys else {
        return least_request::acquire(host, env, input, None);
    };
    if !input.read_body {
        return least_request::acquire(host, env, input, None);
    }
    let body = host.request_body(0, input.body_bytes).unwrap_or_default();
    match canonicalize(&body, &settings.canon) {
        Ok(canon) => {
            let chain: Vec<String> = canon
                .chain_keys()
                .iter()
                .map(|k| prefix_key(&keys.namespace, k))
                .collect();
            least_request::acquire(host, env, input, Some(Rc::new(chain)))
        }
        Err(e) => {
            env.tel.inc(host, Counter::Fallback(Cause::BadRequest));
            env.tel.log(
                host,
                LogLevel::Debug,
                input.ctx,
                format_args!("no prefix ({e}); least-request"),
            );
            least_request::acquire(host, env, input, None)
        }
    }
}
