//! Plugin configuration: Higress's `ai-load-balancer` contract (same keys, read as its Go plugin
//! reads them) plus documented new keys, compiled once in `on_configure`. Two steps:
//!
//! 1. [`raw`]: serde structs mirroring the JSON; they never fail on a value.
//! 2. `TryFrom<In<Raw…>> for Typed…` (route.rs and one module per policy): Higress's keys are
//!    read through Go's coercions ([`go`]), with a [`Warning`] wherever that was lenient; our
//!    own keys are strict. Errors are [`ConfigError`]s naming the field path, never a secret.
//!
//! [`envelope`] applies Higress's wrapper rules for the global config and `_rules_`. README
//! "Configuration compatibility" is the user-facing account; `tools/check-config` runs this
//! parser on a file.

mod ceiling;
mod cluster_hash;
mod cluster_metrics;
mod common;
mod data_parallel;
mod document;
mod ejection;
mod envelope;
mod error;
mod fairness;
mod gate;
mod go;
mod hash_key;
mod inflight;
mod json;
pub mod latency;
mod metrics;
mod prefix;
mod priority;
mod queue;
mod raw;
mod read;
mod redis;
mod route;
mod route_cluster;
mod rules;
mod scrape;
mod session;
mod types;
mod values;
mod warning;

pub use ceiling::{Ceilings, CEILING_KEYS};
pub use cluster_hash::{ClusterHashConfig, WeightedCluster, DEFAULT_HASH_HEADER};
pub use cluster_metrics::{
    ClusterMetricsConfig, ClusterMode, MissingMetrics, DEFAULT_CLUSTER_HEADER,
};
pub use common::DEFAULT_DESTINATION_HEADER;
pub use data_parallel::{DataParallel, RankIn, DP_KEYS, RANK_HEADER};
pub use document::{plugin_configs, wasm_plugin, Delivered};
pub use ejection::{Ejection, EJECTION_KEYS};
pub use error::{ConfigError, ErrorKind};
pub use fairness::{tenant_id, Fairness, Tenant, FAIRNESS_KEYS};
pub use gate::{PrefillRate, TokenGate, DEFAULT_PREFILL_RATE};
pub use hash_key::{HashKey, DEFAULT_KEY_MAX_BODY_BYTES};
pub use inflight::{GlobalInflight, DEFAULT_INFLIGHT_KEY_PREFIX};
pub use metrics::{MetricsConfig, MetricsSource, DEFAULT_CRITICALITY_HEADER};
pub use prefix::PrefixSettings;
pub use priority::{Class, Priority};
pub use queue::{Queue, DEFAULT_MAX_QUEUED};
pub use rules::{Matcher, RequestKeys};

/// Every `lb_config` key the parser reads, with its Rust type as written in raw.rs (`Go` for
/// Higress's leniently read keys, `Own<T>` for this plugin's strict ones).
pub const LB_CONFIG_KEYS: &[(&str, &str)] = raw::RawLbConfig::TYPES;
pub use scrape::ScrapeConfig;
pub use session::{
    AgentSessions, BodyField, SessionConfig, DEFAULT_SESSION_TTL_S, SESSION_MAX_IMBALANCE,
    SESSION_MAX_IMBALANCE_RATIO,
};
pub use types::{
    CostMode, FailureMode, Policy, PolicyConfig, Publish, RedisTarget, RouteConfig, Secret,
};
pub use values::{Build, BYTES_PER_TOKEN};
pub use warning::Warning;

use std::rc::Rc;

/// Everything `on_configure` produced: the global config and the per-route rules.
#[derive(Debug)]
pub struct PluginConfig {
    pub global: Option<Rc<RouteConfig>>,
    pub rules: Vec<(Matcher, Rc<RouteConfig>)>,
}

/// An accepted config and what was assumed while reading it (log each warning once).
#[derive(Debug)]
pub struct Parsed {
    pub config: PluginConfig,
    pub warnings: Vec<Warning>,
}

