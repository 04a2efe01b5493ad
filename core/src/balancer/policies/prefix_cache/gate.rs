//! The token gate's rule in the plain-Envoy build, over this proxy's bookings
//! (docs/redis-data-model.md §13; the Redis build's is prefix_acquire.lua's, the same rule):
//! a match must cover `affinityThreshold` of the prompt, and the warm endpoint's estimated
//! TTFT may exceed the best cold endpoint's by at most `maxTTFTPenaltyMs`.

use crate::balancer::policies::least_request::prefill::Prefill;
use crate::config::{PrefillRate, TokenGate};

/// What the gate says of a request's known endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    /// The match covers too little of the prompt to prefer its endpoint.
    NotSticky,
    /// The warm endpoint is saturated: this cold one is expected to answer sooner by more than
    /// the penalty.
    Spill(usize),
}

/// `prompt` tokens of which `cached` are held by endpoint `warm`; `open(e)`: endpoint `e` may
/// take the request (room, not saturated, not down).
pub fn judge(
    gate: &TokenGate,
    prompt: u64,
    cached: u64,
    warm: usize,
    prefill: &Prefill,
    open: impl Fn(usize) -> bool,
) -> Verdict {
    if (cached as f64) < gate.threshold * prompt as f64 {
        return Verdict::NotSticky;
    }
    let eta_ms = |e: usize, uncached: u64| {
        let rate = match gate.rate {
            PrefillRate::Fixed(r) => r,
            PrefillRate::Learned => prefill
                .rates
                .get(e)
                .copied()
                .filter(|&r| r > 0)
                .unwrap_or(gate.start_rate()),
        };
        let booked = prefill.booked.get(e).copied().unwrap_or(0);
        booked.saturating_add(uncached).saturating_mul(1000) / rate.max(1)
    };
    let warm_eta = eta_ms(warm, prompt.saturating_sub(cached));
    if warm_eta <= gate.penalty_ms {
        return Verdict::Keep; // no cold endpoint can be faster by more
    }
    let best = (0..prefill.booked.len())
        .filter(|&e| e != warm && open(e))
        .map(|e| (eta_ms(e, prompt), e))
        .min();
    match best {
        Some((cold_eta, e)) if warm_eta - cold_eta.min(warm_eta) > gate.penalty_ms => {
            Verdict::Spill(e)
        }
        _ => Verdict::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(threshold: f64, penalty_ms: u64, rate: PrefillRate) -> TokenGate {
        TokenGate {
            threshold,
            penalty_ms,
            rate,
        }
    }

    fn prefill(booked: &[u64], rates: &[u64]) -> Prefill {
        Prefill {
            booked: booked.to_vec(),
            rates: rates.to_vec(),
        }
    }

    #[test]
    fn the_warm_endpoint_is_kept_until_the_penalty() {
        let g = gate(0.0, 500, PrefillRate::Fixed(10_000));
        let all = |_| true;
        // Warm (0): 4,000 + 1,000 = 500 ms: kept without looking further.
        assert_eq!(
            judge(&g, 9_000, 8_000, 0, &prefill(&[4_000, 0, 0], &[]), all),
            Verdict::Keep
        );
        // 20,000 + 1,000 = 2,100 ms against 900 ms cold: spill to the faster cold one.
        let p = prefill(&[20_000, 8_000, 0], &[]);
        assert_eq!(judge(&g, 9_000, 8_000, 0, &p, all), Verdict::Spill(2));
        // The best cold one cannot take it: the next is 1,700 ms, within the penalty.
        assert_eq!(judge(&g, 9_000, 8_000, 0, &p, |e| e != 2), Verdict::Keep);
        assert_eq!(
            judge(&g, 9_000, 8_000, 0, &p, |e| e == 0),
            Verdict::Keep,
            "no cold one"
        );
    }

    #[test]
    fn a_short_match_is_not_sticky_and_rates_are_per_endpoint() {
        let g = gate(0.8, 500, PrefillRate::Learned);
        let p = prefill(&[0, 0], &[0, 0]);
        assert_eq!(judge(&g, 3_000, 2_000, 0, &p, |_| true), Verdict::NotSticky);
        // Learned: the warm endpoint at 1,000 tokens/s takes 1,000 ms for 1,000 tokens; the
        // cold one at the 16,000 start rate 563 ms for 9,000: within 500? No: 437 ms. Kept.
        let p = prefill(&[0, 0], &[1_000, 0]);
        assert_eq!(judge(&g, 9_000, 8_000, 0, &p, |_| true), Verdict::Keep);
        let p = prefill(&[0, 0], &[500, 0]);
        assert_eq!(judge(&g, 9_000, 8_000, 0, &p, |_| true), Verdict::Spill(1));
    }
}
