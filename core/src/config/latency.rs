//! prefix_cache's latency-aware placement, `latencyModel` (ours, strict; docs/latency-model.md
//! §5, docs/configuration.md): every request goes to the pod predicted to answer it soonest
//! within the route's TTFT / TPOT objectives, from per-pod models learnt on every answer and
//! merged across gateways. Absent: the token gate decides (config/gate.rs).

use super::error::ConfigError;
use super::raw::RawLbConfig;
use super::read::Reader;
use super::values::Build;
use serde_json::Value;

/// The keys of `latencyModel` (any other is refused).
pub const LATENCY_KEYS: &[&str] = &[
    "sloTTFTMs",
    "sloTPOTMs",
    "mergeIntervalMs",
    "maxMAPE",
    "halfLifeS",
    "priorTPOTMs",
];

/// A route's latency-aware placement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencySettings {
    /// The route's objectives for a request that names none (`x-slo-ttft-ms`,
    /// `x-slo-tpot-ms`); 0: none.
    pub slo_ttft_ms: u64,
    pub slo_tpot_ms: u64,
    /// How often a gateway adds its samples to the fleet's and reads the fleet's back.
    pub merge_interval_ms: u64,
    /// Past this mean absolute percentage error of its TTFT predictions, a gateway places by
    /// the token gate instead, until its model predicts well again.
    pub max_mape: f64,
    /// Samples weigh half as much after this long (a pod that changed speed is followed).
    pub half_life_ms: u64,
    /// The TPOT a pod with no samples anywhere is predicted at.
    pub prior_tpot_ms: f64,
}

impl Default for LatencySettings {
    fn default() -> Self {
        LatencySettings {
            slo_ttft_ms: 0,
            slo_tpot_ms: 0,
            merge_interval_ms: 1_000,
            max_mape: 0.5,
            half_life_ms: 600_000,
            prior_tpot_ms: 30.0,
        }
    }
}

/// The largest objectives a request or a route may name (an hour to first token, a minute per
/// token): past them a value is a mistake, not an objective.
pub const MAX_SLO_TTFT_MS: u64 = 3_600_000;
pub const MAX_SLO_TPOT_MS: u64 = 60_000;

