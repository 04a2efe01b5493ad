//! A request's latency objectives: `x-slo-ttft-ms` and `x-slo-tpot-ms` (llm-d's header names,
//! ../shared/spec/anchors.md "predicted latency"), else the route's `latencyModel` defaults.

use crate::config::latency::{LatencySettings, MAX_SLO_TPOT_MS, MAX_SLO_TTFT_MS};

pub const TTFT_HEADER: &str = "x-slo-ttft-ms";
pub const TPOT_HEADER: &str = "x-slo-tpot-ms";

/// A request's objectives (0: none), and whether a header was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Objectives {
    pub ttft_ms: u64,
    pub tpot_ms: u64,
    pub refused: bool,
}

/// An objective header's value: milliseconds, whole or not (llm-d's clients send either),
/// within `1..=max`. None: not a number in range (negative, NaN, zero, absurd).
pub fn parse(value: &str, max: u64) -> Option<u64> {
    let v: f64 = value.trim().parse().ok()?;
    (v.is_finite() && v >= 1.0 && v <= max as f64).then(|| v.round() as u64)
}

/// The objectives of a request whose headers read `ttft` and `tpot` (None: absent). A header
/// that does not read as an objective gives way to the route's default, and is reported.
pub fn of(settings: &LatencySettings, ttft: Option<&str>, tpot: Option<&str>) -> Objectives {
    let mut refused = false;
    let mut pick = |header: Option<&str>, max: u64, default: u64| match header {
        None => default,
        Some(v) => parse(v, max).unwrap_or_else(|| {
            refused = true;
            default
        }),
    };
    let ttft_ms = pick(ttft, MAX_SLO_TTFT_MS, settings.slo_ttft_ms);
    let tpot_ms = pick(tpot, MAX_SLO_TPOT_MS, settings.slo_tpot_ms);
    Objectives {
        ttft_ms,
        tpot_ms,
        refused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_override_the_route_and_bad_ones_give_way_to_it() {
        let s = LatencySettings {
            slo_ttft_ms: 2_000,
            slo_tpot_ms: 0,
            ..LatencySettings::default()
        };
        let o = of(&s, None, None);
        assert_eq!((o.ttft_ms, o.tpot_ms, o.refused), (2_000, 0, false));
        let o = of(&s, Some(" 500 "), Some("40.4"));
        assert_eq!((o.ttft_ms, o.tpot_ms, o.refused), (500, 40, false));
        for bad in ["-5", "NaN", "inf", "0", "abc", "", "1e300", "99999999999"] {
            let o = of(&s, Some(bad), Some(bad));
            assert_eq!((o.ttft_ms, o.tpot_ms, o.refused), (2_000, 0, true), "{bad}");
        }
        assert_eq!(parse("3600000", MAX_SLO_TTFT_MS), Some(3_600_000));
        assert_eq!(parse("60001", MAX_SLO_TPOT_MS), None);
    }
}
