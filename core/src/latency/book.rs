//! One route's latency models as a gateway keeps them (docs/latency-model.md §2, §5): each
//! pod's statistics as the fleet last merged them plus this gateway's samples since, the
//! samples not yet sent, and the coefficients the pick reads. Pure: the merge call and its
//! reply are the caller's.

use super::model::{fleet_prior, BadSample, Features, Outcome, PodModel, Prediction, Prior};
use super::model::{Accuracy, TPOT_K, TTFT_K};
use super::stats::{field_count, Stats};

/// Numbers in one pod's merged record: TTFT statistics, then TPOT's.
pub const RECORD_FIELDS: usize = field_count(TTFT_K) + field_count(TPOT_K);
/// The field of the coefficients record a pod without its own reads (the fleet's prior).
pub const FLEET_FIELD: &str = "*";
/// A pod's TTFT predictions are judged (and the model trusted or not) after this many.
pub const MIN_JUDGED: u64 = 20;

/// One route's models, by pod. Lists, not maps: a pool has tens of pods, each looked up once
/// per answer, and a map's code costs the module more than the scans cost in time.
#[derive(Debug, Clone)]
pub struct Book {
    pods: Vec<(String, PodModel)>,
    /// This gateway's samples since its last merge was sent.
    unsent: Vec<(String, PodModel)>,
    base: Prior,
}

/// `pod`'s entry of `list`, added empty if it has none.
fn entry<'a>(list: &'a mut Vec<(String, PodModel)>, pod: &str) -> &'a mut PodModel {
    let i = match list.iter().position(|(p, _)| p == pod) {
        Some(i) => i,
        None => {
            list.push((pod.to_string(), PodModel::default()));
            list.len() - 1
        }
    };
    &mut list[i].1
}

fn get<'a>(list: &'a [(String, PodModel)], pod: &str) -> Option<&'a PodModel> {
    list.iter().find(|(p, _)| p == pod).map(|(_, m)| m)
}

impl Book {
    pub fn new(base: Prior) -> Book {
        Book {
            pods: Vec::new(),
            unsent: Vec::new(),
            base,
        }
    }

    /// The prior each pod is pulled toward: the fleet's pooled fit.
    pub fn prior(&self) -> Prior {
        fleet_prior(self.pods.iter().map(|(_, m)| m), &self.base)
    }

    /// Pod `pod`'s prediction for a request with features `f`.
    pub fn predict(&self, pod: &str, f: &Features) -> Prediction {
        let prior = self.prior();
        match get(&self.pods, pod) {
            Some(m) => m.predict(f, &prior),
            None => PodModel::default().predict(f, &prior),
        }
    }

    /// Learns one answer of `pod`: in the gateway's model at once, and kept for the next merge.
    pub fn learn(&mut self, pod: &str, f: &Features, o: &Outcome) -> Result<(), BadSample> {
        let prior = self.prior();
        entry(&mut self.pods, pod).learn(f, o, &prior)?;
        // The unsent record keeps statistics only; its accuracy is never read.
        entry(&mut self.unsent, pod).learn(f, o, &prior)
    }

    /// Whether any sample waits to be merged.
    pub fn has_unsent(&self) -> bool {
        !self.unsent.is_empty()
    }

    /// The samples to add to the fleet's records, one record per pod ([`RECORD_FIELDS`]
    /// numbers), and forgets them here: the merge's reply brings them back in the fleet's sums.
    pub fn take_unsent(&mut self) -> Vec<(String, Vec<f64>)> {
        self.unsent
            .drain(..)
            .map(|(pod, m)| (pod, record(&m)))
            .collect()
    }

    /// Records a merge took ([`Book::take_unsent`]) that never reached the fleet: kept for the
    /// next merge (added to what was learnt since).
    pub fn restore(&mut self, records: &[(String, Vec<f64>)]) {
        for (pod, fields) in records {
            let Some((ttft, tpot)) = parse_record(fields) else {
                continue;
            };
            let u = entry(&mut self.unsent, pod);
            u.ttft.merge(&ttft);
            u.tpot.merge(&tpot);
        }
    }

