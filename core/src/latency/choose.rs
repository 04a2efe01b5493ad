//! The placement rule of latency-aware routing (docs/latency-model.md §5), one rule for both
//! builds: prefix_acquire.lua's latency block applies it in Redis (it stays there, atomic with
//! the counts and bookings it reads), [`choose`] in the plain-Envoy pick. The table test below
//! states it case by case; core/tests/redis_latency.rs runs the same table through the script.
//!
//! - A pod's *key* is its predicted TTFT without objectives, else the larger share of either
//!   objective its prediction uses (over 1: missed).
//! - The warm pod (the deepest prefix match), when it may take the request, is kept if it meets
//!   the objectives (key ≤ 1), or, without objectives, if its predicted TTFT is within the
//!   penalty of the best one's.
//! - Else the pod with the lowest key is chosen, ties by the lower load (then the first
//!   listed). With objectives a sheddable request whose best key is over 1 is shed with
//!   probability 1 − 1/key, before anything is taken.

use super::model::Prediction;

/// One pod the request may be placed on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// The pod's position (the caller's numbering).
    pub at: usize,
    pub predicted: Prediction,
    /// Its load before this request (ties go to the lower).
    pub load: u64,
    /// Whether it may take the request (room under the cap, not ejected, not saturated).
    pub eligible: bool,
}

/// The request's side of the rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    /// The request's objectives, ms (0: none).
    pub slo_ttft_ms: u64,
    pub slo_tpot_ms: u64,
    /// How much slower than the best the warm pod may be predicted without objectives (ms).
    pub penalty_ms: u64,
    /// A sheddable request's draw in 0..1 ([`draw`]); None: never shed.
    pub shed_draw: Option<f64>,
}

/// What the rule says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Choice {
    Place(usize, Prediction),
    /// No pod meets the objectives and the draw shed the request (the best pod's prediction).
    Shed(Prediction),
}

/// A draw in 0..1 from a random number, as the script reads its ARGV[6].
pub fn draw(random: u64) -> f64 {
    (random % 1_000_003) as f64 / 1_000_003.0
}

/// The rule over `candidates`; `warm`: the position of the pod holding the request's prefix.
/// None: no candidate may take the request.
pub fn choose(candidates: &[Candidate], warm: Option<usize>, rule: &Rule) -> Option<Choice> {
    let has_slo = rule.slo_ttft_ms > 0 || rule.slo_tpot_ms > 0;
    let key = |p: &Prediction| {
        if !has_slo {
            return p.ttft_ms;
        }
        let share = |v: f64, slo: u64| if slo > 0 { v / slo as f64 } else { 0.0 };
        share(p.ttft_ms, rule.slo_ttft_ms).max(share(p.tpot_ms, rule.slo_tpot_ms))
    };
    let mut best: Option<(&Candidate, f64)> = None;
    for c in candidates.iter().filter(|c| c.eligible) {
        let k = key(&c.predicted);
        let better = match best {
            None => true,
            Some((b, bk)) => k < bk || (k == bk && c.load < b.load),
        };
        if better {
            best = Some((c, k));
        }
    }
    let (best, best_key) = best?;
    let warm = candidates.iter().find(|c| c.eligible && Some(c.at) == warm);
    if let Some(w) = warm {
        let kept = match has_slo {
            true => key(&w.predicted) <= 1.0,
            false => w.predicted.ttft_ms - best.predicted.ttft_ms <= rule.penalty_ms as f64,
        };
        if kept {
            return Some(Choice::Place(w.at, w.predicted));
        }
    }
    if let (true, Some(r)) = (has_slo && best_key > 1.0, rule.shed_draw) {
        if r < 1.0 - 1.0 / best_key {
            return Some(Choice::Shed(best.predicted));
        }
    }
    Some(Choice::Place(best.at, best.predicted))
}

#[cfg(test)]
#[path = "choose_cases.rs"]
mod cases;

#[cfg(test)]
mod tests {
    use super::cases::{Want, CASES};
    use super::*;

    #[test]
    fn the_rule_case_by_case() {
        for case in CASES {
            let candidates: Vec<Candidate> = case
                .pods
                .iter()
                .enumerate()
                .map(|(at, &(ttft_ms, tpot_ms, load, eligible))| Candidate {
                    at,
                    predicted: Prediction { ttft_ms, tpot_ms },
                    load,
                    eligible,
                })
                .collect();
            let rule = Rule {
                slo_ttft_ms: case.slo.0,
                slo_tpot_ms: case.slo.1,
                penalty_ms: case.penalty_ms,
                shed_draw: case.shed_draw,
            };
            let got = match choose(&candidates, case.warm, &rule) {
                Some(Choice::Place(at, _)) => Want::Place(at),
                Some(Choice::Shed(_)) => Want::Shed,
                None => Want::Nothing,
            };
            assert_eq!(got, case.want, "{}", case.says);
        }
    }

    #[test]
    fn the_draw_is_the_scripts() {
        assert_eq!(draw(0), 0.0);
        assert_eq!(draw(1_000_003), 0.0);
        assert!((draw(500_001) - 0.5).abs() < 1e-6);
        assert!(draw(u64::MAX) < 1.0);
    }
}
