//! Counters and logs of one VM: every line carries `[ai-load-balancer] #<context id>`, disabled
//! levels cost no formatting, and a fallback cause is logged at warn at most once per
//! [`WARN_INTERVAL_MS`] (the rest at debug) so a Redis outage does not flood the log; a
//! clamped priority at most once per [`CLAMP_LOG_INTERVAL_MS`] per tenant, so a forged flood
//! does not either.

use crate::config::RouteConfig;
use crate::host::{Host, LogLevel};
use crate::reason::Cause;
use crate::stats::{Counter, PodGauges, PodStats, Stats};
use std::collections::HashMap;
use std::fmt;

/// A fallback cause is logged at warn at most this often per VM.
const WARN_INTERVAL_MS: u64 = 10_000;
/// A tenant's clamped priority is logged at warn at most this often per VM
/// (docs/sessions-and-queues.md "Priority ceilings").
pub const CLAMP_LOG_INTERVAL_MS: u64 = 60_000;
/// At most this many tenants remembered for [`CLAMP_LOG_INTERVAL_MS`]: forged tenant names
/// must not grow the VM's memory. Past it, a new tenant's clamp is logged at debug.
pub const MAX_CLAMP_TENANTS: usize = 256;

pub struct Telemetry {
    stats: Stats,
    level: LogLevel,
    last_warn: HashMap<Cause, u64>,
    /// When [`Telemetry::redis_refused`] last warned.
    last_refused: Option<u64>,
    /// When [`Telemetry::priority_clamped`] last warned, per tenant key.
    last_clamp: HashMap<u64, u64>,
    /// prefix_cache's per-pod verified counters, defined as pods are verified.
    pub pods: PodStats,
    /// prefix_cache's per-pod prediction errors (latency-aware placement).
    pub latency_pods: PodGauges,
}

impl Telemetry {
    pub fn new(host: &mut dyn Host, level: LogLevel) -> Telemetry {
        Telemetry {
            stats: Stats::define(host),
            level,
            last_warn: HashMap::new(),
            last_refused: None,
            last_clamp: HashMap::new(),
            pods: PodStats::default(),
            latency_pods: PodGauges::default(),
        }
    }

    pub fn inc(&self, host: &mut dyn Host, counter: Counter) {
        self.stats.inc(host, counter);
    }

    pub fn add(&self, host: &mut dyn Host, counter: Counter, n: i64) {
        self.stats.add(host, counter, n);
    }

    pub fn enabled(&self, level: LogLevel) -> bool {
        level >= self.level
    }

    pub fn log(&self, host: &dyn Host, level: LogLevel, ctx: u32, msg: fmt::Arguments) {
        if self.enabled(level) {
            host.log(level, &format!("[ai-load-balancer] #{ctx} {msg}"));
        }
    }

    /// A request fell back: count the cause and say what happens instead.
    /// Warn for `cause` at most once per interval; Debug in between.
    fn warn_level(&mut self, host: &dyn Host, cause: Cause) -> LogLevel {
        let now = host.now_ms();
        let last = self.last_warn.get(&cause).copied();
        if last.is_none_or(|t| now.saturating_sub(t) >= WARN_INTERVAL_MS) {
            self.last_warn.insert(cause, now);
            LogLevel::Warn
        } else {
            LogLevel::Debug
        }
    }

    /// Redis (or the proxy in front of it) refused this VM's credentials: every pick will fall
    /// back until the config is fixed, so say so plainly, at warn at most once per interval.
    /// `error` is Redis's own text (`NOAUTH ...`, `WRONGPASS ...`), which never holds the
    /// password.
    pub fn redis_refused(&mut self, host: &dyn Host, ctx: u32, error: &str) {
        let now = host.now_ms();
        let level = if self
            .last_refused
            .is_none_or(|t| now.saturating_sub(t) >= WARN_INTERVAL_MS)
        {
            self.last_refused = Some(now);
            LogLevel::Warn
        } else {
            LogLevel::Debug
        };
        self.log(
            host,
            level,
            ctx,
            format_args!(
                "Redis refused the credentials ({error}): check lb_config username and password; requests fall back until then"
            ),
        );
    }