    /// The fleet's records as the merge read them back: each pod's statistics become the
    /// merged ones plus this gateway's samples learnt since the merge was sent. A record that
    /// does not parse is skipped; a pod the fleet no longer has a record of keeps its own.
    pub fn merged(&mut self, fleet: &[(String, Vec<f64>)]) {
        for (pod, fields) in fleet {
            let Some((ttft, tpot)) = parse_record(fields) else {
                continue;
            };
            let m = entry(&mut self.pods, pod);
            m.ttft = ttft;
            m.tpot = tpot;
            if let Some(u) = get(&self.unsent, pod) {
                m.ttft.merge(&u.ttft);
                m.tpot.merge(&u.tpot);
            }
        }
    }

    /// Every pod's coefficients and the fleet prior's ([`FLEET_FIELD`]), as the pick script
    /// reads them: TTFT's four then TPOT's three.
    pub fn coefficients(&self) -> Vec<(String, [f64; TTFT_K + TPOT_K])> {
        let prior = self.prior();
        let join = |(a, b): ([f64; TTFT_K], [f64; TPOT_K])| {
            let mut c = [0.0; TTFT_K + TPOT_K];
            c[..TTFT_K].copy_from_slice(&a);
            c[TTFT_K..].copy_from_slice(&b);
            c
        };
        let mut out: Vec<_> = self
            .pods
            .iter()
            .map(|(pod, m)| (pod.clone(), join(m.coefficients(&prior))))
            .collect();
        out.push((FLEET_FIELD.to_string(), join((prior.ttft, prior.tpot))));
        out
    }

    /// The TTFT prediction error of the pods judged at least [`MIN_JUDGED`] times, each pod's
    /// weighed by its judged samples; None before any is.
    pub fn ttft_mape(&self) -> Option<f64> {
        let judged = self
            .pods
            .iter()
            .map(|(_, m)| m.ttft_error)
            .filter(|a| a.samples >= MIN_JUDGED);
        let (sum, n) = judged.fold((0.0, 0.0), |(s, n), a| {
            (s + a.mape * a.samples as f64, n + a.samples as f64)
        });
        (n > 0.0).then(|| sum / n)
    }

    /// Each pod's TTFT and TPOT prediction error (None where not yet judged), by pod.
    pub fn errors(&self) -> Vec<(&str, Option<f64>, Option<f64>)> {
        let of = |a: Accuracy| (a.samples >= MIN_JUDGED).then_some(a.mape);
        self.pods
            .iter()
            .map(|(pod, m)| (pod.as_str(), of(m.ttft_error), of(m.tpot_error)))
            .collect()
    }
}

fn record(m: &PodModel) -> Vec<f64> {
    let mut v = m.ttft.to_fields();
    v.extend(m.tpot.to_fields());
    v
}

