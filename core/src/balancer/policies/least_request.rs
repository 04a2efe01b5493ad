//! global_least_request (Higress build): one atomic script call picks the least-loaded healthy
//! endpoint across every gateway and counts it (docs/redis-data-model.md §4).

use super::input::{priority_class, Env, Input};
use crate::balancer::pick::{EndpointPick, Pick};
use crate::balancer::request::Decision;
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
            Decision::Acquire(Box::new(Pick::Endpoint(pick.with_class(class))))
        }
        Err(cause) => Decision::Fallback(cause),
    }
}