/// Parses and validates the plugin configuration JSON (Higress envelope included).
pub fn parse(json: &[u8], build: Build) -> Result<Parsed, ConfigError> {
    let mut warnings = warning::Warnings::default();
    let (global, rules) = envelope::read(json, build, &mut warnings)?;
    Ok(Parsed {
        config: PluginConfig {
            global: global.map(Rc::new),
            rules: rules.into_iter().map(|(m, c)| (m, Rc::new(c))).collect(),
        },
        warnings: warnings.into_vec(),
    })
}

impl PluginConfig {
    /// [`parse`] for this build, dropping the warnings (callers that log them use [`parse`]).
    pub fn parse(json: &[u8]) -> Result<PluginConfig, ConfigError> {
        Self::parse_for(json, Build::CURRENT)
    }

    /// [`Self::parse`] for a given build (tests exercise both from one binary).
    pub fn parse_for(json: &[u8], build: Build) -> Result<PluginConfig, ConfigError> {
        parse(json, build).map(|p| p.config)
    }

    /// Whether serving a request needs its route, cluster and `:authority`: to match rules,
    /// for the route keys of a global endpoint policy, or for AdaptiveScore's global in-flight
    /// key (named after the route). Any other config that is only a global cluster policy needs
    /// none of them.
    pub fn needs_request_names(&self) -> bool {
        !self.rules.is_empty()
            || self
                .global
                .as_ref()
                .is_some_and(|g| !g.policy.is_cluster() || g.policy.global_inflight().is_some())
    }

    /// Whether matching a request to its rule reads its `:authority`: only a `_match_domain_`
    /// rule does, so a config without one reads the route and cluster names alone.
    pub fn matches_domains(&self) -> bool {
        self.rules.iter().any(|(m, _)| m.reads_authority())
    }

    /// Whether matching a request to its rule reads its `cluster_name`: only a
    /// `_match_service_` rule does. Otherwise only an endpoint policy's route keys need it,
    /// once its config is chosen.
    pub fn matches_services(&self) -> bool {
        self.rules.iter().any(|(m, _)| m.reads_cluster())
    }

    /// The config for one request: the first matching rule, else the global config.
    pub fn select(&self, keys: &RequestKeys) -> Option<&Rc<RouteConfig>> {
        self.matching(keys)
    }

    /// [`Self::select`] as the config's position among [`Self::routes`] (global first).
    pub fn select_position(&self, keys: &RequestKeys) -> Option<usize> {
        let rules = usize::from(self.global.is_some());
        match self.rules.iter().position(|(m, _)| m.matches(keys)) {
            Some(i) => Some(rules + i),
            None => self.global.as_ref().map(|_| 0),
        }
    }

    /// The config Higress would apply to one request (the same as [`Self::select`]).
    pub fn matching(&self, keys: &RequestKeys) -> Option<&Rc<RouteConfig>> {
        self.rules
            .iter()
            .find(|(m, _)| m.matches(keys))
            .map(|(_, c)| c)
            .or(self.global.as_ref())
    }

    /// Every route config (global first), e.g. to initialise each Redis target once.
    pub fn all(&self) -> impl Iterator<Item = &Rc<RouteConfig>> {
        self.routes()
    }

    /// Every route config, global first.
    pub fn routes(&self) -> impl Iterator<Item = &Rc<RouteConfig>> {
        self.global.iter().chain(self.rules.iter().map(|(_, c)| c))
    }

    /// One-line summary for the "config accepted" log: counts and policies, no secrets.
    pub fn summary(&self) -> String {
        let policies: Vec<&str> = self.routes().map(|c| c.policy.name()).collect();
        format!(
            "global={} rules={} policies=[{}]",
            self.global.is_some(),
            self.rules.len(),
            policies.join(",")
        )
    }
}

#[cfg(test)]
mod ceiling_tests;
#[cfg(test)]
mod leniency_tests;
#[cfg(test)]
mod open_pr_tests;
#[cfg(test)]
mod tests;
