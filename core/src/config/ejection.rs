//! Failure memory (docs/redis-data-model.md §14, docs/configuration.md): after
//! `ejectAfterFailures` failed answers in a row (a 5xx; a 4xx is the client's) an endpoint is
//! ejected — no pick chooses it while another is left — for `ejectionMs`, doubled at each
//! ejection up to `maxEjectionMs`; then `halfOpenTrials` requests try it, and one answer brings
//! it back. At most `maxEjectedPercent` of the pool (at least one endpoint) is out at once. A
//! failed request's count stays on its endpoint for `failurePenaltyMs`, so a pod that fails
//! fast does not look idle meanwhile. Ours, strict; global_least_request and prefix_cache, in
//! both builds (per proxy in the plain-Envoy build: docs/plain-envoy.md "Failure memory").

use super::error::ConfigError;
use super::raw::RawLbConfig;
use super::read::Reader;

pub const EJECTION_KEYS: &[&str] = &[
    "ejectAfterFailures",
    "ejectionMs",
    "maxEjectionMs",
    "maxEjectedPercent",
    "halfOpenTrials",
    "failurePenaltyMs",
];
/// Envoy's outlier detection ejects after 5 consecutive 5xx (`consecutive_5xx`).
pub const DEFAULT_EJECT_AFTER: u64 = 5;
pub const DEFAULT_EJECTION_MS: u64 = 30_000;
pub const DEFAULT_MAX_EJECTION_MS: u64 = 300_000;
pub const DEFAULT_MAX_EJECTED_PERCENT: u64 = 50;
pub const DEFAULT_HALF_OPEN_TRIALS: u64 = 1;
pub const DEFAULT_FAILURE_PENALTY_MS: u64 = 1_000;
const MAX_MS: u64 = 3_600_000;

/// A route's failure memory; `eject_after` 0: off (nothing learned, nothing ejected).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ejection {
    pub eject_after: u64,
    pub ejection_ms: u64,
    pub max_ejection_ms: u64,
    pub max_ejected_percent: u64,
    pub half_open_trials: u64,
    pub failure_penalty_ms: u64,
}

impl Ejection {
    /// What a route without the keys gets: on, with the defaults.
    pub const DEFAULT: Ejection = Ejection {
        eject_after: DEFAULT_EJECT_AFTER,
        ejection_ms: DEFAULT_EJECTION_MS,
        max_ejection_ms: DEFAULT_MAX_EJECTION_MS,
        max_ejected_percent: DEFAULT_MAX_EJECTED_PERCENT,
        half_open_trials: DEFAULT_HALF_OPEN_TRIALS,
        failure_penalty_ms: DEFAULT_FAILURE_PENALTY_MS,
    };

    /// Off: what cluster policies and endpoint_metrics get.
    pub const OFF: Ejection = Ejection {
        eject_after: 0,
        ..Ejection::DEFAULT
    };

    pub fn on(&self) -> bool {
        self.eject_after > 0
    }

    /// How many requests an endpoint on trial takes (what the acquire scripts are sent; 0 off).
    pub fn trials(&self) -> u64 {
        if self.on() {
            self.half_open_trials
        } else {
            0
        }
    }

    /// The route's failure memory, on by default in both builds: across gateways in Redis in
    /// the Higress build, per proxy in the plain-Envoy build (docs/plain-envoy.md "Failure
    /// memory"); the keys mean the same in both.
    pub(super) fn read(raw: &RawLbConfig, r: &mut Reader<'_>) -> Result<Ejection, ConfigError> {
        let eject_after = r.own("ejectAfterFailures", &raw.eject_after_failures)?;
        let ejection_ms = r.own("ejectionMs", &raw.ejection_ms)?;
        let max_ejection_ms = r.own("maxEjectionMs", &raw.max_ejection_ms)?;
        let percent = r.own("maxEjectedPercent", &raw.max_ejected_percent)?;
        let trials = r.own("halfOpenTrials", &raw.half_open_trials)?;
        let penalty = r.own("failurePenaltyMs", &raw.failure_penalty_ms)?;
        let e = Ejection {
            eject_after: within(
                r,
                "ejectAfterFailures",
                eject_after,
                DEFAULT_EJECT_AFTER,
                (0, 1000),
            )?,
            ejection_ms: within(
                r,
                "ejectionMs",
                ejection_ms,
                DEFAULT_EJECTION_MS,
                (100, MAX_MS),
            )?,
            max_ejection_ms: within(
                r,
                "maxEjectionMs",
                max_ejection_ms,
                DEFAULT_MAX_EJECTION_MS.max(ejection_ms.unwrap_or(0)),
                (100, MAX_MS),
            )?,
            max_ejected_percent: within(
                r,
                "maxEjectedPercent",
                percent,
                DEFAULT_MAX_EJECTED_PERCENT,
                (1, 100),
            )?,
            half_open_trials: within(
                r,
                "halfOpenTrials",
                trials,
                DEFAULT_HALF_OPEN_TRIALS,
                (1, 100),
            )?,
            failure_penalty_ms: within(
                r,
                "failurePenaltyMs",
                penalty,
                DEFAULT_FAILURE_PENALTY_MS,
                (0, 60_000),
            )?,
        };
        if e.max_ejection_ms < e.ejection_ms {
            return Err(r.err("maxEjectionMs", "must not be below `ejectionMs`"));
        }
        Ok(e)
    }
}