fn parse_record(fields: &[f64]) -> Option<(Stats<TTFT_K>, Stats<TPOT_K>)> {
    if fields.len() != RECORD_FIELDS {
        return None;
    }
    let (a, b) = fields.split_at(field_count(TTFT_K));
    Some((Stats::from_fields(a)?, Stats::from_fields(b)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(ahead: f64, uncached: f64, running: f64) -> Features {
        Features {
            ahead_tokens: ahead,
            uncached_tokens: uncached,
            running,
            prompt_tokens: uncached + 500.0,
        }
    }

    /// A pod prefilling at `rate` tokens/s with a 20 ms intercept and 40 ms per token.
    fn answer(rate: f64, x: &Features) -> Outcome {
        Outcome {
            ttft_ms: 20.0 + (x.ahead_tokens + x.uncached_tokens) * 1000.0 / rate,
            tpot_ms: Some(40.0 + x.running),
        }
    }

    #[test]
    fn two_gateways_merging_predict_as_one_that_saw_everything() {
        let base = Prior::from_rates(16_000.0, 30.0, 8.0);
        let (mut a, mut b, mut whole) = (Book::new(base), Book::new(base), Book::new(base));
        for i in 0..60 {
            let x = f(
                f64::from(i % 7) * 900.0,
                f64::from(i % 5) * 700.0,
                f64::from(i % 4),
            );
            let o = answer(4_000.0, &x);
            if i % 2 == 0 { &mut a } else { &mut b }
                .learn("pod-1", &x, &o)
                .unwrap();
            whole.learn("pod-1", &x, &o).unwrap();
        }
        // The fleet's record: both gateways' unsent samples added (what the script does).
        let mut fleet: std::collections::HashMap<String, Vec<f64>> = Default::default();
        for (pod, rec) in a.take_unsent().into_iter().chain(b.take_unsent()) {
            let sum = fleet.entry(pod).or_insert_with(|| vec![0.0; RECORD_FIELDS]);
            for (s, v) in sum.iter_mut().zip(rec) {
                *s += v;
            }
        }
        let fleet: Vec<_> = fleet.into_iter().collect();
        a.merged(&fleet);
        b.merged(&fleet);
        let x = f(3_000.0, 1_000.0, 2.0);
        let want = whole.predict("pod-1", &x);
        for book in [&a, &b] {
            let got = book.predict("pod-1", &x);
            assert!(
                (got.ttft_ms - want.ttft_ms).abs() < 1e-6,
                "{got:?} {want:?}"
            );
            assert!((got.tpot_ms - want.tpot_ms).abs() < 1e-6);
        }
        // 4,000 tokens at 4,000 tokens/s + 20 ms, within the prior's pull (8 of 68 samples).
        assert!((want.ttft_ms - 1_020.0).abs() < 20.0, "{want:?}");
        assert!(!a.has_unsent());
    }

    #[test]
    fn samples_learnt_while_a_merge_is_out_are_kept() {
        let base = Prior::from_rates(16_000.0, 30.0, 8.0);
        let mut a = Book::new(base);
        let x = f(1_000.0, 1_000.0, 1.0);
        a.learn("p", &x, &answer(2_000.0, &x)).unwrap();
        let sent = a.take_unsent();
        a.learn("p", &x, &answer(2_000.0, &x)).unwrap();
        a.merged(&sent);
        let w = |b: &Book| get(&b.pods, "p").unwrap().ttft.weight;
        assert_eq!(w(&a), 2.0, "the merged one and the one learnt since");
        // A record of the wrong size or with a non-finite number changes nothing.
        a.merged(&[("p".into(), vec![1.0; 3])]);
        let mut bad = sent[0].1.clone();
        bad[0] = f64::NAN;
        a.merged(&[("p".into(), bad)]);
        assert_eq!(w(&a), 2.0);
    }

    #[test]
    fn a_new_pod_predicts_as_the_fleet_and_errors_are_judged_after_enough_samples() {
        let base = Prior::from_rates(16_000.0, 30.0, 8.0);
        let mut book = Book::new(base);
        for i in 0..30 {
            let x = f(f64::from(i % 6) * 1_000.0, f64::from(i % 3) * 800.0, 1.0);
            book.learn("slow", &x, &answer(2_000.0, &x)).unwrap();
        }
        let x = f(2_000.0, 2_000.0, 1.0);
        // The fleet's fit, pulled toward the configured rate (250 ms here) by the prior's
        // weight: far nearer the fleet's 2,020 ms than the configured guess.
        let new = book.predict("unseen", &x).ttft_ms;
        assert!((1_600.0..2_100.0).contains(&new), "{new}");
        let c = book.coefficients();
        assert_eq!(c.last().map(|c| c.0.as_str()), Some(FLEET_FIELD));
        let mape = book.ttft_mape().unwrap();
        assert!(mape < 1.0, "{mape}");
        assert_eq!(book.errors()[0].0, "slow");
        assert_eq!(Book::new(base).ttft_mape(), None);
    }
}