    /// Priority ceilings: a request asked for a class above its tenant's ceiling and was
    /// clamped. Counted each time; logged at warn at most once per [`CLAMP_LOG_INTERVAL_MS`]
    /// per `tenant` (a hash of its name, 0 without one), at debug in between. `msg` must not
    /// echo what the client sent (it names the tenant by its config name or its id).
    pub fn priority_clamped(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        tenant: u64,
        msg: fmt::Arguments,
    ) {
        self.inc(host, Counter::PriorityClamped);
        let now = host.now_ms();
        let due = |t: &u64| now.saturating_sub(*t) >= CLAMP_LOG_INTERVAL_MS;
        let level = match self.last_clamp.get(&tenant).copied() {
            Some(t) if !due(&t) => LogLevel::Debug,
            Some(_) => {
                self.last_clamp.insert(tenant, now);
                LogLevel::Warn
            }
            None => {
                if self.last_clamp.len() >= MAX_CLAMP_TENANTS {
                    self.last_clamp.retain(|_, t| !due(t));
                }
                if self.last_clamp.len() >= MAX_CLAMP_TENANTS {
                    LogLevel::Debug
                } else {
                    self.last_clamp.insert(tenant, now);
                    LogLevel::Warn
                }
            }
        };
        self.log(host, level, ctx, msg);
    }

    pub fn fell_back(&mut self, host: &mut dyn Host, ctx: u32, cause: Cause, denied: bool) {
        self.inc(host, Counter::Fallback(cause));
        let level = self.warn_level(host, cause);
        let action = if denied {
            "503 (failureMode deny)"
        } else {
            "cluster load balancing"
        };
        self.log(
            host,
            level,
            ctx,
            format_args!("fallback to {action}: {}", cause.name()),
        );
    }

    /// Balanced without reading the body: it was over `maxBodyBytes`, or (plain Envoy) it did
    /// not come within `maxBodyWaitMs` or the host withholds it. Counted, and warned at most
    /// once per interval per cause, like a fallback; the warning names the setting to change
    /// (for a withheld body the filter flag whose absence makes Envoy withhold it:
    /// docs/higress-abi.md §10). `route` is the request's route config, if it is known.
    pub fn no_body(
        &mut self,
        host: &mut dyn Host,
        ctx: u32,
        cause: Cause,
        route: Option<&RouteConfig>,
    ) {
        self.inc(host, Counter::Fallback(cause));
        let level = self.warn_level(host, cause);
        if !self.enabled(level) {
            return;
        }
        let why = match cause {
            Cause::BodyWithheld => "Envoy withholds the request body from this filter: set \
                `allow_on_headers_stop_iteration: true` in the wasm filter's config"
                .to_string(),
            Cause::BodyTooLarge => format!(
                "request body over maxBodyBytes ({} bytes), not read",
                route.map_or(0, |r| r.common.max_body_bytes)
            ),
            _ => format!(
                "no whole request body within maxBodyWaitMs ({} ms); a wasm filter \
                 without `allow_on_headers_stop_iteration: true` never gets it before routing",
                route.map_or(0, |r| r.common.max_body_wait_ms)
            ),
        };
        self.log(
            host,
            level,
            ctx,
            format_args!("{why}: balanced without the body ({})", cause.name()),
        );
    }

    /// prefix_cache: the body is not a prompt it can read (not JSON, no messages, ...), so
    /// least request chose without a prefix. Counted as `bad_request` and warned at most once
    /// per interval, like a fallback (docs/metrics.md "Logs").
    pub fn bad_prompt(&mut self, host: &mut dyn Host, ctx: u32, error: &dyn fmt::Display) {
        let cause = Cause::BadRequest;
        self.inc(host, Counter::Fallback(cause));
        let level = self.warn_level(host, cause);
        self.log(
            host,
            level,
            ctx,
            format_args!(
                "{error}: no prompt to route by, least request chose ({})",
                cause.name()
            ),
        );
    }

    /// cluster_metrics: Redis could not choose, the local path did (warned at most once per
    /// interval per cause, like a fallback).
    pub fn inflight_local(&mut self, host: &mut dyn Host, ctx: u32, cause: Cause) {
        self.inc(host, Counter::ClusterInflightLocal);
        let level = self.warn_level(host, cause);
        self.log(
            host,
            level,
            ctx,
            format_args!(
                "global in-flight count unavailable ({}): chose from this proxy's counts",
                cause.name()
            ),
        );
    }
}
