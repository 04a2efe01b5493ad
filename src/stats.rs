//! Plugin counters, defined once per VM under the stable prefix `ai_lb.` (README "Metrics").
//! A counter whose definition failed is a no-op rather than an error on the request path.

use crate::host::{Host, MetricType};

/// Why a request went to the cluster's own load balancer (or got 503 under `failureMode: deny`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    NoRoute,
    NoHealthyEndpoint,
    HostListUnavailable,
    BodyTooLarge,
    RedisUnavailable,
    RedisTimeout,
    RedisError,
    BadReply,
    OverrideFailed,
}

impl Cause {
    pub const ALL: [Cause; 9] = [
        Cause::NoRoute,
        Cause::NoHealthyEndpoint,
        Cause::HostListUnavailable,
        Cause::BodyTooLarge,
        Cause::RedisUnavailable,
        Cause::RedisTimeout,
        Cause::RedisError,
        Cause::BadReply,
        Cause::OverrideFailed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Cause::NoRoute => "no_route",
            Cause::NoHealthyEndpoint => "no_healthy_endpoint",
            Cause::HostListUnavailable => "host_list_unavailable",
            Cause::BodyTooLarge => "body_too_large",
            Cause::RedisUnavailable => "redis_unavailable",
            Cause::RedisTimeout => "redis_timeout",
            Cause::RedisError => "redis_error",
            Cause::BadReply => "bad_reply",
            Cause::OverrideFailed => "override_failed",
        }
    }
}

/// Everything counted. `Fallback(c)` counts per cause; `Decision` per policy and outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    Routed,
    FellBack,
    Denied,
    Rejected429,
    Fallback(Cause),
    RedisCalls,
    RedisErrors,
    RedisTimeouts,
    RedisNoScript,
    RedisResync,
    Releases,
    ReleasesOrphaned,
    ReleaseFailures,
}

const FIXED: [(Counter, &str); 12] = [
    (Counter::Routed, "ai_lb.glr.routed"),
    (Counter::FellBack, "ai_lb.glr.fallback"),
    (Counter::Denied, "ai_lb.glr.denied_503"),
    (Counter::Rejected429, "ai_lb.glr.rejected_429"),
    (Counter::RedisCalls, "ai_lb.redis.calls"),
    (Counter::RedisErrors, "ai_lb.redis.errors"),
    (Counter::RedisTimeouts, "ai_lb.redis.timeouts"),
    (Counter::RedisNoScript, "ai_lb.redis.noscript"),
    (Counter::RedisResync, "ai_lb.redis.resync"),
    (Counter::Releases, "ai_lb.release.sent"),
    (Counter::ReleasesOrphaned, "ai_lb.release.orphaned"),
    (Counter::ReleaseFailures, "ai_lb.release.failed"),
];

/// Metric ids, in the order of `FIXED` then `Cause::ALL`.
#[derive(Debug, Default)]
pub struct Stats {
    ids: Vec<Option<u32>>,
}

impl Stats {
    pub fn define(host: &mut dyn Host) -> Stats {
        let mut ids = Vec::with_capacity(FIXED.len() + Cause::ALL.len());
        for (_, name) in FIXED {
            ids.push(host.define_metric(MetricType::Counter, name).ok());
        }
        for cause in Cause::ALL {
            let name = format!("ai_lb.fallback.{}", cause.name());
            ids.push(host.define_metric(MetricType::Counter, &name).ok());
        }
        Stats { ids }
    }

    pub fn inc(&self, host: &mut dyn Host, counter: Counter) {
        let index = match counter {
            Counter::Fallback(c) => {
                FIXED.len() + Cause::ALL.iter().position(|&x| x == c).unwrap_or(0)
            }
            other => FIXED.iter().position(|(c, _)| *c == other).unwrap_or(0),
        };
        if let Some(Some(id)) = self.ids.get(index) {
            let _ = host.increment_metric(*id, 1);
        }
    }

    /// Every metric name, for the README table test.
    pub fn names() -> Vec<String> {
        FIXED
            .iter()
            .map(|(_, n)| n.to_string())
            .chain(
                Cause::ALL
                    .iter()
                    .map(|c| format!("ai_lb.fallback.{}", c.name())),
            )
            .collect()
    }
}
