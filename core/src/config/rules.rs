//! Higress's per-route envelope: `_rules_` entries with `_match_route_`,
//! `_match_route_prefix_`, `_match_domain_` and `_match_service_` (docs/higress-abi.md §11).
//! Rules are tried in order, the first match wins, then the global config applies.

use super::ConfigError;
use serde_json::{Map, Value};

/// What a request is matched on.
#[derive(Debug, Clone, Default)]
pub struct RequestKeys<'a> {
    pub route: Option<&'a str>,
    pub cluster: Option<&'a str>,
    /// `:authority`, port included; it is stripped for matching.
    pub authority: Option<&'a str>,
}

/// One rule's match conditions. Every category present must match (Go's route+service rules).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Matcher {
    routes: Vec<String>,
    route_prefixes: Vec<String>,
    domains: Vec<String>,
    services: Vec<String>,
}

impl Matcher {
    pub fn parse(map: &Map<String, Value>) -> Result<Matcher, ConfigError> {
        let m = Matcher {
            routes: strings(map, "_match_route_")?,
            route_prefixes: strings(map, "_match_route_prefix_")?,
            domains: strings(map, "_match_domain_")?,
            services: strings(map, "_match_service_")?,
        };
        if m.routes.is_empty()
            && m.route_prefixes.is_empty()
            && m.domains.is_empty()
            && m.services.is_empty()
        {
            return Err(ConfigError::new(
                "",
                "a rule needs _match_route_, _match_route_prefix_, _match_domain_ or _match_service_",
            ));
        }
        Ok(m)
    }

    pub fn matches(&self, keys: &RequestKeys) -> bool {
        let route = keys.route.unwrap_or("");
        (self.routes.is_empty() || self.routes.iter().any(|r| r == route))
            && (self.route_prefixes.is_empty()
                || self
                    .route_prefixes
                    .iter()
                    .any(|p| route.starts_with(p.as_str())))
            && (self.domains.is_empty()
                || self
                    .domains
                    .iter()
                    .any(|d| domain_matches(d, keys.authority)))
            && (self.services.is_empty()
                || self
                    .services
                    .iter()
                    .any(|s| service_matches(s, keys.cluster)))
    }
}

fn strings(map: &Map<String, Value>, key: &str) -> Result<Vec<String>, ConfigError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) if !s.is_empty() => Ok(s.clone()),
                _ => Err(ConfigError::new(
                    format!("{key}[{i}]"),
                    "must be a non-empty string",
                )),
            })
            .collect(),
        Some(_) => Err(ConfigError::new(key, "must be an array of strings")),
    }
}

/// `*.example.com` matches by suffix, `api.*` by prefix, anything else exactly; the port of
/// `:authority` is ignored (as Higress's matcher does).
fn domain_matches(pattern: &str, authority: Option<&str>) -> bool {
    let Some(authority) = authority else {
        return false;
    };
    let host = strip_port(authority);
    if let Some(suffix) = pattern.strip_prefix('*') {
        host.ends_with(suffix)
    } else if let Some(prefix) = pattern.strip_suffix('*') {
        host.starts_with(prefix)
    } else {
        host.eq_ignore_ascii_case(pattern)
    }
}

fn strip_port(authority: &str) -> &str {
    if authority.starts_with('[') {
        // [v6]:port
        return authority
            .split_once(']')
            .map_or(authority, |(h, _)| &h[1..]);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

/// Cluster names look like `outbound|8000||llm.static`: `fqdn` matches part 4, `fqdn:port`
/// matches parts 4 and 2.
fn service_matches(pattern: &str, cluster: Option<&str>) -> bool {
    let Some(cluster) = cluster else {
        return false;
    };
    let parts: Vec<&str> = cluster.split('|').collect();
    let [_, port, _, fqdn] = parts.as_slice() else {
        return false;
    };
    match pattern.rsplit_once(':') {
        Some((p_fqdn, p_port)) => p_fqdn == *fqdn && p_port == *port,
        None => pattern == *fqdn,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn matcher(v: Value) -> Matcher {
        Matcher::parse(v.as_object().unwrap()).unwrap()
    }

    fn keys<'a>(route: &'a str, cluster: &'a str, authority: &'a str) -> RequestKeys<'a> {
        RequestKeys {
            route: Some(route),
            cluster: Some(cluster),
            authority: Some(authority),
        }
    }

    #[test]
    fn matches_each_category() {
        let c = "outbound|8000||llm.default.svc.cluster.local";
        let k = keys("default/chat", c, "api.example.com:443");
        assert!(matcher(json!({"_match_route_": ["x", "default/chat"]})).matches(&k));
        assert!(!matcher(json!({"_match_route_": ["default/cha"]})).matches(&k));
        assert!(matcher(json!({"_match_route_prefix_": ["default/"]})).matches(&k));
        assert!(matcher(json!({"_match_domain_": ["*.example.com"]})).matches(&k));
        assert!(matcher(json!({"_match_domain_": ["api.*"]})).matches(&k));
        assert!(matcher(json!({"_match_domain_": ["api.example.com"]})).matches(&k));
        assert!(!matcher(json!({"_match_domain_": ["example.com"]})).matches(&k));
        assert!(matcher(json!({"_match_service_": ["llm.default.svc.cluster.local"]})).matches(&k));
        assert!(
            matcher(json!({"_match_service_": ["llm.default.svc.cluster.local:8000"]})).matches(&k)
        );
        assert!(
            !matcher(json!({"_match_service_": ["llm.default.svc.cluster.local:9000"]}))
                .matches(&k)
        );
        // Both categories present: both must match.
        assert!(
            !matcher(json!({"_match_route_": ["default/chat"], "_match_service_": ["other"]}))
                .matches(&k)
        );
        assert!(!matcher(json!({"_match_service_": ["llm"]})).matches(&keys(
            "r",
            "not-a-cluster-name",
            "h"
        )));
    }

    #[test]
    fn strips_ports_including_ipv6() {
        assert_eq!(strip_port("a.b:80"), "a.b");
        assert_eq!(strip_port("a.b"), "a.b");
        assert_eq!(strip_port("[::1]:80"), "::1");
    }

    #[test]
    fn rejects_bad_match_lists() {
        for (v, path) in [
            (json!({}), ""),
            (json!({"_match_route_": "r"}), "_match_route_"),
            (json!({"_match_route_": [1]}), "_match_route_[0]"),
            (json!({"_match_domain_": [""]}), "_match_domain_[0]"),
        ] {
            let err = Matcher::parse(v.as_object().unwrap()).unwrap_err();
            assert_eq!(err.path, path, "{err}");
        }
    }
}
