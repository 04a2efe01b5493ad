//! Why a request is refused, and the answers the plugin gives itself (429 for want of room, 403
//! for a missing hash key, 500 when a cluster header cannot be written, 503 under `failureMode:
//! deny`).

use crate::reason::Reason;

/// Why a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Every endpoint is at `maxRequestCount`.
    MaxRequestCount,
    /// A sheddable request while every endpoint is saturated (endpoint_metrics).
    Shed,
    /// Priority classes: every endpoint is at this request's class cap (docs/sessions-and-queues.md
    /// "Priority classes"); 429 with `Retry-After`.
    ShedPriority,
    /// Tenant fairness: the request's tenant holds its share of the pool while another tenant
    /// is active (docs/sessions-and-queues.md "Tenant fairness"); 429 with `Retry-After`.
    ShedTenant,
    /// Latency-aware placement: no endpoint is predicted to meet this sheddable request's
    /// objectives (docs/latency-model.md §5); 429 with `Retry-After`.
    ShedLatency,
    /// cluster_hash: `hash_header` missing or empty (Higress answers 403).
    HashHeaderMissing,
    /// cluster_hash with a `key` block (Higress PR #3921): its key missing or empty (403).
    HashKeyMissing,
    /// A cluster policy could not write `cluster_header` (Higress answers 500).
    ClusterHeaderFailed,
}

/// A response the plugin answers itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub details: &'static str,
    pub body: &'static [u8],
    /// A `retry-after` header of this many seconds (0: none).
    pub retry_after_s: u32,
}

/// The `Retry-After` of a priority shed: load moves within about a second.
pub const SHED_RETRY_AFTER_S: u32 = 1;

impl Rejection {
    /// A refusal for want of room, which the waiting queue may turn into a wait (README
    /// "Waiting queue"): any such rejection, whichever policy or cap refused (a full pool,
    /// `maxPoolRequests`, answers as `MaxRequestCount` / `ShedPriority`, so it waits too).
    /// A tenant over its share does not wait: the room it is refused is free for the other
    /// tenants, yet a waiter holds it back from lower classes everywhere (its Redis or
    /// shared-data entry) and takes its VM queue's retries as the head, so quiet tenants
    /// behind it would wait for the flooder's own requests to finish; the 429 with
    /// `Retry-After` is the back-pressure fairness means (docs/sessions-and-queues.md "Tenant fairness").
    pub fn may_wait(self) -> bool {
        match self {
            Rejection::MaxRequestCount | Rejection::Shed | Rejection::ShedPriority => true,
            Rejection::ShedTenant
            | Rejection::ShedLatency
            | Rejection::HashHeaderMissing
            | Rejection::HashKeyMissing
            | Rejection::ClusterHeaderFailed => false,
        }
    }

    pub fn reason(self) -> Reason {
        match self {
            Rejection::MaxRequestCount => Reason::Rejected429,
            Rejection::Shed => Reason::Shed429,
            Rejection::ShedPriority => Reason::ShedPriority,
            Rejection::ShedTenant => Reason::ShedTenant,
            Rejection::ShedLatency => Reason::ShedLatency,
            Rejection::HashHeaderMissing => Reason::HashHeaderMissing403,
            Rejection::HashKeyMissing => Reason::HashKeyMissing403,
            Rejection::ClusterHeaderFailed => Reason::ClusterHeaderFailed500,
        }
    }

    pub fn reply(self) -> LocalReply {
        match self {
            Rejection::MaxRequestCount => LocalReply {
                status: 429,
                details: "ai_lb_max_request_count",
                body: b"Exceeded maximum request limit from ai-load-balancer.",
                retry_after_s: 0,
            },
            Rejection::ShedPriority => LocalReply {
                status: 429,
                details: "ai_lb_shed_priority",
                body: b"Every endpoint is saturated for this priority class: rejected by ai-load-balancer.",
                retry_after_s: SHED_RETRY_AFTER_S,
            },
            Rejection::ShedTenant => LocalReply {
                status: 429,
                details: "ai_lb_shed_tenant",
                body: b"This tenant holds its share of the pool while others wait: rejected by ai-load-balancer.",
                retry_after_s: SHED_RETRY_AFTER_S,
            },
            Rejection::ShedLatency => LocalReply {
                status: 429,
                details: "ai_lb_shed_latency",
                body: b"No endpoint is predicted to meet this request's latency objectives: sheddable request rejected by ai-load-balancer.",
                retry_after_s: SHED_RETRY_AFTER_S,
            },
            Rejection::Shed => LocalReply {
                status: 429,
                details: "ai_lb_shed",
                body:
                    b"Every endpoint is saturated: sheddable request rejected by ai-load-balancer.",
                retry_after_s: 0,
            },
            // Higress's exact answers (docs/higress-cluster-policies.md §2, §3.3).
            Rejection::HashHeaderMissing => LocalReply {
                status: crate::cluster::hash::MISSING_HEADER_STATUS,
                details: "ai_lb_hash_header_required",
                body: crate::cluster::hash::MISSING_HEADER_BODY.as_bytes(),
                retry_after_s: 0,
            },
            // The PR's answer (`rejectMissingHashKey`).
            Rejection::HashKeyMissing => LocalReply {
                status: crate::cluster::hash::MISSING_HEADER_STATUS,
                details: "ai_lb_hash_key_required",
                body: crate::cluster::hash::MISSING_KEY_BODY.as_bytes(),
                retry_after_s: 0,
            },
            Rejection::ClusterHeaderFailed => LocalReply {
                status: crate::cluster::hash::HEADER_WRITE_FAILED_STATUS,
                details: "ai_lb_cluster_header_failed",
                body: crate::cluster::hash::HEADER_WRITE_FAILED_BODY.as_bytes(),
                retry_after_s: 0,
            },
        }
    }
}

/// The answer under `failureMode: deny`.
pub const DENIED: LocalReply = LocalReply {
    status: 503,
    details: "ai_lb_failure",
    body: b"ai-load-balancer could not pick an endpoint",
    retry_after_s: 0,
};
