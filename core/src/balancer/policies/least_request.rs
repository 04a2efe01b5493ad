//! global_least_request (Higress build): one atomic script call picks the least-loaded healthy
//! endpoint across every gateway and counts it (docs/redis-data-model.md §4).

use super::input::{priority_class, Env, Input};
use crate::balancer::pick::{tenant_capacity, EndpointPick, Pick};
use crate::balancer::request::Decision;
use crate::config::{Fairness, RouteConfig};
use crate::host::Host;
use crate::reason::Cause;
use std::rc::Rc;

pub fn decide(host: &mut dyn Host, env: Env, input: &Input) -> Decision {
    acquire(host, env, input, None)
}

/// A Redis acquire for this request: plain least-request (`chain` None) or with a prefix chain.
pub fn acquire(
    host: &mut dyn Host,
    env: Env,
    input: &Input,
    chain: Option<Rc<Vec<String>>>,
) -> Decision {
    let Some(keys) = input.keys else {
        return Decision::Fallback(Cause::NoRoute);
    };
    let class = priority_class(host, env.tel, input.config);
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
            pick.session = super::session::key(host, input);
            pick.tenant = tenant(host, input.config, pick.candidates.len());
            Decision::Acquire(Box::new(Pick::Endpoint(pick.with_class(class))))
        }
        Err(cause) => Decision::Fallback(cause),
    }
}

/// The request's tenant id and the most it may hold while another tenant is active (its
/// share of the capacity of the pool's `endpoints`), when the route has tenant fairness and
/// the request names a tenant (README "Tenant fairness").
pub fn tenant(host: &dyn Host, config: &RouteConfig, endpoints: usize) -> Option<(String, u64)> {
    let f = config.common.fairness.as_ref()?;
    let value = host.request_header_bytes(&f.header).ok().flatten();
    let t = f.tenant_of(value.as_deref())?;
    let limit = Fairness::limit(t.share, tenant_capacity(config, endpoints));
    Some((t.id, limit))
}
