//! global_least_request in the plain-Envoy build: there is no Redis host call there, so the
//! counts are per proxy, in shared data (every worker VM sees them), updated with CAS and given
//! back at stream end. Each request counts its `costMode` weight (the body's bytes or
//! estimated tokens: such routes hold the request for its body).

use super::input::{priority_class, Env, Input};
use crate::balancer::pick::{class_cap, cost_of, LocalLease};
use crate::balancer::request::{Decision, Hold, Rejection};
use crate::balancer::shared;
use crate::balancer::telemetry::Telemetry;
use crate::balancer::waiters;
use crate::config::Class;
use crate::config::{SESSION_MAX_IMBALANCE, SESSION_MAX_IMBALANCE_RATIO};
use crate::hash::{self, SplitMix64};
use crate::host::{Host, HostError, LogLevel};
use crate::prefix::chwbl::Ring;
use crate::reason::{Cause, Reason};
use crate::stats::Counter;
use crate::upstream;
use std::rc::Rc;

pub fn decide(host: &mut dyn Host, env: Env, input: &Input, ring: Option<&Ring>) -> Decision {
    let endpoints = &input.config.endpoints;
    if endpoints.is_empty() {
        return Decision::Fallback(Cause::NoHealthyEndpoint);
    }
    // The class first: a sticky request is held to its class cap like any other.
    let class = priority_class(host, env.tel, input.config);
    if let (Some(ring), Some(session)) = (ring, &input.config.session) {
        if let Some(id) =
            super::session::session_id(&*host, session, input.read_body.then_some(input.body_bytes))
        {
            return sticky(host, env, input, ring, &id, class);
        }
    }
    let key = counts_key(endpoints);
    let start = env.rng.next_u64();
    let base_cap = input.config.common.max_load;
    let cap = class_cap(input.config, class);
    let cost = cost_of(input.config, input.body_bytes);
    let above = waiting_above(host, input, class);
    let picked = take(host, &key, endpoints, cost, |loads| {
        if waiters::outranked(loads, cap, cost, above) {
            return None;
        }
        let order = least_first(loads, start);
        let best = *order.first()?;
        let load = loads.get(best).copied().unwrap_or(0);
        if cap > 0 && load >= cap {
            return None;
        }
        Some((best, (order, load)))
    });
    match picked {
        Ok(Some((chosen, (order, load)))) => {
            if base_cap > 0 && load >= base_cap {
                // Only the highest class gets past `maxRequestCount`: its headroom.
                env.tel.inc(host, Counter::PriorityAdmittedHeadroom);
            }
            let Some(address) = endpoints.get(chosen).cloned() else {
                return Decision::Fallback(Cause::NoHealthyEndpoint);
            };
            let fallbacks = order
                .into_iter()
                .skip(1)
                .filter_map(|e| endpoints.get(e).cloned())
                .collect();
            routed(key, address, cost, fallbacks, Reason::LeastRequest)
        }
        Ok(None) => no_room(class),
        Err(e) => shared_data_failed(host, env.tel, input.ctx, &e),
    }
}

/// A plain-Envoy pick that took `cost` at `address` in the counts under `key`: routed,
/// holding that cost until stream end.
pub(super) fn routed(
    key: Rc<str>,
    address: String,
    cost: u64,
    fallbacks: Vec<String>,
    reason: Reason,
) -> Decision {
    Decision::Route {
        hold: Some(Hold::Local(LocalLease {
            key,
            endpoint: address.clone(),
            cost,
        })),
        endpoint: address,
        fallbacks,
        reason,
    }
}

/// Waiting queue with priority classes: how many requests of a higher class than `class` wait
/// in this proxy (README "Waiting queue"); they hold back the room they wait for. 0 without a
/// queue.
pub(super) fn waiting_above(host: &dyn Host, input: &Input, class: Option<Class>) -> u64 {
    match (input.config.common.queue, class) {
        (Some(_), Some(c)) if c.rank > 0 => {
            waiters::above(host, &waiters::key(&input.config.endpoints), c.rank)
        }
        _ => 0,
    }
}

/// No endpoint had room: a request with a priority class was shed at its class cap
/// (`shed_priority`), any other refused at `maxRequestCount`.
pub(super) fn no_room(class: Option<Class>) -> Decision {
    if class.is_some() {
        Decision::Reject(Rejection::ShedPriority)
    } else {
        Decision::Reject(Rejection::MaxRequestCount)
    }
}

/// The counts could not be read or written: nothing was taken, so the request goes to the
/// cluster's own balancing.
pub(super) fn shared_data_failed(
    host: &mut dyn Host,
    tel: &Telemetry,
    ctx: u32,
    e: &HostError,
) -> Decision {
    tel.log(host, LogLevel::Debug, ctx, format_args!("{e}"));
    Decision::Fallback(Cause::SharedData)
}

