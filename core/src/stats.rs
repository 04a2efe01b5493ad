//! Plugin counters, defined once per VM under the stable prefix `ai_lb.` (docs/metrics.md).
//! A counter whose definition failed is a no-op rather than an error on the request path.

use crate::config::Policy;
use crate::host::{Host, MetricType};
pub use crate::reason::Cause;
use crate::reason::Reason;

mod pods;
pub use pods::{PodGauges, PodStats, MAX_POD_COUNTERS};

/// What a request published for `reason` counts besides its policy's decision: prefix_cache's
/// hits and spills (docs/metrics.md).
pub fn routed_as(reason: Reason) -> Option<Counter> {
    match reason {
        Reason::PrefixHit => Some(Counter::PrefixHit),
        Reason::PrefixSpill => Some(Counter::PrefixSpill),
        _ => None,
    }
}

/// What a plain-Envoy pod that Envoy answered around counts, by the reason it was chosen: a
/// session's pod, or any other pick's (docs/plain-envoy.md "Failure memory").
pub fn pod_down(reason: Reason) -> Counter {
    match reason {
        Reason::Session | Reason::AgentSession | Reason::Continuation | Reason::SessionRebound => {
            Counter::SessionPodDown
        }
        _ => Counter::GlrPodDown,
    }
}

/// How a policy's decision for one request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Routed,
    FellBack,
    Denied,
    Rejected429,
}

impl Outcome {
    pub const ALL: [Outcome; 4] = [
        Outcome::Routed,
        Outcome::FellBack,
        Outcome::Denied,
        Outcome::Rejected429,
    ];

    fn name(self) -> &'static str {
        match self {
            Outcome::Routed => "routed",
            Outcome::FellBack => "fallback",
            Outcome::Denied => "denied_503",
            Outcome::Rejected429 => "rejected_429",
        }
    }
}

