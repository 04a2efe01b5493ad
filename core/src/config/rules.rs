//! Higress's per-route envelope: `_rules_` entries with `_match_route_`,
//! `_match_route_prefix_`, `_match_domain_` and `_match_service_`, read and matched as the
//! wasm-go SDK's rule matcher does. Each list is read with gjson `Array()` (a single string is
//! a one-item list); route, prefix and service lists drop empty strings, the domain list keeps
//! them. A rule has one category: route (with service: both must match), else domain, else
//! service, else route prefix; lists of lower categories are then ignored. Rules are tried in
//! order, the first match wins, then the global config applies (docs/higress-abi.md §11).

use super::error::ConfigError;
use super::go::{Field, Go};
use super::raw::RawRoute;
use super::read::Reader;

/// What a request is matched on.
#[derive(Debug, Clone, Default)]
pub struct RequestKeys<'a> {
    pub route: Option<&'a str>,
    pub cluster: Option<&'a str>,
    /// `:authority`, port included; it is stripped for matching.
    pub authority: Option<&'a str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Category {
    Route,
    RouteAndService,
    Domain,
    Service,
    RoutePrefix,
}

/// One rule's match conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matcher {
    category: Category,
    routes: Vec<String>,
    route_prefixes: Vec<String>,
    domains: Vec<String>,
    services: Vec<String>,
}

impl Matcher {
    /// Reads a rule's match lists; a rule without any is refused, which refuses the whole
    /// config (as in Higress).
    pub fn read(raw: &RawRoute, r: &mut Reader<'_>) -> Result<Matcher, ConfigError> {
        let routes = list(r, "_match_route_", &raw.match_route, false);
        let route_prefixes = list(r, "_match_route_prefix_", &raw.match_route_prefix, false);
        let domains = list(r, "_match_domain_", &raw.match_domain, true);
        let services = list(r, "_match_service_", &raw.match_service, false);
        let category = match (
            !routes.is_empty(),
            !domains.is_empty(),
            !services.is_empty(),
            !route_prefixes.is_empty(),
        ) {
            (true, _, true, _) => Category::RouteAndService,
            (true, _, false, _) => Category::Route,
            (false, true, _, _) => Category::Domain,
            (false, false, true, _) => Category::Service,
            (false, false, false, true) => Category::RoutePrefix,
            (false, false, false, false) => {
                return Err(r.err_higress(
                    "",
                    "a rule needs _match_route_, _match_route_prefix_, _match_domain_ or _match_service_ (Higress: there is at least one of '_match_route_', '_match_domain_', '_match_service_' and '_match_route_prefix_' can present in configuration.)",
                ))
            }
        };
        let m = Matcher {
            category,
            routes,
            route_prefixes,
            domains,
            services,
        };
        m.warn_ignored_lists(r);
        Ok(m)
    }

    /// Lists the rule's category makes Higress ignore.
    fn warn_ignored_lists(&self, r: &mut Reader<'_>) {
        let by = match self.category {
            Category::Route | Category::RouteAndService => "_match_route_",
            Category::Domain => "_match_domain_",
            Category::Service => "_match_service_",
            Category::RoutePrefix => return,
        };
        let ignored = [
            (
                "_match_domain_",
                !self.domains.is_empty() && by == "_match_route_",
            ),
            (
                "_match_service_",
                !self.services.is_empty() && by == "_match_domain_",
            ),
            ("_match_route_prefix_", !self.route_prefixes.is_empty()),
        ];
        for (key, set) in ignored {
            if set {
                r.warn(
                    key,
                    format!("ignored: a rule with {by} matches on that only (as in Higress)"),
                );
            }
        }
    }

    /// Whether this rule matches on the request's `:authority` (a `_match_domain_` rule; the
    /// other categories never read it).
    pub fn reads_authority(&self) -> bool {
        self.category == Category::Domain
    }

    /// Whether this rule matches on the request's `cluster_name` (a `_match_service_` rule).
    pub fn reads_cluster(&self) -> bool {
        matches!(self.category, Category::Service | Category::RouteAndService)
    }

    pub fn matches(&self, keys: &RequestKeys) -> bool {
        let route = keys.route.unwrap_or("");
        match self.category {
            Category::Route => self.routes.iter().any(|r| r == route),
            Category::RouteAndService => {
                self.routes.iter().any(|r| r == route) && self.service_matches(keys.cluster)
            }
            Category::Domain => {
                let host = strip_port(keys.authority.unwrap_or(""));
                self.domains.iter().any(|d| domain_matches(d, host))
            }
            Category::Service => self.service_matches(keys.cluster),
            Category::RoutePrefix => self
                .route_prefixes
                .iter()
                .any(|p| route.starts_with(p.as_str())),
        }
    }

    /// Cluster names look like `outbound|8000||llm.static`: `fqdn` matches part 4, `fqdn:port`
    /// matches parts 4 and 2.
    fn service_matches(&self, cluster: Option<&str>) -> bool {
        let parts: Vec<&str> = cluster.unwrap_or("").split('|').collect();
        let [_, port, _, fqdn] = parts.as_slice() else {
            return false;
        };
        self.services.iter().any(|s| match s.rsplit_once(':') {
            Some((f, p)) if f == *fqdn && p == *port => true,
            _ => s == fqdn,
        })
    }
}

/// A match list as gjson reads it: items as strings, deduplicated (Go keeps sets), empty
/// strings dropped except for domains.
fn list(r: &mut Reader<'_>, key: &str, v: &Field<Go>, keep_empty: bool) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (n, item) in r.list(key, v).unwrap_or_default().into_iter().enumerate() {
        let s = r
            .string(&format!("{key}[{n}]"), &Field(Some(item)))
            .unwrap_or_default();
        if s.is_empty() && !keep_empty {
            r.warn(&format!("{key}[{n}]"), "empty: dropped (as in Higress)");
        } else if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// `*x` matches by suffix, `x*` by prefix, anything else exactly (case-sensitive, as Go).
fn domain_matches(pattern: &str, host: &str) -> bool {
    if let Some(suffix) = pattern.strip_prefix('*') {
        host.ends_with(suffix)
    } else if let Some(prefix) = pattern.strip_suffix('*') {
        host.starts_with(prefix)
    } else {
        host == pattern
    }
}

/// Go's `stripPortFromHost`: drop what follows the last ':' unless it is inside `[v6]`.
fn strip_port(authority: &str) -> &str {
    match authority.rfind(':') {
        Some(colon) if authority.rfind(']').is_none_or(|b| b < colon) => &authority[..colon],
        _ => authority,
    }
}

#[cfg(test)]
mod tests;
