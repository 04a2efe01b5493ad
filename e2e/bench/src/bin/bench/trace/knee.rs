//! The knee of a load sweep: the highest offered stage whose requests' TTFT p90 stays within
//! the SLO with at most 1 % shed, every lower stage passing too; reported as the input tokens
//! per second (full-size tokens, trace time) the pods were offered in that stage.
//!
//! The SLO is 5 × the p90 of the workload's cold prefill time at the fleet's mean rate: 2.0 s
//! for b2b-saas (7,200 tokens at 18,000 tokens/s = 0.4 s), the TTFT bound NVIDIA Dynamo's
//! goodput uses on the Mooncake trace; relative, so the knee does not depend on the scale.

use super::run::{pct, Run};
use ailb_bench::trace::workload::Workload;

#[derive(Clone, Copy, Debug, Default)]
pub struct Knee {
    pub stage: Option<usize>,
    pub rate: f64,
    pub input_tps: f64,
}

/// The workload's SLO: 5 × p90 of (prompt tokens / `mean_rate`) over its requests, where
/// prompt tokens are the scaled tokens and `mean_rate` scaled tokens per trace second.
pub fn slo(prompt_tokens: &[u64], mean_rate: f64) -> f64 {
    let mut t: Vec<f64> = prompt_tokens
        .iter()
        .map(|&p| p as f64 / mean_rate)
        .collect();
    t.sort_by(f64::total_cmp);
    5.0 * pct(&t, 0.9)
}

pub fn knee(run: &Run, w: &Workload, slo_s: f64, token_scale: f64) -> Knee {
    let mut planned = vec![0usize; w.stages.len()];
    for c in &w.conversations {
        planned[c.stage] += 1;
    }
    let mut out = Knee::default();
    for (i, st) in w.stages.iter().enumerate() {
        let recs: Vec<_> = run.records.iter().filter(|r| r.stage == i).collect();
        let convs = recs.iter().filter(|r| r.turn == 0).count();
        if convs < planned[i] || recs.is_empty() {
            break; // the sweep stopped before this stage was offered in full
        }
        let shed = recs
            .iter()
            .filter(|r| matches!(r.status, 429 | 503))
            .count();
        let p90 = pct(&run.ttfts_where(|r| r.stage == i), 0.9);
        if p90.is_nan() || p90 > slo_s || shed as f64 > 0.01 * recs.len() as f64 {
            break;
        }
        let tokens: u64 = recs.iter().map(|r| r.prompt_tokens).sum();
        out = Knee {
            stage: Some(i),
            rate: st.rate,
            input_tps: tokens as f64 / token_scale / (st.end - st.start).as_secs_f64(),
        };
    }
    out
}