/// Plain Envoy with a session: no binding is stored; the session id is consistent-hashed onto
/// the ring of the configured endpoints, so every worker and every replica sends it to the
/// same pod without talking (docs/redis-data-model.md §10). It walks on past a pod over the
/// guard Redis applies (the cap, or busier than this proxy's least-loaded pod by more than 8
/// and 1.5 times): `session_rebound`.
fn sticky(
    host: &mut dyn Host,
    env: Env,
    input: &Input,
    ring: &Ring,
    id: &[u8],
    class: Option<Class>,
) -> Decision {
    let endpoints = &input.config.endpoints;
    let key = SplitMix64(hash::fnv1a(hash::FNV_OFFSET, id)).next_u64();
    let home = ring.walk(key).next();
    let base_cap = input.config.common.max_load;
    let cap = class_cap(input.config, class);
    let cost = cost_of(input.config, input.body_bytes);
    let counts = counts_key(endpoints);
    let above = waiting_above(host, input, class);
    let picked = take(host, &counts, endpoints, cost, |loads| {
        if waiters::outranked(loads, cap, cost, above) {
            return None;
        }
        let min = loads.iter().copied().min().unwrap_or(0) as f64;
        let ok = |e: usize| {
            let load = loads.get(e).copied().unwrap_or(0);
            let over_cap = cap > 0 && load.saturating_add(cost) > cap;
            let load = load as f64;
            let imbalanced = load - min > SESSION_MAX_IMBALANCE as f64
                && load > min * SESSION_MAX_IMBALANCE_RATIO;
            !over_cap && !imbalanced
        };
        ring.walk(key)
            .find(|&e| ok(e))
            .map(|e| (e, loads.get(e).copied().unwrap_or(0)))
    });
    match picked {
        Ok(Some((chosen, load))) => {
            if base_cap > 0 && load >= base_cap {
                // Only the highest class gets past `maxRequestCount`: its headroom.
                env.tel.inc(host, Counter::PriorityAdmittedHeadroom);
            }
            let Some(address) = endpoints.get(chosen).cloned() else {
                return Decision::Fallback(Cause::NoHealthyEndpoint);
            };
            let (reason, counter) = if home == Some(chosen) {
                (Reason::Session, Counter::SessionHit)
            } else {
                (Reason::SessionRebound, Counter::SessionRebound)
            };
            env.tel.inc(host, counter);
            let fallbacks = ring
                .walk(key)
                .filter(|&e| e != chosen)
                .filter_map(|e| endpoints.get(e).cloned())
                .take(16)
                .collect();
            routed(counts, address, cost, fallbacks, reason)
        }
        Ok(None) => no_room(class),
        Err(e) => {
            env.tel.inc(host, Counter::SessionFallback);
            shared_data_failed(host, env.tel, input.ctx, &e)
        }
    }
}

/// The one counting path of the plain-Envoy policies (least request here, prefix_cache in
/// local_prefix_cache.rs): in one CAS update of the counts record `key`, `choose` is shown this
/// proxy's load of each of `endpoints` (by position, in `costMode` units) and the endpoint it
/// picks is charged `cost`, the weight its lease gives back at stream end. `Ok(None)`: `choose`
/// picked none and nothing was counted. `choose` may run again when the CAS is lost.
pub fn take<T>(
    host: &mut dyn Host,
    key: &str,
    endpoints: &[String],
    cost: u64,
    mut choose: impl FnMut(&[u64]) -> Option<(usize, T)>,
) -> Result<Option<(usize, T)>, HostError> {
    shared::update(host, key, |cur| {
        let mut counts = cur
            .as_deref()
            .map(shared::decode_counts)
            .unwrap_or_default();
        let loads: Vec<u64> = endpoints
            .iter()
            .map(|e| counts.get(e).copied().unwrap_or(0))
            .collect();
        let choice = choose(&loads).filter(|(e, _)| *e < endpoints.len());
        if let Some(address) = choice.as_ref().and_then(|(e, _)| endpoints.get(*e)) {
            let n = counts.entry(address.clone()).or_insert(0);
            *n = n.saturating_add(cost);
        }
        (shared::encode_counts(&counts), choice)
    })
}

/// The shared-data record of this proxy's in-flight counts over `endpoints` (also the load
/// prefix_cache's plain-Envoy guard reads and counts in, local_prefix_cache.rs).
pub fn counts_key(endpoints: &[String]) -> Rc<str> {
    format!("ailb.glr.{}", upstream::fingerprint(endpoints)).into()
}

/// Stream end of a plain-Envoy least-request pick: its cost back, never below zero.
pub fn release(
    host: &mut dyn Host,
    env_tel: &crate::balancer::telemetry::Telemetry,
    lease: LocalLease,
) {
    let result = shared::update(host, &lease.key, |cur| {
        let mut counts = cur
            .as_deref()
            .map(shared::decode_counts)
            .unwrap_or_default();
        if let Some(n) = counts.get_mut(&lease.endpoint) {
            *n = n.saturating_sub(lease.cost);
        }
        (shared::encode_counts(&counts), ())
    });
    if result.is_err() {
        env_tel.inc(host, Counter::ReleaseFailures);
    }
}

/// Endpoint positions by load, ties rotated by `start` so equal endpoints share the traffic.
fn least_first(loads: &[u64], start: u64) -> Vec<usize> {
    let n = loads.len().max(1);
    let offset = (start % n as u64) as usize;
    let mut v: Vec<(u64, usize, usize)> = loads
        .iter()
        .enumerate()
        .map(|(i, &load)| (load, (i + n - offset) % n, i))
        .collect();
    v.sort_unstable();
    v.into_iter().map(|(_, _, i)| i).collect()
}
