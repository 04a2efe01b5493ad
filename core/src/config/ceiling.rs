//! Priority ceilings (ours, strict; docs/sessions-and-queues.md "Priority ceilings"): the
//! highest class each tenant may use (`priorityCeilings`) and the ceiling of every other caller
//! (`defaultPriorityCeiling`: no tenant, or a tenant not named). The tenant is `tenantHeader`'s,
//! read as tenant fairness reads it (`Fairness::name_of`), so a class is earned by who the
//! gateway's auth says the caller is, not claimed by the caller's own `priorityHeader`.

use super::error::ConfigError;
use super::raw::RawLbConfig;
use super::read::Reader;
use std::collections::BTreeMap;

pub const CEILING_KEYS: &[&str] = &["priorityCeilings", "defaultPriorityCeiling"];
/// At most this many named ceilings (as `tenantShares`): one map lookup per request.
pub const MAX_PRIORITY_CEILINGS: usize = 256;

/// The route's ceilings, as class ranks (0 = highest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ceilings {
    /// Named tenants' ceilings, keyed by the tenant name exactly as `tenantHeader` gives it.
    pub tenants: BTreeMap<String, usize>,
    /// The ceiling of a caller without a tenant or with a tenant not named.
    pub default: usize,
}

impl Ceilings {
    /// The ceilings of a route whose classes are `classes` (lower-case, highest first) and
    /// whose default class is `default_rank`: None when neither key is given. Without
    /// `defaultPriorityCeiling` an unnamed caller's ceiling is the default class, so naming
    /// one tenant's ceiling never leaves the others free to claim the highest class.
    pub(super) fn read(
        raw: &RawLbConfig,
        r: &mut Reader<'_>,
        classes: &[String],
        default_rank: usize,
    ) -> Result<Option<Ceilings>, ConfigError> {
        let named = r.own("priorityCeilings", &raw.priority_ceilings)?;
        let default = r.own("defaultPriorityCeiling", &raw.default_priority_ceiling)?;
        let key = match (&named, &default) {
            (None, None) => return Ok(None),
            (Some(_), _) => "priorityCeilings",
            (None, Some(_)) => "defaultPriorityCeiling",
        };
        if r.own("tenantHeader", &raw.tenant_header)?.is_none() {
            return Err(r.err(
                key,
                "needs `tenantHeader` (the tenant a ceiling is bound to)",
            ));
        }
        let rank_of = |key: &str, class: &str| {
            let c = class.trim().to_ascii_lowercase();
            classes.iter().position(|k| *k == c).ok_or_else(|| {
                r.err(
                    key,
                    format!("`{}` is not one of `priorityClasses`", class.trim()),
                )
            })
        };
        let default = match default {
            Some(class) => rank_of("defaultPriorityCeiling", &class)?,
            None => default_rank,
        };
        let named = named.unwrap_or_default();
        if named.len() > MAX_PRIORITY_CEILINGS {
            return Err(r.err(
                "priorityCeilings",
                format!("at most {MAX_PRIORITY_CEILINGS} named tenants"),
            ));
        }
        let mut tenants = BTreeMap::new();
        for (name, class) in named {
            if name.is_empty() {
                return Err(r.err(
                    "priorityCeilings",
                    "an empty tenant name (a request without a tenant gets `defaultPriorityCeiling`)",
                ));
            }
            // The header's first value, trimmed, is the tenant: such a name would never match.
            if name.contains(',') || name.trim() != name {
                return Err(r.err(
                    &format!("priorityCeilings.{name}"),
                    "a tenant name with ',' or surrounding spaces never matches (`tenantHeader` is read up to its first ',', trimmed)",
                ));
            }
            let rank = rank_of(&format!("priorityCeilings.{name}"), &class)?;
            tenants.insert(name, rank);
        }
        Ok(Some(Ceilings { tenants, default }))
    }

    /// The ceiling of a caller whose tenant name is `tenant` (None: no tenant), with the name
    /// when it is one of `priorityCeilings` (the config's own text, so safe to log). Names are
    /// matched exactly, as `tenantShares`; a name that is not UTF-8 is named nowhere.
    pub fn of(&self, tenant: Option<&[u8]>) -> (usize, Option<&str>) {
        let named = tenant
            .and_then(|t| std::str::from_utf8(t).ok())
            .and_then(|t| self.tenants.get_key_value(t));
        match named {
            Some((name, rank)) => (*rank, Some(name.as_str())),
            None => (self.default, None),
        }
    }
}
