//! Why a request went where it went: the fallback causes and the decision reasons. Both are
//! enums so nothing matches on strings; `name()` is the one spelling used in metric names, logs
//! and the debug header (docs/metrics.md, "Debug header").

/// Why a request went to the cluster's own load balancer (or got 503 under `failureMode: deny`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// The request could not be read as a prompt (prefix_cache).
    BadRequest,
    /// No endpoint has usable metrics (endpoint_metrics).
    NoMetrics,
    /// The per-proxy shared data could not be updated (plain-Envoy least request).
    SharedData,
    /// Plain Envoy: no whole body within `maxBodyWaitMs`; balanced without it.
    BodyTimeout,
    /// Plain Envoy: this worker learned that Envoy withholds the body from the filter (no
    /// `allow_on_headers_stop_iteration`); balanced at the headers without it.
    BodyWithheld,
}

impl Cause {
    pub const ALL: [Cause; 14] = [
        Cause::NoRoute,
        Cause::NoHealthyEndpoint,
        Cause::HostListUnavailable,
        Cause::BodyTooLarge,
        Cause::RedisUnavailable,
        Cause::RedisTimeout,
        Cause::RedisError,
        Cause::BadReply,
        Cause::OverrideFailed,
        Cause::BadRequest,
        Cause::NoMetrics,
        Cause::SharedData,
        Cause::BodyTimeout,
        Cause::BodyWithheld,
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
            Cause::BadRequest => "bad_request",
            Cause::NoMetrics => "no_metrics",
            Cause::SharedData => "shared_data",
            Cause::BodyTimeout => "body_timeout",
            Cause::BodyWithheld => "body_withheld",
        }
    }
}

/// How a request's routing ended, as the debug header and the logs name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Headers held while the body is buffered.
    AwaitingBody,
    /// A pick is in flight.
    Pending,
    /// Least-loaded endpoint (global_least_request, or prefix_cache without a usable prompt).
    LeastRequest,
    /// prefix_cache: the pod holding the longest known prefix.
    PrefixHit,
    /// prefix_cache: no known prefix; the least-loaded pod now holds it.
    PrefixMiss,
    /// prefix_cache: the prefix's pod was over the load guard; the request spilled.
    PrefixSpill,
    /// A sticky session stayed on its endpoint.
    Session,
    /// An agent's own session identity (a recognised header or body field) stayed on its
    /// endpoint (docs/sessions-and-queues.md "Agent sessions").
    AgentSession,
    /// A Responses continuation went to the pod that produced its `previous_response_id`.
    Continuation,
    /// A session's endpoint left or was over the load guard: placed and bound anew.
    SessionRebound,
    /// endpoint_metrics: chosen from the model servers' metrics.
    Metrics,
    /// Every endpoint was at `maxRequestCount`: 429.
    Rejected429,
    /// Every endpoint saturated and the request sheddable: 429.
    Shed429,
    /// Priority classes: every endpoint at the request's class cap: 429 (docs/sessions-and-queues.md "Priority classes").
    ShedPriority,
    /// Tenant fairness: the request's tenant at its share while another is active: 429
    /// (docs/sessions-and-queues.md "Tenant fairness").
    ShedTenant,
    /// Latency-aware placement: no endpoint predicted to meet a sheddable request's
    /// objectives, and the draw shed it: 429 (docs/latency-model.md §5).
    ShedLatency,
    /// cluster_hash: the `hash_header` value's slot.
    ClusterHash,
    /// cluster_metrics: the service its `mode` chose.
    ClusterMetrics,
    /// cluster_hash: no `hash_header` (or an empty one): 403.
    HashHeaderMissing403,
    /// cluster_hash with a `key` block: no key (or an empty one): 403.
    HashKeyMissing403,
    /// A cluster policy could not write `cluster_header`: 500, as Higress answers.
    ClusterHeaderFailed500,
    /// The plugin could not decide: the cluster's own load balancing (or 503 under deny).
    Fallback(Cause),
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::AwaitingBody => "awaiting_body",
            Reason::Pending => "pending",
            Reason::LeastRequest => "least_request",
            Reason::PrefixHit => "prefix_hit",
            Reason::PrefixMiss => "prefix_miss",
            Reason::PrefixSpill => "prefix_spill",
            Reason::Session => "session",
            Reason::AgentSession => "agent_session",
            Reason::Continuation => "continuation",
            Reason::SessionRebound => "session_rebound",
            Reason::Metrics => "metrics",
            Reason::Rejected429 => "rejected_429",
            Reason::Shed429 => "shed_429",
            Reason::ShedPriority => "shed_priority",
            Reason::ShedTenant => "shed_tenant",
            Reason::ShedLatency => "shed_latency",
            Reason::ClusterHash => "cluster_hash",
            Reason::ClusterMetrics => "cluster_metrics",
            Reason::HashHeaderMissing403 => "hash_header_missing_403",
            Reason::HashKeyMissing403 => "hash_key_missing_403",
            Reason::ClusterHeaderFailed500 => "cluster_header_failed_500",
            Reason::Fallback(c) => c.name(),
        }
    }
}
