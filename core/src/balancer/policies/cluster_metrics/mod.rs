//! cluster_metrics (`lb_type: cluster`): picks one of `service_list` by the route's `mode`
//! from per-service statistics, writes it into `cluster_header`, and measures the request
//! itself: time to the first response-body chunk (TTFT) and to stream end, errors = a
//! `:status` other than 200 or none at all (docs/higress-cluster-policies.md §3.3).
//!
//! The statistics live in proxy-wide shared data, one record per route config, updated with
//! compare-and-swap (`balancer::shared::update`), so every worker VM of a proxy decides
//! from the same numbers (Higress keeps them per VM). The in-flight count taken at the
//! decision is held by the request (its `ServiceLease` holding, holding.rs) and given back exactly once at stream
//! end, with the total latency.
//!
//! AdaptiveScore with `global_inflight_enabled` asks Redis instead: the candidates and their
//! local scores go to one script call that multiplies each by its count over every gateway,
//! takes the lowest and counts it (docs/higress-cluster-policies.md §3.6); the local count is
//! taken when Redis answers (`start`). Any Redis trouble: the local choice made here
//! ([`reply`]).

pub mod holding;
pub mod pick;
pub mod reply;
pub mod stats;
mod writes;

use super::policy::{Env, Input, Policy};
use crate::balancer::events::{Decision, Placement};
use crate::balancer::rng::VmRng;
use crate::balancer::telemetry::Telemetry;
use crate::cluster::select::{self, Decision as Pick};
use crate::cluster::stats::Table;
use crate::cluster::Mode;
use crate::config::{ClusterMetricsConfig, GlobalInflight};
use crate::host::{Host, LogLevel};
use crate::reason::{Cause, Reason};
use crate::redis::inflight::InflightKeys;
use crate::stats::Counter;
pub use holding::ServiceLease;
use pick::ServicePick;
pub use stats::SharedStats;
use std::rc::Rc;
use writes::{write, Change};

/// A cluster_metrics route: where its statistics live.
pub struct ClusterMetrics {
    stats: Rc<SharedStats>,
}

impl ClusterMetrics {
    /// `position`: the config's place among the plugin's route configs, naming its record.
    pub fn new(position: usize, config: &ClusterMetricsConfig) -> ClusterMetrics {
        ClusterMetrics {
            stats: Rc::new(SharedStats::new(position, config)),
        }
    }
}

impl Policy for ClusterMetrics {
    fn decide(&mut self, host: &mut dyn Host, env: Env, input: &Input) -> Decision {
        decide(host, env, input, &self.stats)
    }
}

fn decide(host: &mut dyn Host, env: Env, input: &Input, stats: &Rc<SharedStats>) -> Decision {
    if stats.mode == Mode::AdaptiveScore {
        if let (Some(global), Some(keys)) = (input.config.policy.global_inflight(), input.inflight)
        {
            let now = host.now_ms();
            return global_pick(host, env, input, stats, (global, keys), now);
        }
    }
    decide_local(host, env.tel, env.rng, input.ctx, stats)
}

/// The decision in this proxy (every mode; AdaptiveScore without Redis): the chosen service,
/// counted in the shared record, held by the request until its stream ends. No service to
/// choose falls back; when the record cannot be written the choice comes from a fresh table
/// and holds no count.
fn decide_local(
    host: &mut dyn Host,
    tel: &Telemetry,
    rng: &mut VmRng,
    ctx: u32,
    stats: &Rc<SharedStats>,
) -> Decision {
    let now = host.now_ms();
    let now_ms = i64::try_from(now).unwrap_or(i64::MAX);
    match write(host, stats, Change::Choose { rng, now_ms }) {
        Ok((chosen, reset)) => {
            if reset {
                tel.inc(host, Counter::ClusterStatsReset);
            }
            let Some(service) = chosen else {
                return Decision::Fallback(Cause::NoHealthyEndpoint);
            };
            let lease = ServiceLease {
                stats: stats.clone(),
                service,
                start_ms: now,
                global: None,
                first_byte: false,
            };
            Decision::Route {
                place: Placement::on(lease.name().to_string()),
                reason: Reason::ClusterMetrics,
                hold: Some(Box::new(lease)),
            }
        }
        Err(e) => {
            // Never lose the request over its statistics: decide from a fresh table (the mode's
            // random start) and hold nothing, since no count was taken.
            tel.inc(host, Counter::ClusterStatsFailed);
            tel.log(host, LogLevel::Debug, ctx, format_args!("{e}"));
            let table = stats.fresh.fresh();
            let mut next = || rng.next_u64();
            match select::select(stats.mode, &stats.params, &table, now_ms, &mut next) {
                Pick::Pick(i) => match table.names().get(i) {
                    Some(service) => Decision::Route {
                        place: Placement::on(service.clone()),
                        reason: Reason::ClusterMetrics,
                        hold: None,
                    },
                    None => Decision::Fallback(Cause::SharedData),
                },
                Pick::NoServices => Decision::Fallback(Cause::SharedData),
            }
        }
    }
}

/// AdaptiveScore over every gateway: the §3.5 candidates and their local scores, for Redis to
/// weigh by its counts. Nothing is counted until Redis answers.
fn global_pick(
    host: &mut dyn Host,
    env: Env,
    input: &Input,
    stats: &Rc<SharedStats>,
    (global, keys): (&GlobalInflight, &Rc<InflightKeys>),
    now: u64,
) -> Decision {
    let now_ms = i64::try_from(now).unwrap_or(i64::MAX);
    let current = match host.shared_get(&stats.key) {
        Ok(v) => v.map(|(bytes, _)| bytes),
        Err(_) => {
            env.tel.inc(host, Counter::ClusterStatsFailed);
            None
        }
    };
    let (mut table, _) = stats.load(current);
    stats.apply_pending(&mut table);
    let mut next = || env.rng.next_u64();
    let mut distinct: Vec<usize> = Vec::new();
    for i in select::adaptive_candidates(&stats.params, &table, now_ms, &mut next) {
        if !distinct.contains(&i) {
            distinct.push(i);
        }
    }
    let scores = select::adaptive_scores(&stats.params, &table, &distinct, now_ms);
    // The local path's choice, should Redis not answer.
    let local = select::lowest(&scores)
        .and_then(|i| distinct.get(i))
        .and_then(|&i| table.names().get(i).cloned());
    let candidates: Vec<(String, f64)> = distinct
        .iter()
        .zip(scores)
        .filter_map(|(&i, score)| Some((table.names().get(i)?.clone(), score)))
        .collect();
    let Some(local) = local else {
        return Decision::Fallback(Cause::NoHealthyEndpoint);
    };
    Decision::Acquire(Box::new(ServicePick {
        config: input.config.clone(),
        keys: keys.clone(),
        request_id: env.rng.request_id(),
        key_ttl_s: global.key_ttl_s,
        candidates: Rc::new(candidates),
        local,
        stats: stats.clone(),
        start_ms: now,
        by_sha: true,
    }))
}
