//! The pool-wide cap and tenant fairness (ours, strict; docs/sessions-and-queues.md "Tenant fairness"):
//! `maxPoolRequests` caps the route's in-flight load summed over every endpoint; a request's
//! tenant comes from `tenantHeader`, and while another tenant is active no tenant holds more
//! than its share (`tenantShares`, else `defaultTenantShare`) of the pool's capacity. A
//! tenant stays active for `tenantWindow` ms after its last request. An option of
//! global_least_request and prefix_cache (docs/redis-data-model.md §11).

use super::error::ConfigError;
use super::raw::RawLbConfig;
use super::read::Reader;
use std::collections::BTreeMap;

pub const FAIRNESS_KEYS: &[&str] = &[
    "maxPoolRequests",
    "tenantHeader",
    "tenantShares",
    "defaultTenantShare",
    "tenantWindow",
];
pub const DEFAULT_TENANT_SHARE: f64 = 0.5;
pub const DEFAULT_TENANT_WINDOW_MS: u64 = 10_000;
/// At most this many named shares: each is a string compare per request.
pub const MAX_TENANT_SHARES: usize = 256;

/// The route's tenant settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Fairness {
    /// Lower-case header name.
    pub header: String,
    /// Named tenants' shares of the pool capacity, in (0, 1].
    pub shares: BTreeMap<String, f64>,
    pub default_share: f64,
    /// How long a tenant counts as active after its last request (ms).
    pub window_ms: u64,
}

/// `maxPoolRequests` (0 = none) and the tenant settings.
pub(super) fn read(
    raw: &RawLbConfig,
    r: &mut Reader<'_>,
) -> Result<(u64, Option<Fairness>), ConfigError> {
    let pool = r.own("maxPoolRequests", &raw.max_pool_requests)?;
    if pool == Some(0) {
        return Err(r.err(
            "maxPoolRequests",
            "must be at least 1 (leave it out for no pool cap)",
        ));
    }
    let header = r.own("tenantHeader", &raw.tenant_header)?;
    let shares = r.own("tenantShares", &raw.tenant_shares)?;
    let default = r.own("defaultTenantShare", &raw.default_tenant_share)?;
    let window = r.own("tenantWindow", &raw.tenant_window)?;
    let Some(header) = header else {
        for (key, set) in [
            ("tenantShares", shares.is_some()),
            ("defaultTenantShare", default.is_some()),
            ("tenantWindow", window.is_some()),
        ] {
            if set {
                return Err(r.err(key, "needs `tenantHeader` (tenant fairness is off)"));
            }
        }
        return Ok((pool.unwrap_or(0), None));
    };
    // The header name itself is checked by the caller (common.rs, with the other headers).
    let valid = |s: f64| s.is_finite() && s > 0.0 && s <= 1.0;
    let default_share = default.unwrap_or(DEFAULT_TENANT_SHARE);
    if !valid(default_share) {
        return Err(r.err(
            "defaultTenantShare",
            "must be a fraction of the pool in (0, 1]",
        ));
    }
    let shares = shares.unwrap_or_default();
    if shares.len() > MAX_TENANT_SHARES {
        return Err(r.err(
            "tenantShares",
            format!("at most {MAX_TENANT_SHARES} named tenants"),
        ));
    }
    for (name, share) in &shares {
        if name.is_empty() {
            return Err(r.err("tenantShares", "an empty tenant name (empty = no tenant)"));
        }
        if !valid(*share) {
            return Err(r.err(
                &format!("tenantShares.{name}"),
                "must be a fraction of the pool in (0, 1]",
            ));
        }
    }
    let window_ms = window.unwrap_or(DEFAULT_TENANT_WINDOW_MS);
    if !(100..=3_600_000).contains(&window_ms) {
        return Err(r.err(
            "tenantWindow",
            format!("{window_ms} ms is outside 100-3600000"),
        ));
    }
    Ok((
        pool.unwrap_or(0),
        Some(Fairness {
            header: header.to_ascii_lowercase(),
            shares,
            default_share,
            window_ms,
        }),
    ))
}

/// A request's tenant: its id (16 hex digits of the SHA-1 of the name, so any value — 10 KB,
/// unicode, binary — is a short fixed-size Redis field) and its share.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    pub id: String,
    pub share: f64,
}

impl Fairness {
    /// The tenant of a request whose `tenantHeader` is `value` (raw bytes as the host gives
    /// them). A repeated header (values joined by `,`) is the tenant of its first value, so
    /// repeating the header never moves a request to another tenant; an empty value (or
    /// none) is no tenant: not counted and never refused for fairness.
    pub fn tenant_of(&self, value: Option<&[u8]>) -> Option<Tenant> {
        let name = Fairness::name_of(value?)?;
        let share = std::str::from_utf8(name)
            .ok()
            .and_then(|n| self.shares.get(n).copied())
            .unwrap_or(self.default_share);
        Some(Tenant {
            id: tenant_id(name),
            share,
        })
    }

    /// The tenant name a `tenantHeader` value gives: its first value (a repeated header is
    /// joined by `,`), surrounding spaces trimmed; None when that is empty (no tenant). Raw
    /// bytes, never decoded: priority ceilings (priority.rs) read the tenant through this too.
    pub fn name_of(value: &[u8]) -> Option<&[u8]> {
        let first = value.split(|&b| b == b',').next().unwrap_or_default();
        let name = first.trim_ascii();
        (!name.is_empty()).then_some(name)
    }

    /// The most a tenant of `share` may hold while another tenant is active, out of the
    /// pool's `capacity` (at least 1, so every tenant is always admitted somewhere).
    pub fn limit(share: f64, capacity: u64) -> u64 {
        ((share * capacity as f64).floor() as u64).max(1)
    }
}

pub fn tenant_id(name: &[u8]) -> String {
    use sha1::{Digest, Sha1};
    let digest = Sha1::digest(name);
    hex::encode(&digest[..8])
}
