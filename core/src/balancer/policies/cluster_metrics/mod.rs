//! cluster_metrics (`lb_type: cluster`): picks one of `service_list` by the route's `mode`
//! from per-service statistics, writes it into `cluster_header`, and measures the request
//! itself: time to the first response-body chunk (TTFT) and to stream end, errors = a
//! `:status` other than 200 or none at all (docs/higress-cluster-policies.md §3.3).
//!
//! The statistics live in proxy-wide shared data, one record per route config, updated with
//! compare-and-swap (`balancer::shared::update`), so every worker VM of a proxy decides
//! from the same numbers (Higress keeps them per VM). The in-flight count taken at the
//! decision is held by the request (`Hold::Service`) and given back exactly once at stream
//! end, with the total latency.
//!
//! AdaptiveScore with `global_inflight_enabled` asks Redis instead: the candidates and their
//! local scores go to one script call that multiplies each by its count over every gateway,
//! takes the lowest and counts it (docs/higress-cluster-policies.md §3.6); the local count is
//! taken when Redis answers (`start`). Any Redis trouble: the local choice made here
//! ([`reply`]).

pub mod reply;
pub mod stats;

use super::policy::{Env, Input, Policy};
use crate::balancer::events::{Decision, Hold};
use crate::balancer::pick::{Pick as RedisPick, ServiceLease, ServicePick};
use crate::balancer::rng::VmRng;
use crate::balancer::shared;
use crate::balancer::telemetry::Telemetry;
use crate::cluster::select::{self, Decision as Pick};
use crate::cluster::stats::record::Record;
use crate::cluster::stats::Table;
use crate::cluster::Mode;
use crate::config::{ClusterMetricsConfig, GlobalInflight};
use crate::host::{Host, HostError, LogLevel};
use crate::reason::{Cause, Reason};
use crate::redis::inflight::InflightKeys;
use crate::stats::Counter;
pub use stats::SharedStats;
use std::rc::Rc;

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
            };
            Decision::Route {
                endpoint: lease.name().to_string(),
                fallbacks: Vec::new(),
                reason: Reason::ClusterMetrics,
                hold: Some(Hold::Service(lease)),
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
                        endpoint: service.clone(),
                        fallbacks: Vec::new(),
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
    Decision::Acquire(Box::new(RedisPick::Service(ServicePick {
        config: input.config.clone(),
        keys: keys.clone(),
        request_id: env.rng.request_id(),
        key_ttl_s: global.key_ttl_s,
        candidates: Rc::new(candidates),
        local,
        stats: stats.clone(),
        start_ms: now,
        by_sha: true,
    })))
}

/// A global pick was answered (or fell to the local path): count the service in this proxy,
/// as the local path does at its decision.
pub fn start(host: &mut dyn Host, tel: &Telemetry, lease: &ServiceLease) {
    let result = write(host, &lease.stats, Change::Start(lease.service));
    if result.is_err() {
        tel.inc(host, Counter::ClusterStatsFailed);
    }
}

/// The first response-body chunk: a TTFT sample (Higress measures at the first streamed chunk),
/// written with this worker's next update of the record (`SharedStats::pending`).
pub fn first_byte(host: &mut dyn Host, tel: &Telemetry, lease: &ServiceLease, success: bool) {
    let elapsed = elapsed_ms(host.now_ms(), lease);
    if !lease
        .stats
        .defer_first_byte(lease.service, elapsed, success)
    {
        return;
    }
    if write(host, &lease.stats, Change::Flush).is_err() {
        tel.inc(host, Counter::ClusterStatsFailed);
    }
}

/// Stream end: the in-flight count back and, when the request got this far (`outcome`), the
/// total latency and the error bookkeeping (cooldown).
pub fn done(host: &mut dyn Host, tel: &Telemetry, lease: ServiceLease, outcome: Option<bool>) {
    // One clock read: the sample and the cooldown deadline are of the same instant.
    let now = host.now_ms();
    let elapsed = elapsed_ms(now, &lease);
    let now_ms = i64::try_from(now).unwrap_or(i64::MAX);
    let end = Change::End {
        service: lease.service,
        elapsed_ms: outcome.map(|_| elapsed),
        success: outcome.unwrap_or(true),
        now_ms,
    };
    let result = write(host, &lease.stats, end);
    if result.is_err() {
        tel.inc(host, Counter::ReleaseFailures);
    }
}

/// What one write of the route's record does, after this worker's held samples: one type for
/// every write, so every write goes through the one compare-and-swap in [`write`].
enum Change<'a> {
    /// Choose a service by the mode and count it in: the decision.
    Choose { rng: &'a mut VmRng, now_ms: i64 },
    /// Count `service` in: a global pick answered.
    Start(usize),
    /// A stream of `service` ended (`Table::on_stream_end`).
    End {
        service: usize,
        elapsed_ms: Option<i64>,
        success: bool,
        now_ms: i64,
    },
    /// Nothing but the held samples.
    Flush,
}

/// One compare-and-swap of the route's record: this worker's held samples first, then
/// `change`. Answers the service a [`Change::Choose`] chose, and whether a record was there
/// but not ours (it started fresh).
fn write(
    host: &mut dyn Host,
    stats: &SharedStats,
    mut change: Change,
) -> Result<(Option<usize>, bool), HostError> {
    let result = shared::update(host, &stats.key, |current| {
        let (mut record, reset) = stats.load(current);
        stats.apply_pending(&mut record);
        let chosen = apply(&mut record, stats, &mut change);
        (record.into_bytes(), (chosen, reset))
    });
    if result.is_ok() {
        stats.written();
    }
    result
}

/// `change` on `record`: the service a [`Change::Choose`] chose, None for the others.
fn apply(record: &mut Record, stats: &SharedStats, change: &mut Change) -> Option<usize> {
    match change {
        Change::Choose { rng, now_ms } => {
            let mut next = || rng.next_u64();
            match select::select(stats.mode, &stats.params, &*record, *now_ms, &mut next) {
                Pick::Pick(i) => {
                    record.on_request_start(i);
                    Some(i)
                }
                Pick::NoServices => None,
            }
        }
        Change::Start(service) => {
            record.on_request_start(*service);
            None
        }
        Change::End {
            service,
            elapsed_ms,
            success,
            now_ms,
        } => {
            record.on_stream_end(*service, *elapsed_ms, *success, *now_ms, &stats.params);
            None
        }
        Change::Flush => None,
    }
}

fn elapsed_ms(now: u64, lease: &ServiceLease) -> i64 {
    i64::try_from(now.saturating_sub(lease.start_ms)).unwrap_or(i64::MAX)
}
