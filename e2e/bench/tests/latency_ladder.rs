//! The predicted-latency ladder's generator (ailb_bench::trace::latency_ladder) draws what
//! llm-d's workload states: sizes of the stated mean, within their clamps, stages at their
//! rates, conversations that start with their group's system prompt and stay within the
//! context, and the same workload for the same seed.

use ailb_bench::trace::latency_ladder::{latency_ladder, LatencyLadder, Sizes};
use ailb_fakepod::rng::Rng;

/// E[min(max(X, 1), max)] of the lognormal `s.dist()` describes, by a trapezoid sum over the
/// log of the size: the mean the clamped draws must have (the clamp at 131,072 takes about a
/// tenth off the questions' 729).
fn clamped_mean(s: &Sizes) -> f64 {
    let cv2 = (s.sd / s.mean).powi(2);
    let (mu, sigma) = ((s.mean / (1.0 + cv2).sqrt()).ln(), (1.0 + cv2).ln().sqrt());
    let (lo, hi, n) = (mu - 12.0 * sigma, mu + 12.0 * sigma, 200_000);
    let dy = (hi - lo) / n as f64;
    (0..=n)
        .map(|i| {
            let y = lo + i as f64 * dy;
            let density = (-0.5 * ((y - mu) / sigma).powi(2)).exp()
                / (sigma * (2.0 * std::f64::consts::PI).sqrt());
            let w = if i == 0 || i == n { 0.5 } else { 1.0 };
            w * y.exp().clamp(1.0, s.max as f64) * density * dy
        })
        .sum()
}

#[test]
fn sizes_have_the_stated_mean_within_their_clamps() {
    let shape = LatencyLadder::default();
    for (name, s, seed) in [("question", shape.question, 1), ("output", shape.output, 2)] {
        let mut rng = Rng::new(seed);
        let draws: Vec<u64> = (0..400_000).map(|_| s.sample(&mut rng)).collect();
        assert!(draws.iter().all(|&d| (1..=s.max).contains(&d)), "{name}");
        assert!(draws.contains(&s.max), "{name}: the tail reaches the clamp");
        let mean = draws.iter().sum::<u64>() as f64 / draws.len() as f64;
        let want = clamped_mean(&s);
        assert!(
            (mean / want - 1.0).abs() < 0.05,
            "{name}: mean {mean:.0}, want {want:.0}"
        );
        // Unclamped, the lognormal keeps llm-d's mean.
        assert!((want / s.mean) > 0.8 && want < s.mean, "{name}: {want:.0}");
        let mut sorted = draws.clone();
        sorted.sort_unstable();
        let median = sorted[sorted.len() / 2] as f64;
        let want_median = s.mean / (1.0 + (s.sd / s.mean).powi(2)).sqrt();
        assert!(
            (median / want_median - 1.0).abs() < 0.05,
            "{name}: median {median}, want {want_median:.1}"
        );
    }
}

#[test]
fn stages_users_and_contexts() {
    let shape = LatencyLadder::default();
    let w = latency_ladder(&shape, 1.0, 7);
    assert_eq!(w.stages.len(), 8);
    // Requests per stage at the stage's rate (Poisson: within 4 standard deviations).
    let mut per_stage = vec![0usize; 8];
    let stage_of = |t: std::time::Duration| w.stages.iter().position(|s| t < s.end);
    for c in &w.conversations {
        for t in &c.turns {
            per_stage[stage_of(t.at.expect("every turn has its arrival")).expect("in a stage")] +=
                1;
        }
    }
    for (st, n) in w.stages.iter().zip(&per_stage) {
        let want = st.rate * (st.end - st.start).as_secs_f64();
        assert!(
            (*n as f64 - want).abs() < 4.0 * want.sqrt(),
            "{n} requests at {}/s",
            st.rate
        );
    }
    let systems: std::collections::BTreeSet<String> = w
        .conversations
        .iter()
        .map(|c| format!("{:?}", c.system.as_ref().expect("a system prompt")))
        .collect();
    assert_eq!(systems.len() as u64, shape.groups);
    for c in &w.conversations {
        assert_eq!(c.system.as_ref().map(|s| s.tokens()), Some(1000));
        assert_eq!(c.turns[0].at, Some(c.start));
        assert!(c.turns.windows(2).all(|p| p[0].at <= p[1].at));
        // History (questions and answers) and the last question fit the context, unless the
        // conversation is a single question larger than that.
        let context: u64 = 1000
            + c.turns.iter().map(|t| t.user.tokens()).sum::<u64>()
            + c.turns[..c.turns.len() - 1]
                .iter()
                .map(|t| t.output_tokens)
                .sum::<u64>();
        assert!(
            context <= shape.max_context || c.turns.len() == 1,
            "{context} tokens"
        );
    }
    let turns = w.requests() as f64 / w.conversations.len() as f64;
    assert!(
        turns > 10.0,
        "multi-turn: {turns:.1} turns per conversation"
    );
}

#[test]
fn same_seed_same_workload() {
    let shape = LatencyLadder::default();
    let a = format!("{:?}", latency_ladder(&shape, 1.0 / 16.0, 3));
    assert_eq!(a, format!("{:?}", latency_ladder(&shape, 1.0 / 16.0, 3)));
    assert_ne!(a, format!("{:?}", latency_ladder(&shape, 1.0 / 16.0, 4)));
}