impl LatencySettings {
    pub fn read(
        raw: &RawLbConfig,
        r: &Reader<'_>,
        build: Build,
    ) -> Result<Option<LatencySettings>, ConfigError> {
        let Some(l) = r.own("latencyModel", &raw.latency_model)? else {
            return Ok(None);
        };
        if build == Build::Envoy {
            return Err(r.err(
                "latencyModel",
                "only in the Higress build so far (its models merge through Redis)",
            ));
        }
        // Read by hand, not by a derived Deserialize: six keys do not earn a visitor's wasm
        // (config/raw.rs).
        let Value::Object(l) = l else {
            return Err(r.err("latencyModel", "must be an object"));
        };
        if let Some(k) = l.keys().find(|k| !LATENCY_KEYS.contains(&k.as_str())) {
            return Err(r.err(
                "latencyModel",
                format!("unknown key `{k}` ({})", LATENCY_KEYS.join(", ")),
            ));
        }
        let int = |key: &str| -> Result<Option<u64>, ConfigError> {
            match l.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                    r.err("latencyModel", format!("{key}: must be a whole number ≥ 0"))
                }),
            }
        };
        let float = |key: &str| -> Result<Option<f64>, ConfigError> {
            match l.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| r.err("latencyModel", format!("{key}: must be a number"))),
            }
        };
        let d = LatencySettings::default();
        let bad = |key: &str, msg: String| r.err("latencyModel", format!("{key}: {msg}"));
        let check =
            |key: &str, v: Option<u64>, range: std::ops::RangeInclusive<u64>, or: u64| match v {
                None => Ok(or),
                Some(v) if range.contains(&v) => Ok(v),
                Some(v) => Err(bad(
                    key,
                    format!("{v} is outside {}-{}", range.start(), range.end()),
                )),
            };
        let slo_ttft_ms = check("sloTTFTMs", int("sloTTFTMs")?, 0..=MAX_SLO_TTFT_MS, 0)?;
        let slo_tpot_ms = check("sloTPOTMs", int("sloTPOTMs")?, 0..=MAX_SLO_TPOT_MS, 0)?;
        let merge_interval_ms = check(
            "mergeIntervalMs",
            int("mergeIntervalMs")?,
            100..=60_000,
            d.merge_interval_ms,
        )?;
        let half_life_s = check("halfLifeS", int("halfLifeS")?, 10..=86_400, 600)?;
        let max_mape = float("maxMAPE")?.unwrap_or(d.max_mape);
        if !(0.01..=10.0).contains(&max_mape) {
            return Err(bad("maxMAPE", format!("{max_mape} is outside 0.01-10")));
        }
        let prior_tpot_ms = float("priorTPOTMs")?.unwrap_or(d.prior_tpot_ms);
        if !(0.0..=MAX_SLO_TPOT_MS as f64).contains(&prior_tpot_ms) {
            return Err(bad(
                "priorTPOTMs",
                format!("{prior_tpot_ms} is outside 0-60000"),
            ));
        }
        Ok(Some(LatencySettings {
            slo_ttft_ms,
            slo_tpot_ms,
            merge_interval_ms,
            max_mape,
            half_life_ms: half_life_s * 1000,
            prior_tpot_ms,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::warning::Warnings;
    use serde_json::json;

    fn read(lb: serde_json::Value) -> Result<Option<LatencySettings>, ConfigError> {
        let raw = RawLbConfig::from_value(&lb);
        let mut warnings = Warnings::default();
        let r = Reader::new("lb_config", &mut warnings);
        LatencySettings::read(&raw, &r, Build::Higress)
    }

    #[test]
    fn absent_is_off_and_empty_is_the_defaults() {
        assert_eq!(read(json!({})).unwrap(), None);
        assert_eq!(read(json!({"latencyModel": null})).unwrap(), None);
        assert_eq!(
            read(json!({"latencyModel": {}})).unwrap(),
            Some(LatencySettings::default())
        );
        let s = read(json!({"latencyModel": {"sloTTFTMs": 2000, "sloTPOTMs": 50,
            "mergeIntervalMs": 500, "maxMAPE": 0.3, "halfLifeS": 60, "priorTPOTMs": 25.5}}))
        .unwrap()
        .unwrap();
        assert_eq!(s.slo_ttft_ms, 2000);
        assert_eq!(s.slo_tpot_ms, 50);
        assert_eq!(s.merge_interval_ms, 500);
        assert_eq!(s.max_mape, 0.3);
        assert_eq!(s.half_life_ms, 60_000);
        assert_eq!(s.prior_tpot_ms, 25.5);
    }

    #[test]
    fn bad_values_and_unknown_keys_name_their_field() {
        for (lb, want) in [
            (
                json!({"latencyModel": {"sloTTFTMs": -1}}),
                "sloTTFTMs: must be a whole number",
            ),
            (
                json!({"latencyModel": {"sloTTFTMs": 3600001}}),
                "sloTTFTMs: 3600001 is outside 0-3600000",
            ),
            (
                json!({"latencyModel": {"mergeIntervalMs": 5}}),
                "mergeIntervalMs: 5 is outside 100-60000",
            ),
            (
                json!({"latencyModel": {"maxMAPE": 0}}),
                "maxMAPE: 0 is outside 0.01-10",
            ),
            (
                json!({"latencyModel": {"sloTtftMs": 5}}),
                "unknown key `sloTtftMs`",
            ),
            (
                json!({"latencyModel": true}),
                "latencyModel: must be an object",
            ),
        ] {
            let e = read(lb.clone()).unwrap_err().to_string();
            assert!(e.contains(want), "{lb}: {e}");
        }
    }
}