/// Everything counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    Decision(Policy, Outcome),
    Fallback(Cause),
    RedisCalls,
    RedisErrors,
    RedisTimeouts,
    RedisNoScript,
    RedisResync,
    Releases,
    /// prefix_cache: a batch of first bytes sent (booked prefill tokens given back).
    FirstBytesSent,
    ReleasesOrphaned,
    ReleaseFailures,
    /// A sticky request stayed on its session's endpoint.
    SessionHit,
    /// A session without an endpoint was bound to the one picked.
    SessionBound,
    /// A session's endpoint left or was over the load guard: bound to the one picked.
    SessionRebound,
    /// Plain Envoy: a session's pod did not answer (Envoy's retry did): failure memory ejects
    /// it.
    SessionPodDown,
    /// Plain Envoy: a pod chosen without a session did not answer (Envoy's retry did): failure
    /// memory ejects it, so picks pass over it (a dead pod holds no requests, so it would
    /// otherwise look the least loaded of all).
    GlrPodDown,
    /// A sticky request fell back (Redis down, timeout, bad reply): the session not honoured.
    SessionFallback,
    /// A request whose session is an agent's own identity (a header or body field of the
    /// recognised list) or a Responses continuation, not a configured session
    /// (docs/sessions-and-queues.md "Agent sessions").
    SessionAgent,
    /// A Responses continuation whose previous response's pod was not known (never recorded,
    /// expired, or a garbage id): placed as the policy places it.
    ContinuationUnknown,
    /// A Responses answer's id was recorded against the pod that produced it.
    ResponseRecorded,
    /// prefix_cache: a known prefix was found.
    PrefixHit,
    /// prefix_cache: the matched endpoint was too loaded; the request spilled.
    PrefixSpill,
    /// prefix_cache, plain Envoy: a prefix-index record in shared data did not decode and was
    /// started afresh (docs/redis-data-model.md §9).
    PrefixIndexReset,
    /// prefix_cache, plain Envoy: a prefix-index record could not be written (the request is
    /// still routed; its prefixes are not remembered).
    PrefixIndexFailed,
    /// prefix_cache, plain Envoy with scraped metrics: the request's endpoint (known or
    /// hashed) was saturated by its scraped metrics and passed by (docs/redis-data-model.md §9).
    PrefixSaturated,
    /// prefix_cache: a 2xx response's usage reported its cached tokens (docs/redis-data-model.md
    /// §5 "Engine-verified keys").
    PrefixVerified,
    /// prefix_cache: a 2xx response ended without a readable usage report (no usage, garbage,
    /// a client's own `stream_options`, a reset): nothing verified.
    PrefixVerifyNoUsage,
    /// prefix_cache, verified responses: the tokens the picks predicted the pods held (added).
    PrefixPredictedTokens,
    /// prefix_cache, verified responses: the tokens the engines reported cached (added).
    PrefixCachedTokens,
    /// prefix_cache, verified responses: their prompt tokens (added): cached ÷ prompt is the
    /// verified hit rate.
    PrefixPromptTokens,
    /// prefix_cache: an engine cached more than a block less than predicted, but at least half.
    PrefixShortfallMild,
    /// prefix_cache: an engine cached under half the predicted prefix: the pod lost cache.
    PrefixShortfall,
    /// prefix_cache: a pod's generation was bumped after a shortfall: its older index entries
    /// stop matching.
    PrefixGenerationBump,
    /// endpoint_metrics: a metrics text was parsed (per scrape or host-text change, never per request).
    MetricsParsed,
    /// endpoint_metrics: `rate_limit` moved a pick to another endpoint.
    MetricsRateLimited,
    /// endpoint_metrics: a scrape answered with usable metrics.
    ScrapeOk,
    /// endpoint_metrics: a scrape failed (dispatch, status, timeout, garbage).
    ScrapeFailed,
    /// endpoint_metrics: a metrics text was cut at a size limit (the scraper's 4 MiB, Higress's
    /// 64 KiB health-check body): families past the cut read as unknown.
    MetricsTruncated,
    /// endpoint_metrics: a metrics text had a value read as unknown (cut off, NaN/±Inf, out of
    /// range), never as 0.
    MetricsUnknownValue,
    /// endpoint_metrics: a metrics text was JSON, not Prometheus text (trtllm-serve's
    /// `/metrics`; its Prometheus text is at `/prometheus/metrics`).
    MetricsNotPrometheus,
    /// endpoint_metrics: lines of a metrics text that did not parse (counted per line); the
    /// families they belong to read as unknown.
    MetricsMalformed,
    /// cluster_hash: a request without `hash_header` answered 403.
    HashHeaderMissing,
    /// A cluster policy could not write `cluster_header`: answered 500.
    ClusterHeaderFailed,
    /// cluster_metrics: the shared statistics could not be read or written (the request is
    /// still routed; the sample is lost).
    ClusterStatsFailed,
    /// cluster_metrics: the shared statistics held a record that did not decode: fresh stats.
    ClusterStatsReset,
    /// cluster_metrics AdaptiveScore: Redis chose and counted the service (global in-flight).
    ClusterInflightGlobal,
    /// cluster_metrics AdaptiveScore: Redis could not choose (down, timeout, error reply, no
    /// route name); the local path did.
    ClusterInflightLocal,
    /// Plain Envoy: a worker VM saw Envoy withhold a held request's body (the wasm filter
    /// lacks `allow_on_headers_stop_iteration`); counted once per VM.
    BodyWithheldDetected,
    /// Priority classes: a request refused (429) because every endpoint was at its class cap.
    PriorityShed,
    /// Priority classes: a highest-class request admitted above `maxRequestCount` (plain Envoy,
    /// where the chosen endpoint's load is known).
    PriorityAdmittedHeadroom,
    /// Priority classes: a `priorityHeader` value naming no class (the default class used).
    PriorityUnknownClass,
    /// Priority ceilings: a `priorityHeader` value asking for a class above its tenant's
    /// ceiling, clamped to it (docs/sessions-and-queues.md "Priority ceilings").
    PriorityClamped,
    /// Waiting queue: a request refused for want of room waits instead (docs/sessions-and-queues.md "Waiting queue").
    QueueQueued,
    /// Waiting queue: a waiting request got room and was routed.
    QueueAdmitted,
    /// Waiting queue: a waiting request reached `queueTimeoutMs`: 429 with `Retry-After`.
    QueueTimeout,
    /// Waiting queue: the client went away while its request waited (nothing held, nothing leaked).
    QueueAbandoned,
    /// Tenant fairness: a request refused (429) because its tenant held its share of the pool
    /// while another tenant was active.
    TenantShed,
    /// Tenant fairness: a tenant's request that fell back (Redis down, shared data failed):
    /// not held to its share.
    TenantFallback,
    /// An acquire refused because the pool was at `maxPoolRequests` (or its class's cap of
    /// it): a 429, or with a waiting queue a wait (each retry of a waiting request counts).
    PoolFull,
    /// Failure memory (docs/redis-data-model.md §14): a released request that failed (a 5xx)
    /// and was learned against its endpoint.
    EjectFailures,
    /// An endpoint ejected (its failures in a row, or a failure on trial).
    Ejected,
    /// An ejection refused: `maxEjectedPercent` of the pool was out already.
    EjectionRefused,
    /// A pick that found every endpoint ejected and chose as if none were.
    EjectedFailOpen,
    /// Latency-aware placement (docs/latency-model.md §5): a pick placed by predicted latency.
    LatencyPlaced,
    /// A sheddable request shed because no endpoint was predicted to meet its objectives.
    LatencyShed,
    /// A pick placed by the token gate instead: the gateway's model predicted too badly.
    LatencyFallback,
    /// An answer learnt by the latency models, and one refused (a timing or feature that is
    /// NaN, negative or absurd).
    LatencySamples,
    LatencyBadSamples,
    /// The models merged with the fleet's in Redis, and a merge that failed.
    LatencyMerges,
    LatencyMergeFailures,
    /// A request's objective header that did not read as a number in range: the route's used.
    LatencyBadObjective,
}

