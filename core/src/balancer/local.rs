//! Decisions made inside one proxy: publishing the choice (Higress override call, or the
//! plain-Envoy destination header for `override_host`), and the plain-Envoy
//! `global_least_request`, whose counts live in shared data (per proxy, CAS-updated, released at
//! stream end).

use super::shared;
use super::{Balancer, Verdict};
use crate::config::{Publish, RouteConfig};
use crate::host::{Host, LogLevel};
use crate::request::{LocalLease, Phase};
use crate::stats::{Cause, Outcome};
use crate::upstream;
use std::rc::Rc;

impl Balancer {
    /// Plain Envoy: drop client-sent copies of every destination header a route config uses,
    /// whichever route this is, so a client can never steer `override_host`.
    pub(super) fn strip_destination_headers(&mut self, host: &mut dyn Host) {
        let mut names: Vec<&str> = Vec::new();
        for c in self.config.all() {
            if let Publish::Header { name, .. } = &c.publish {
                if !names.contains(&name.as_str()) {
                    names.push(name);
                }
            }
        }
        for name in names {
            let _ = host.remove_request_header(name);
        }
    }

    /// Tells the router: Higress's override call, or the `ip:port[,ip:port]` header.
    pub(super) fn publish(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        config: &RouteConfig,
        endpoint: &str,
        fallbacks: &[&str],
    ) -> Result<(), Cause> {
        let result = match &config.publish {
            Publish::OverrideHost => host.set_upstream_override_host(endpoint),
            Publish::Header { name, fallbacks: n } => {
                host.set_request_header(name, &destination_list(endpoint, fallbacks, *n))
            }
        };
        result.map_err(|e| {
            self.log(host, LogLevel::Warn, ctx, format_args!("{e}"));
            Cause::OverrideFailed
        })
    }

    /// Plain-Envoy global_least_request: least-loaded endpoint of this proxy, counted in shared
    /// data with CAS, given back at stream end.
    pub(super) fn decide_local_least_request(&mut self, host: &mut dyn Host, ctx: u32) -> Verdict {
        let Some(req) = self.requests.get(&ctx) else {
            return Verdict::Continue;
        };
        let config = req.config.clone();
        let endpoints = config.endpoints.clone();
        if endpoints.is_empty() {
            return self.fail(host, ctx, Cause::NoHealthyEndpoint, false);
        }
        let key: Rc<str> = format!("ailb.glr.{}", upstream::fingerprint(&endpoints)).into();
        let start = self.random();
        let cap = config.max_load;
        let picked = shared::update(host, &key, |cur| {
            let mut counts = cur.map(shared::decode_counts).unwrap_or_default();
            let order = least_first(&endpoints, &counts, start);
            let Some(&best) = order.first() else {
                return (shared::encode_counts(&counts), None);
            };
            let load = counts.get(best).copied().unwrap_or(0);
            if cap > 0 && load >= cap {
                return (shared::encode_counts(&counts), None);
            }
            counts.insert(best.to_string(), load + 1);
            let order: Vec<String> = order.iter().map(|s| s.to_string()).collect();
            (shared::encode_counts(&counts), Some(order))
        });
        match picked {
            Ok(Some(order)) => {
                let Some((chosen, rest)) = order.split_first() else {
                    return self.fail(host, ctx, Cause::NoHealthyEndpoint, false);
                };
                let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
                let lease = LocalLease {
                    key,
                    endpoint: chosen.clone(),
                };
                self.routed_locally(
                    host,
                    ctx,
                    &config,
                    chosen,
                    &rest,
                    "least_request",
                    Some(lease),
                )
            }
            Ok(None) => {
                self.count(host, config.policy.kind(), Outcome::Rejected429);
                self.set_phase(
                    ctx,
                    Phase::Settled {
                        reason: "rejected_429",
                    },
                );
                let body = b"Exceeded maximum request limit from ai-load-balancer.";
                let _ = host.send_local_response(429, "ai_lb_max_request_count", body);
                Verdict::Pause
            }
            Err(e) => {
                self.log(host, LogLevel::Debug, ctx, format_args!("{e}"));
                self.fail(host, ctx, Cause::SharedData, false)
            }
        }
    }

    /// Stream end of a plain-Envoy least-request pick: one count back, never below zero.
    pub(super) fn release_local(&mut self, host: &mut dyn Host, lease: LocalLease) {
        let result = shared::update(host, &lease.key, |cur| {
            let mut counts = cur.map(shared::decode_counts).unwrap_or_default();
            if let Some(n) = counts.get_mut(&lease.endpoint) {
                *n = n.saturating_sub(1);
            }
            (shared::encode_counts(&counts), ())
        });
        if result.is_err() {
            self.stats.inc(host, crate::stats::Counter::ReleaseFailures);
        }
    }
}

/// `chosen` then up to `n` fallbacks, comma-separated (the override_host header format).
pub(super) fn destination_list(chosen: &str, fallbacks: &[&str], n: usize) -> String {
    let mut v = chosen.to_string();
    for f in fallbacks.iter().filter(|f| **f != chosen).take(n) {
        v.push(',');
        v.push_str(f);
    }
    v
}

/// Endpoints by load, ties rotated by `start` so equal endpoints share the traffic.
fn least_first<'a>(
    endpoints: &'a [String],
    counts: &std::collections::HashMap<String, u64>,
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
