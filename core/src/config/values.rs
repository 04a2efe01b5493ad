//! The small value types a compiled route config is made of (cost mode, failure mode, the
//! Redis target and its secret, how the choice is published). Leaves: the policy modules and
//! [`super::types`] both use them, and they use nothing of the config.

use std::fmt;

/// What one request adds to its endpoint's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CostMode {
    /// 1 per request (Higress's behaviour).
    Requests,
    /// The request body's size in bytes.
    Bytes,
    /// An estimate of prompt tokens: body bytes / [`BYTES_PER_TOKEN`], at least 1.
    Tokens,
}

pub use crate::prefix::BYTES_PER_TOKEN;

/// What happens when the plugin cannot decide (Redis down, no healthy host, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// Let the cluster's own load balancer pick (fail open; Higress's behaviour).
    Allow,
    /// Answer 503.
    Deny,
}

/// A secret that never prints.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(pub(super) String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "\"***\"" })
    }
}

/// The Redis service, reached through an Envoy cluster named like Higress does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisTarget {
    /// `outbound|<port>||<fqdn>`: the name `proxy_redis_call` takes.
    pub cluster: String,
    /// The cluster name plus init parameters (`?db=N`, flush settings) for `proxy_redis_init`.
    pub init_cluster: String,
    pub username: String,
    pub password: Secret,
    pub timeout_ms: u32,
    /// The `database` index; a negative one (which Higress passes on as is, see
    /// `init_cluster`) reads as 0 here.
    pub database: u32,
}

/// How the choice reaches the router.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Publish {
    /// Higress: `proxy_set_upstream_override_host`.
    OverrideHost,
    /// Plain Envoy: an `ip:port[,ip:port]` request header for the `override_host` LB policy,
    /// with up to `fallbacks` further endpoints after the choice.
    Header { name: String, fallbacks: usize },
    /// Cluster policies, both builds: the chosen Envoy cluster's name in this request header,
    /// read by the route's `cluster_header` action (Higress's `cluster_header`).
    ClusterHeader { name: String },
}

/// Where endpoint metrics come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsSource {
    /// The `metrics` field of Higress's upstream host list (its active health check body).
    Host,
    /// The plugin's own scraper (HTTP callouts from the root context on a tick).
    Scrape,
}

/// Which artifact the config is for: the keys and defaults differ slightly (README).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    Higress,
    Envoy,
}

impl Build {
    /// The build this code was compiled as.
    pub const CURRENT: Build = if cfg!(feature = "envoy") {
        Build::Envoy
    } else {
        Build::Higress
    };

    /// Whether this module carries code that only `build`'s configs reach: each wasm leaves
    /// out the other build's latency placement (the Redis script's or the per-proxy pick's,
    /// which no config of this build can ask for), so it stays under its 1 MiB guard; native
    /// tests carry both (they run both builds' configs). Checked where the code is reached,
    /// so the optimiser drops what is never called.
    pub const fn has(build: Build) -> bool {
        cfg!(test)
            || matches!(
                (build, Build::CURRENT),
                (Build::Higress, Build::Higress) | (Build::Envoy, Build::Envoy)
            )
    }

    pub fn name(self) -> &'static str {
        match self {
            Build::Higress => "Higress",
            Build::Envoy => "plain-Envoy",
        }
    }
}
