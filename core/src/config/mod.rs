//! Plugin configuration: Higress's `ai-load-balancer` keys (same names, same meaning) plus
//! documented new ones, read once in `on_configure` into typed values. A bad config is
//! rejected there with one error naming the field; it never reaches a request.

mod error;
mod fields;
mod lb;
mod metrics;
mod prefix;
mod rules;

pub use error::ConfigError;
pub use lb::{CostMode, FailureMode, Policy, PolicyConfig, Publish, RedisTarget, RouteConfig};
pub use metrics::{MetricsConfig, MetricsSource, ScrapeConfig};
pub use prefix::PrefixSettings;

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
}
pub use rules::{Matcher, RequestKeys};

use fields::Fields;
use serde_json::{Map, Value};
use std::rc::Rc;

/// Everything `on_configure` produced: the global config and the per-route rules.
#[derive(Debug)]
pub struct PluginConfig {
    pub global: Option<Rc<RouteConfig>>,
    pub rules: Vec<(Matcher, Rc<RouteConfig>)>,
}

impl PluginConfig {
    /// Parses and validates the plugin configuration JSON (Higress envelope included).
    pub fn parse(json: &[u8]) -> Result<PluginConfig, ConfigError> {
        Self::parse_for(json, Build::CURRENT)
    }

    /// [`Self::parse`] for a given build (tests exercise both from one binary).
    pub fn parse_for(json: &[u8], build: Build) -> Result<PluginConfig, ConfigError> {
        let value: Value = serde_json::from_slice(json)
            .map_err(|e| ConfigError::new("", format!("not valid JSON: {e}")))?;
        let Value::Object(top) = value else {
            return Err(ConfigError::new(
                "",
                "the configuration must be a JSON object",
            ));
        };
        let rules = match top.get("_rules_") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => parse_rules(items, build)?,
            Some(_) => {
                return Err(ConfigError::new(
                    "_rules_",
                    "must be an array of rule objects",
                ))
            }
        };
        // Higress sends the global keys beside `_rules_`; a config that is only rules has none.
        let has_global = top.keys().any(|k| !k.starts_with('_'));
        let global = if has_global {
            Some(Rc::new(RouteConfig::parse(&top, build)?))
        } else {
            None
        };
        if global.is_none() && rules.is_empty() {
            return Err(ConfigError::new(
                "lb_policy",
                "missing: no global configuration and no _rules_",
            ));
        }
        Ok(PluginConfig { global, rules })
    }

    /// The config for one request: the first matching rule, else the global config.
    pub fn select(&self, keys: &RequestKeys) -> Option<&Rc<RouteConfig>> {
        self.rules
            .iter()
            .find(|(m, _)| m.matches(keys))
            .map(|(_, c)| c)
            .or(self.global.as_ref())
    }

    /// Every distinct route config (global first), e.g. to initialise each Redis target once.
    pub fn all(&self) -> impl Iterator<Item = &Rc<RouteConfig>> {
        self.global.iter().chain(self.rules.iter().map(|(_, c)| c))
    }

    /// One-line summary for the "config accepted" log: counts and policies, no secrets.
    pub fn summary(&self) -> String {
        let policies: Vec<&str> = self.all().map(|c| c.policy.kind().name()).collect();
        format!(
            "global={} rules={} policies=[{}]",
            self.global.is_some(),
            self.rules.len(),
            policies.join(",")
        )
    }
}

fn parse_rules(
    items: &[Value],
    build: Build,
) -> Result<Vec<(Matcher, Rc<RouteConfig>)>, ConfigError> {
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("_rules_[{i}]");
        let Value::Object(map) = item else {
            return Err(ConfigError::new(at, "must be an object"));
        };
        let matcher = Matcher::parse(map).map_err(|e| e.within(&at))?;
        let config = RouteConfig::parse(map, build).map_err(|e| e.within(&at))?;
        out.push((matcher, Rc::new(config)));
    }
    Ok(out)
}

/// Parses a JSON object's fields with unknown-key detection (shared by the sub-parsers).
pub(crate) fn fields(map: &Map<String, Value>) -> Fields<'_> {
    Fields::new(map)
}

#[cfg(test)]
mod tests;
