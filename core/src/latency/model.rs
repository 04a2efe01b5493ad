//! One pod's latency model: TTFT and TPOT as linear functions of what the plugin knows when it
//! places a request, fitted on the pod's own answers with the fleet's fit as the prior
//! (docs/latency-model.md §1, §3).

use super::fit::solve;
use super::stats::Stats;

/// TTFT features: 1, the prompt tokens the pod prefills before this request's first token —
/// those booked ahead of it and its own uncached ones (thousands) — and the requests running on
/// the pod. One lane prefills both at one rate (chunked prefill or not), so one coefficient:
/// two, fitted on the few dozen answers a new pod has, split the rate between them at random
/// (docs/latency-model.md §1).
pub const TTFT_K: usize = 3;
/// TPOT features: 1, requests running on the pod, this request's prompt tokens (thousands).
pub const TPOT_K: usize = 3;

/// What the plugin knows of a pod and a request when it places it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Features {
    pub ahead_tokens: f64,
    pub uncached_tokens: f64,
    pub running: f64,
    pub prompt_tokens: f64,
}

impl Features {
    fn ttft(&self) -> [f64; TTFT_K] {
        [
            1.0,
            (self.ahead_tokens + self.uncached_tokens) / 1000.0,
            self.running,
        ]
    }

    fn tpot(&self) -> [f64; TPOT_K] {
        [1.0, self.running, self.prompt_tokens / 1000.0]
    }

    fn valid(&self) -> bool {
        [
            self.ahead_tokens,
            self.uncached_tokens,
            self.running,
            self.prompt_tokens,
        ]
        .iter()
        .all(|v| v.is_finite() && *v >= 0.0)
    }
}

/// What an answer measured: time to its first byte, and time per output token after it (None
/// when it produced under two tokens).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    pub ttft_ms: f64,
    pub tpot_ms: Option<f64>,
}

/// Longest TTFT and TPOT a sample may report: past them it is a stuck or broken measurement,
/// not a latency to learn.
pub const MAX_TTFT_MS: f64 = 3_600_000.0;
pub const MAX_TPOT_MS: f64 = 60_000.0;

/// A pod's predictions are judged once its own samples weigh this much.
pub const JUDGED_AFTER: f64 = 10.0;

/// Why a sample was not learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadSample {
    /// A feature negative, NaN or infinite.
    Features,
    /// A timing negative, NaN, infinite or past the bounds above.
    Timing,
}

/// A prediction, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    pub ttft_ms: f64,
    pub tpot_ms: f64,
}

/// The coefficients a model starts from (the prior), and how many samples' weight they carry.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prior {
    pub ttft: [f64; TTFT_K],
    pub tpot: [f64; TPOT_K],
    pub strength: f64,
}

impl Prior {
    /// A prior from a prefill rate (tokens/s) and a time per output token: TTFT = the tokens
    /// ahead and this request's, at that rate; TPOT constant.
    pub fn from_rates(prefill_tokens_per_s: f64, tpot_ms: f64, strength: f64) -> Prior {
        let per_k = 1_000_000.0 / prefill_tokens_per_s.max(1.0);
        Prior {
            ttft: [0.0, per_k, 0.0],
            tpot: [tpot_ms.max(0.0), 0.0, 0.0],
            strength,
        }
    }
}

/// Mean absolute percentage error of the predictions made before each sample was learned,
/// as an exponentially weighted mean (each new error weighs `ALPHA`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Accuracy {
    pub mape: f64,
    pub samples: u64,
}

impl Accuracy {
    const ALPHA: f64 = 0.05;

    fn note(&mut self, predicted: f64, measured: f64) {
        if measured <= 0.0 {
            return;
        }
        let ape = ((predicted - measured) / measured).abs().min(10.0);
        self.mape = if self.samples == 0 {
            ape
        } else {
            self.mape + Self::ALPHA * (ape - self.mape)
        };
        self.samples += 1;
    }
}

/// One pod's statistics: its own samples (and, once merged, every gateway's).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodModel {
    pub ttft: Stats<TTFT_K>,
    pub tpot: Stats<TPOT_K>,
    pub ttft_error: Accuracy,
    pub tpot_error: Accuracy,
}

impl PodModel {
    /// Learns one answer; the prediction the model made for it first goes into its accuracy.
    pub fn learn(&mut self, f: &Features, o: &Outcome, prior: &Prior) -> Result<(), BadSample> {
        if !f.valid() {
            return Err(BadSample::Features);
        }
        let ok = |v: f64, max: f64| v.is_finite() && (0.0..=max).contains(&v);
        if !ok(o.ttft_ms, MAX_TTFT_MS) || o.tpot_ms.is_some_and(|t| !ok(t, MAX_TPOT_MS)) {
            return Err(BadSample::Timing);
        }
        // Judged only once the pod's own samples carry its fit: the prior's guesses for a
        // new pod say nothing of how well the model predicts, and would weigh on the mean
        // for a hundred answers.
        let before = self.predict(f, prior);
        if self.ttft.weight >= JUDGED_AFTER {
            self.ttft_error.note(before.ttft_ms, o.ttft_ms);
        }
        self.ttft.add(&f.ttft(), o.ttft_ms, 1.0);
        if let Some(tpot) = o.tpot_ms {
            if self.tpot.weight >= JUDGED_AFTER {
                self.tpot_error.note(before.tpot_ms, tpot);
            }
            self.tpot.add(&f.tpot(), tpot, 1.0);
        }
        Ok(())
    }

    /// The coefficients: the pod's fit pulled toward `prior` (the prior alone with no samples).
    pub fn coefficients(&self, prior: &Prior) -> ([f64; TTFT_K], [f64; TPOT_K]) {
        let ttft = solve(
            &self.ttft.xtx,
            &self.ttft.xty,
            self.ttft.weight,
            &prior.ttft,
            prior.strength,
        );
        let tpot = solve(
            &self.tpot.xtx,
            &self.tpot.xty,
            self.tpot.weight,
            &prior.tpot,
            prior.strength,
        );
        (ttft.unwrap_or(prior.ttft), tpot.unwrap_or(prior.tpot))
    }

    /// Predicted TTFT and TPOT of a request with features `f` (never negative).
    pub fn predict(&self, f: &Features, prior: &Prior) -> Prediction {
        let (ttft, tpot) = self.coefficients(prior);
        Prediction {
            ttft_ms: dot(&ttft, &f.ttft()).max(0.0),
            tpot_ms: dot(&tpot, &f.tpot()).max(0.0),
        }
    }

    /// Forgets by `factor` (0..=1): drift is followed at the pace of the forgetting.
    pub fn decay(&mut self, factor: f64) {
        self.ttft.decay(factor);
        self.tpot.decay(factor);
    }
}

/// The fleet's prior for each pod: every pod's statistics summed and solved against the
/// configured prior, so a pod with no samples of its own predicts as its fleet does.
pub fn fleet_prior<'a>(pods: impl IntoIterator<Item = &'a PodModel>, base: &Prior) -> Prior {
    let mut pooled = PodModel::default();
    for p in pods {
        pooled.ttft.merge(&p.ttft);
        pooled.tpot.merge(&p.tpot);
    }
    let (ttft, tpot) = pooled.coefficients(base);
    Prior {
        ttft,
        tpot,
        strength: base.strength,
    }
}

fn dot<const K: usize>(a: &[f64; K], b: &[f64; K]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
