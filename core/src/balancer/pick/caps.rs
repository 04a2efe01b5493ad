//! What a request costs its endpoint and the caps it is admitted against (`costMode`,
//! `maxRequestCount`, `maxPoolRequests` with priority classes), shared by the Redis picks and
//! the plain-Envoy counts.

use crate::config::{Class, RouteConfig};

/// What one request adds to its endpoint's load (`costMode`).
pub fn cost_of(config: &RouteConfig, body_bytes: usize) -> u64 {
    match config.common.cost {
        crate::config::CostMode::Requests => 1,
        crate::config::CostMode::Bytes => (body_bytes as u64).max(1),
        crate::config::CostMode::Tokens => {
            (body_bytes as u64 / crate::config::BYTES_PER_TOKEN).max(1)
        }
    }
}

/// The pool load a request of `class` is refused at: `maxPoolRequests` (0 = none), with the
/// class's headroom or reserve as for `maxRequestCount` (docs/sessions-and-queues.md "Priority classes").
pub fn pool_cap(config: &RouteConfig, class: Option<Class>) -> u64 {
    let cap = config.common.max_pool;
    match (&config.common.priority, class) {
        (Some(p), Some(c)) if cap > 0 => p.cap_for(c.rank, cap),
        _ => cap,
    }
}

/// The capacity tenant shares are of: `maxPoolRequests`, else `endpoints` × `maxRequestCount`.
pub fn tenant_capacity(config: &RouteConfig, endpoints: usize) -> u64 {
    match config.common.max_pool {
        0 => config.common.max_load.saturating_mul(endpoints as u64),
        pool => pool,
    }
}

/// The load cap a request of `class` is refused at: `maxRequestCount` (0 = none) without
/// priority classes, else its class's cap (docs/sessions-and-queues.md "Priority classes").
pub fn class_cap(config: &RouteConfig, class: Option<Class>) -> u64 {
    let cap = config.common.max_load;
    match (&config.common.priority, class) {
        (Some(p), Some(c)) if cap > 0 => p.cap_for(c.rank, cap),
        _ => cap,
    }
}