const FIXED: [(Counter, &str); 69] = [
    (Counter::RedisCalls, "ai_lb.redis.calls"),
    (Counter::RedisErrors, "ai_lb.redis.errors"),
    (Counter::RedisTimeouts, "ai_lb.redis.timeouts"),
    (Counter::RedisNoScript, "ai_lb.redis.noscript"),
    (Counter::RedisResync, "ai_lb.redis.resync"),
    (Counter::Releases, "ai_lb.release.sent"),
    (Counter::FirstBytesSent, "ai_lb.prefix.first_bytes_sent"),
    (Counter::ReleasesOrphaned, "ai_lb.release.orphaned"),
    (Counter::ReleaseFailures, "ai_lb.release.failed"),
    (Counter::SessionHit, "ai_lb.session.hit"),
    (Counter::SessionBound, "ai_lb.session.bound"),
    (Counter::SessionRebound, "ai_lb.session.rebound"),
    (Counter::SessionPodDown, "ai_lb.session.pod_down"),
    (Counter::GlrPodDown, "ai_lb.glr.pod_down"),
    (Counter::SessionFallback, "ai_lb.session.fallback"),
    (Counter::SessionAgent, "ai_lb.session.agent"),
    (
        Counter::ContinuationUnknown,
        "ai_lb.session.continuation_unknown",
    ),
    (Counter::ResponseRecorded, "ai_lb.session.response_recorded"),
    (Counter::PrefixHit, "ai_lb.prefix.hit"),
    (Counter::PrefixSpill, "ai_lb.prefix.spill"),
    (Counter::PrefixIndexReset, "ai_lb.prefix.index_reset"),
    (Counter::PrefixIndexFailed, "ai_lb.prefix.index_failed"),
    (Counter::PrefixSaturated, "ai_lb.prefix.saturated"),
    (Counter::PrefixVerified, "ai_lb.prefix.verified"),
    (Counter::PrefixVerifyNoUsage, "ai_lb.prefix.verify_no_usage"),
    (
        Counter::PrefixPredictedTokens,
        "ai_lb.prefix.predicted_tokens",
    ),
    (Counter::PrefixCachedTokens, "ai_lb.prefix.cached_tokens"),
    (Counter::PrefixPromptTokens, "ai_lb.prefix.prompt_tokens"),
    (Counter::PrefixShortfallMild, "ai_lb.prefix.shortfall_mild"),
    (Counter::PrefixShortfall, "ai_lb.prefix.shortfall"),
    (
        Counter::PrefixGenerationBump,
        "ai_lb.prefix.generation_bumps",
    ),
    (Counter::MetricsParsed, "ai_lb.metrics.parsed"),
    (Counter::MetricsRateLimited, "ai_lb.metrics.rate_limited"),
    (Counter::ScrapeOk, "ai_lb.metrics.scrape_ok"),
    (Counter::ScrapeFailed, "ai_lb.metrics.scrape_failed"),
    (Counter::MetricsTruncated, "ai_lb.metrics.truncated"),
    (Counter::MetricsUnknownValue, "ai_lb.metrics.unknown_value"),
    (
        Counter::MetricsNotPrometheus,
        "ai_lb.metrics.not_prometheus",
    ),
    (Counter::MetricsMalformed, "ai_lb.metrics.malformed"),
    (
        Counter::HashHeaderMissing,
        "ai_lb.cluster_hash.rejected_403",
    ),
    (
        Counter::ClusterHeaderFailed,
        "ai_lb.cluster.header_failed_500",
    ),
    (
        Counter::ClusterStatsFailed,
        "ai_lb.cluster_metrics.stats_failed",
    ),
    (
        Counter::ClusterStatsReset,
        "ai_lb.cluster_metrics.stats_reset",
    ),
    (
        Counter::ClusterInflightGlobal,
        "ai_lb.cluster_metrics.inflight_global",
    ),
    (
        Counter::ClusterInflightLocal,
        "ai_lb.cluster_metrics.inflight_local",
    ),
    (
        Counter::BodyWithheldDetected,
        "ai_lb.body.withheld_detected",
    ),
    (Counter::PriorityShed, "ai_lb.priority.shed"),
    (
        Counter::PriorityAdmittedHeadroom,
        "ai_lb.priority.admitted_headroom",
    ),
    (
        Counter::PriorityUnknownClass,
        "ai_lb.priority.unknown_class",
    ),
    (Counter::PriorityClamped, "ai_lb.priority.clamped"),
    (Counter::QueueQueued, "ai_lb.queue.queued"),
    (Counter::QueueAdmitted, "ai_lb.queue.admitted"),
    (Counter::QueueTimeout, "ai_lb.queue.timeout"),
    (Counter::QueueAbandoned, "ai_lb.queue.abandoned"),
    (Counter::TenantShed, "ai_lb.tenant.shed"),
    (Counter::TenantFallback, "ai_lb.tenant.fallback"),
    (Counter::PoolFull, "ai_lb.pool.full"),
    (Counter::EjectFailures, "ai_lb.eject.failures"),
    (Counter::Ejected, "ai_lb.eject.ejected"),
    (Counter::EjectionRefused, "ai_lb.eject.refused"),
    (Counter::EjectedFailOpen, "ai_lb.eject.fail_open"),
    (Counter::LatencyPlaced, "ai_lb.latency.placed"),
    (Counter::LatencyShed, "ai_lb.latency.shed"),
    (Counter::LatencyFallback, "ai_lb.latency.fallback"),
    (Counter::LatencySamples, "ai_lb.latency.samples"),
    (Counter::LatencyBadSamples, "ai_lb.latency.bad_samples"),
    (Counter::LatencyMerges, "ai_lb.latency.merges"),
    (
        Counter::LatencyMergeFailures,
        "ai_lb.latency.merge_failures",
    ),
    (Counter::LatencyBadObjective, "ai_lb.latency.bad_objective"),
];