/// `value` (or `default` when absent) when within `lo..=hi`; else a config error naming `key`.
fn within(
    r: &Reader<'_>,
    key: &'static str,
    value: Option<u64>,
    default: u64,
    (lo, hi): (u64, u64),
) -> Result<u64, ConfigError> {
    let v = value.unwrap_or(default);
    if (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(r.err(key, format!("{v} is outside {lo}-{hi}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse, Build, PluginConfig};
    use serde_json::json;

    fn route(build: Build, policy: &str, extra: serde_json::Value) -> Result<Ejection, String> {
        let mut lb = json!({"serviceFQDN": "redis.static", "servicePort": 6379});
        if build == Build::Envoy {
            lb = json!({"endpoints": ["10.0.0.1:80"]});
        }
        if let (Some(a), serde_json::Value::Object(b)) = (lb.as_object_mut(), extra) {
            a.extend(b);
        }
        let cfg = json!({"lb_policy": policy, "lb_config": lb}).to_string();
        let parsed = parse(cfg.as_bytes(), build).map_err(|e| e.to_string())?;
        let config: PluginConfig = parsed.config;
        let global = config.all().next().ok_or("no route")?;
        Ok(global.common.ejection)
    }

    #[test]
    fn on_by_default_for_the_least_request_policies_in_both_builds() {
        for build in [Build::Higress, Build::Envoy] {
            for policy in ["global_least_request", "prefix_cache"] {
                assert_eq!(route(build, policy, json!({})), Ok(Ejection::DEFAULT));
            }
        }
        let metrics = json!({"serviceFQDN": "redis.static", "servicePort": 6379});
        let em = route(Build::Higress, "endpoint_metrics", metrics).unwrap();
        assert!(!em.on());
        let em = route(
            Build::Envoy,
            "endpoint_metrics",
            json!({"scrapeCluster": "ailb_scrape"}),
        )
        .unwrap();
        assert!(!em.on());
        let e = route(
            Build::Higress,
            "prefix_cache",
            json!({"ejectAfterFailures": 0}),
        )
        .unwrap();
        assert_eq!((e.on(), e.trials()), (false, 0));
    }

    #[test]
    fn the_keys_are_read_and_bad_values_name_their_key() {
        let e = route(
            Build::Higress,
            "global_least_request",
            json!({"ejectAfterFailures": 2, "ejectionMs": 500, "maxEjectionMs": 500,
                   "maxEjectedPercent": 100, "halfOpenTrials": 3, "failurePenaltyMs": 0}),
        )
        .unwrap();
        assert_eq!(
            e,
            Ejection {
                eject_after: 2,
                ejection_ms: 500,
                max_ejection_ms: 500,
                max_ejected_percent: 100,
                half_open_trials: 3,
                failure_penalty_ms: 0,
            }
        );
        let bad = |extra: serde_json::Value| {
            route(Build::Higress, "prefix_cache", extra).expect_err("refused")
        };
        assert!(bad(json!({"ejectAfterFailures": -1})).contains("ejectAfterFailures"));
        assert!(bad(json!({"ejectAfterFailures": "5"})).contains("ejectAfterFailures"));
        assert!(bad(json!({"ejectionMs": 10})).contains("ejectionMs"));
        assert!(bad(json!({"maxEjectedPercent": 0})).contains("maxEjectedPercent"));
        assert!(bad(json!({"halfOpenTrials": 0})).contains("halfOpenTrials"));
        assert!(bad(json!({"failurePenaltyMs": 60001})).contains("failurePenaltyMs"));
        assert!(bad(json!({"ejectionMs": 9000, "maxEjectionMs": 8000})).contains("maxEjectionMs"));
        // A longer first ejection raises the default cap with it.
        let e = route(
            Build::Higress,
            "prefix_cache",
            json!({"ejectionMs": 600000}),
        )
        .unwrap();
        assert_eq!(e.max_ejection_ms, 600_000);
        // The plain-Envoy build reads them alike, as strictly.
        let envoy = route(
            Build::Envoy,
            "global_least_request",
            json!({"ejectAfterFailures": 3, "halfOpenTrials": 2}),
        )
        .unwrap();
        assert_eq!((envoy.eject_after, envoy.half_open_trials), (3, 2));
        for bad in [
            json!({"ejectAfterFailures": "3"}),
            json!({"maxEjectedPercent": 101}),
        ] {
            assert!(route(Build::Envoy, "prefix_cache", bad).is_err());
        }
        let metrics = json!({"serviceFQDN": "redis.static", "servicePort": 6379,
            "ejectAfterFailures": 3});
        // Like every key of another policy: read by none, warned as ignored.
        assert!(!route(Build::Higress, "endpoint_metrics", metrics)
            .unwrap()
            .on());
    }
}
