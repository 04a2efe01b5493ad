use super::model::TTFT_K;
use super::model::{fleet_prior, BadSample, Features, Outcome, PodModel, Prior};
use super::stats::{field_count, Stats};

/// A pod prefilling `rate` tokens/s after a fixed `base` ms, slowed 2 ms per running request,
/// decoding at `tpot` ms per token plus 0.5 ms per running request.
fn truth(f: &Features, rate: f64, base: f64, tpot: f64) -> Outcome {
    Outcome {
        ttft_ms: base + (f.ahead_tokens + f.uncached_tokens) * 1000.0 / rate + 2.0 * f.running,
        tpot_ms: Some(tpot + 0.5 * f.running),
    }
}

/// Deterministic spread-out features (a small LCG).
fn features(n: usize, seed: u64) -> Vec<Features> {
    let mut s = seed;
    let mut next = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as f64 / (1u64 << 31) as f64
    };
    (0..n)
        .map(|_| Features {
            ahead_tokens: (next() * 20_000.0).floor(),
            uncached_tokens: (next() * 8_000.0).floor(),
            running: (next() * 16.0).floor(),
            prompt_tokens: (next() * 30_000.0).floor(),
        })
        .collect()
}

fn prior() -> Prior {
    Prior::from_rates(5_000.0, 20.0, 1.0)
}

#[test]
fn a_pod_is_learnt_within_two_percent_from_1000_answers() {
    let mut m = PodModel::default();
    for f in features(1000, 1) {
        m.learn(&f, &truth(&f, 12_000.0, 40.0, 8.0), &prior())
            .unwrap();
    }
    for f in features(50, 2) {
        let want = truth(&f, 12_000.0, 40.0, 8.0);
        let got = m.predict(&f, &prior());
        assert!(
            (got.ttft_ms - want.ttft_ms).abs() <= 0.02 * want.ttft_ms,
            "{got:?} {want:?}"
        );
        let tpot = want.tpot_ms.unwrap();
        assert!((got.tpot_ms - tpot).abs() <= 0.02 * tpot, "{got:?} {tpot}");
    }
    assert!(m.ttft_error.mape < 0.05, "{:?}", m.ttft_error);
}

#[test]
fn two_gpu_speeds_are_each_predicted_by_their_own_model() {
    let (mut fast, mut slow) = (PodModel::default(), PodModel::default());
    for f in features(1000, 3) {
        fast.learn(&f, &truth(&f, 20_000.0, 30.0, 6.0), &prior())
            .unwrap();
        slow.learn(&f, &truth(&f, 5_000.0, 60.0, 15.0), &prior())
            .unwrap();
    }
    let f = Features {
        ahead_tokens: 10_000.0,
        uncached_tokens: 2_000.0,
        running: 4.0,
        prompt_tokens: 3_000.0,
    };
    let (pf, ps) = (fast.predict(&f, &prior()), slow.predict(&f, &prior()));
    assert!((pf.ttft_ms - 638.0).abs() < 7.0, "{pf:?}");
    assert!((ps.ttft_ms - 2468.0).abs() < 25.0, "{ps:?}");
}

#[test]
fn a_pod_without_samples_predicts_as_its_fleet_does() {
    let mut pods = vec![PodModel::default(), PodModel::default()];
    for f in features(200, 4) {
        for p in pods.iter_mut() {
            p.learn(&f, &truth(&f, 10_000.0, 50.0, 10.0), &prior())
                .unwrap();
        }
    }
    let fleet = fleet_prior(&pods, &prior());
    let new = PodModel::default();
    let f = features(1, 5)[0];
    let want = truth(&f, 10_000.0, 50.0, 10.0).ttft_ms;
    let got = new.predict(&f, &fleet).ttft_ms;
    assert!((got - want).abs() <= 0.02 * want, "{got} {want}");
    // Without a fleet: the configured rate.
    let cold = new.predict(&f, &prior()).ttft_ms;
    let want = (f.ahead_tokens + f.uncached_tokens) * 1000.0 / 5_000.0;
    assert!((cold - want).abs() < 1e-6, "{cold} {want}");
}

#[test]
fn merged_statistics_fit_as_the_pooled_samples_do() {
    let (mut a, mut b, mut all) = (
        PodModel::default(),
        PodModel::default(),
        PodModel::default(),
    );
    for (i, f) in features(120, 6).iter().enumerate() {
        let o = truth(f, 8_000.0, 20.0, 9.0);
        if i % 2 == 0 {
            a.learn(f, &o, &prior()).unwrap()
        } else {
            b.learn(f, &o, &prior()).unwrap()
        }
        all.learn(f, &o, &prior()).unwrap();
    }
    let mut merged = a.ttft.clone();
    merged.merge(&b.ttft);
    let back = Stats::<TTFT_K>::from_fields(&merged.to_fields()).unwrap();
    assert_eq!(back.to_fields().len(), field_count(TTFT_K));
    for (x, y) in back.to_fields().iter().zip(all.ttft.to_fields()) {
        assert!((x - y).abs() <= 1e-6 * y.abs().max(1.0), "{x} {y}");
    }
}

#[test]
fn forgetting_follows_a_pod_whose_speed_changed() {
    let mut m = PodModel::default();
    for f in features(300, 7) {
        m.learn(&f, &truth(&f, 20_000.0, 30.0, 6.0), &prior())
            .unwrap();
    }
    // The model is swapped for a 4x slower one; old samples fade.
    for (i, f) in features(300, 8).iter().enumerate() {
        if i % 10 == 0 {
            m.decay(0.5);
        }
        m.learn(f, &truth(f, 5_000.0, 30.0, 6.0), &prior()).unwrap();
    }
    let f = features(1, 9)[0];
    let want = truth(&f, 5_000.0, 30.0, 6.0).ttft_ms;
    let got = m.predict(&f, &prior()).ttft_ms;
    assert!((got - want).abs() <= 0.03 * want, "{got} {want}");
}

#[test]
fn bad_samples_are_refused_and_change_nothing() {
    let mut m = PodModel::default();
    let f = features(1, 10)[0];
    let ok = truth(&f, 10_000.0, 10.0, 5.0);
    for bad in [f64::NAN, -1.0, f64::INFINITY, 4_000_000.0] {
        let o = Outcome { ttft_ms: bad, ..ok };
        assert_eq!(m.learn(&f, &o, &prior()), Err(BadSample::Timing));
        let o = Outcome {
            tpot_ms: Some(bad),
            ..ok
        };
        assert_eq!(m.learn(&f, &o, &prior()), Err(BadSample::Timing));
    }
    let nan = Features {
        running: f64::NAN,
        ..f
    };
    assert_eq!(m.learn(&nan, &ok, &prior()), Err(BadSample::Features));
    let neg = Features {
        ahead_tokens: -5.0,
        ..f
    };
    assert_eq!(m.learn(&neg, &ok, &prior()), Err(BadSample::Features));
    assert_eq!(m, PodModel::default());
    assert!(Stats::<4>::from_fields(&[1.0, f64::NAN]).is_none());
    let mut fields = Stats::<3>::default().to_fields();
    fields[0] = f64::NAN;
    assert!(Stats::<3>::from_fields(&fields).is_none());
}
