//! global_least_request in the plain-Envoy build: there is no Redis host call there, so the
//! counts are per proxy, in shared data (every worker VM sees them), updated with CAS and given
//! back at stream end. Each request counts its `costMode` weight (the body's bytes or
//! estimated tokens: such routes hold the request for its body).

use super::input::{Env, Input};
use crate::balancer::pick::{cost_of, LocalLease};
use crate::balancer::request::{Decision, Hold, Rejection};
use crate::balancer::shared;
use crate::host::{Host, LogLevel};
use crate::reason::{Cause, Reason};
use crate::stats::Counter;
use crate::upstream;
use std::collections::HashMap;
use std::rc::Rc;

pub fn decide(host: &mut dyn Host, env: Env, input: &Input) -> Decision {
    let endpoints = input.config.endpoints.clone();
    if endpoints.is_empty() {
        return Decision::Fallback(Cause::NoHealthyEndpoint);
    }
    let key = counts_key(&endpoints);
    let start = env.rng.next_u64();
    let cap = input.config.common.max_load;
    let cost = cost_of(input.config, input.body_bytes);
    let picked = shared::update(host, &key, |cur| {
        let mut counts = cur
            .as_deref()
            .map(shared::decode_counts)
            .unwrap_or_default();
        let order = least_first(&endpoints, &counts, start);
        let Some(&best) = order.first() else {
            return (shared::encode_counts(&counts), None);
        };
        let load = counts.get(best).copied().unwrap_or(0);
        if cap > 0 && load >= cap {
            return (shared::encode_counts(&counts), None);
        }
        counts.insert(best.to_string(), load.saturating_add(cost));
        let order: Vec<String> = order.iter().map(|s| s.to_string()).collect();
        (shared::encode_counts(&counts), Some(order))
    });
    match picked {
        Ok(Some(order)) => {
            let mut order = order.into_iter();
            let Some(chosen) = order.next() else {
                return Decision::Fallback(Cause::NoHealthyEndpoint);
            };
            Decision::Route {
                hold: Some(Hold::Local(LocalLease {
                    key,
                    endpoint: chosen.clone(),
                    cost,
                })),
                endpoint: chosen,
                fallbacks: order.collect(),
                reason: Reason::LeastRequest,
            }
        }
        Ok(None) => Decision::Reject(Rejection::MaxRequestCount),
        Err(e) => {
            env.tel
                .log(host, LogLevel::Debug, input.ctx, format_args!("{e}"));
            Decision::Fallback(Cause::SharedData)
        }
    }
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

/// Endpoints by load, ties rotated by `start` so equal endpoints share the traffic.
fn least_first<'a>(
    endpoints: &'a [String],
    counts: &HashMap<String, u64>,
    start: u64,
) -> Vec<&'a str> {
    let n = endpoints.len().max(1);
    let offset = (start % n as u64) as usize;
    let mut v: Vec<(u64, usize, &str)> = endpoints
        .iter()
        .enumerate()
        .map(|(i, e)| {
            (
                counts.get(e).copied().unwrap_or(0),
                (i + n - offset) % n,
                e.as_str(),
            )
        })
        .collect();
    v.sort_unstable();
    v.into_iter().map(|(_, _, e)| e).collect()
}