/// Metric ids in the order of [`Stats::names`].
#[derive(Debug, Default)]
pub struct Stats {
    ids: Vec<Option<u32>>,
}

impl Stats {
    pub fn define(host: &mut dyn Host) -> Stats {
        let ids = Self::names()
            .iter()
            .map(|name| host.define_metric(MetricType::Counter, name).ok())
            .collect();
        Stats { ids }
    }

    pub fn inc(&self, host: &mut dyn Host, counter: Counter) {
        self.add(host, counter, 1);
    }

    /// Counts `n` at once (lines of one text, say).
    pub fn add(&self, host: &mut dyn Host, counter: Counter, n: i64) {
        if let Some(Some(id)) = self.ids.get(Self::index(counter)) {
            let _ = host.increment_metric(*id, n);
        }
    }

    fn index(counter: Counter) -> usize {
        let decisions = Policy::ALL.len() * Outcome::ALL.len();
        match counter {
            // Positions straight from the discriminants, which are the positions in `ALL`
            // (checked by a test).
            Counter::Decision(p, o) => p as usize * Outcome::ALL.len() + o as usize,
            Counter::Fallback(c) => {
                decisions + FIXED.len() + Cause::ALL.iter().position(|&x| x == c).unwrap_or(0)
            }
            other => decisions + FIXED.iter().position(|(c, _)| *c == other).unwrap_or(0),
        }
    }

    /// Every metric name, in definition order (also checked against the README table).
    pub fn names() -> Vec<String> {
        let decisions = Policy::ALL.iter().flat_map(|p| {
            Outcome::ALL
                .iter()
                .map(move |o| format!("ai_lb.{}.{}", p.metric_label(), o.name()))
        });
        decisions
            .chain(FIXED.iter().map(|(_, n)| n.to_string()))
            .chain(
                Cause::ALL
                    .iter()
                    .map(|c| format!("ai_lb.fallback.{}", c.name())),
            )
            .collect()
    }
}

#[cfg(test)]
mod tests;
