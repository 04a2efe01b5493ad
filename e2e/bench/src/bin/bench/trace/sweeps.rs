//! Load sweeps on llm-d's workload shapes (ailb_bench::trace::gen) and the knee of each router
//! (knee.rs). The fleet is half of llm-d's (4 pods) with half the b2b groups, so the prefix
//! working set is still 73 % of the fleet's KV and per-pod load at a given rate per pod is the
//! same; halving it halves the requests the machine must push at a given trace speed.

use super::fleet::{Cost, Scale, LLMD_H100};
use super::knee::{knee, slo, Knee};
use super::run::{bench, plugin, run, Run, Via};
use super::{peer, routers};
use ailb_bench::trace::gen::{b2b, codegen, B2b};
use ailb_bench::trace::replay::Options;
use ailb_bench::trace::workload::{Dialogue, Workload};
use std::sync::Arc;
use std::time::Duration;

pub const SWEEP_PODS: usize = 4;

/// `n` stages of `len` seconds from `rate`, each `step` times the last.
fn ladder(rate: f64, step: f64, n: usize, len: u64) -> Vec<(f64, Duration)> {
    (0..n)
        .map(|i| (rate * step.powi(i as i32), Duration::from_secs(len)))
        .collect()
}

fn prompt_tokens(w: &Workload) -> Vec<u64> {
    let mut v = Vec::new();
    for c in &w.conversations {
        let mut d = Dialogue::new(c);
        while let Some(b) = d.next_request() {
            v.push(b.canonical.len() as u64 / 4);
        }
    }
    v
}

/// Runs each router over the sweep; returns (name, knee) in order.
fn sweep(
    w: &Workload,
    s: Scale,
    routers: Vec<(&'static str, Via)>,
    bed: &ailb_e2e::bed::Bed,
) -> anyhow::Result<Vec<(String, Knee, Run)>> {
    let slo_s = slo(&prompt_tokens(w), LLMD_H100.mean_rate(s));
    eprintln!(
        "trace {}: {} requests, SLO TTFT p90 {slo_s:.1} s, stages {:?}",
        w.name,
        w.requests(),
        w.stages
            .iter()
            .map(|st| (st.rate * 100.0).round() / 100.0)
            .collect::<Vec<_>>()
    );
    let mut out = Vec::new();
    for (name, via) in routers {
        let mut o = Options::new(s.time);
        o.stop_past = Some(Duration::from_secs_f64(slo_s * 2.0));
        let r = run(bed, &format!("{}_{name}", w.name), w, via, o)?;
        let k = knee(&r, w, slo_s, s.tokens);
        eprintln!(
            "  knee {name}: stage {:?}, {:.2}/s, {:.0} input tokens/s",
            k.stage, k.rate, k.input_tps
        );
        out.push((name.to_string(), k, r));
    }
    Ok(out)
}

fn ratio(a: &Knee, b: &Knee) -> f64 {
    a.input_tps / b.input_tps
}

pub fn b2b_and_codegen(s: Scale) -> anyhow::Result<()> {
    let cost = LLMD_H100;
    let bed = cost.bed(SWEEP_PODS, s);
    let n = SWEEP_PODS;
    let blocks = cost.kv(s) as usize / Cost::block_tokens(s);
    let llmd = || Via::Router(Arc::new(peer::LlmdStyle::new(n, cost.mean_rate(s), blocks)));
    let rr = || Via::Router(Arc::new(routers::RoundRobin::new(n)));

    let shape = B2b {
        groups: 150 * n as u64 / 8,
        ..B2b::default()
    };
    let w = b2b(shape, &ladder(2.0, 1.25, 12, 90), s.tokens, 11);
    let k = sweep(
        &w,
        s,
        vec![
            ("round_robin", rr()),
            ("llmd_style", llmd()),
            ("prefix_cache", plugin(1, s)),
        ],
        &bed,
    )?;
    bench(
        "trace_b2b_knee_over_round_robin",
        ratio(&k[2].1, &k[0].1),
        "ratio",
    );
    bench(
        "trace_b2b_knee_over_llmd_style",
        ratio(&k[2].1, &k[1].1),
        "ratio",
    );
    bench(
        "trace_b2b_llmd_style_knee_over_round_robin",
        ratio(&k[1].1, &k[0].1),
        "ratio",
    );

    let w = codegen(&ladder(0.06, 1.3, 9, 150), s.tokens, 12);
    let k = sweep(
        &w,
        s,
        vec![
            ("round_robin", rr()),
            ("prefix_cache", plugin(1, s)),
            ("llmd_style", llmd()),
        ],
        &bed,
    )?;
    bench(
        "trace_codegen_knee_over_round_robin",
        ratio(&k[1].1, &k[0].1),
        "ratio",
    );
    bench(
        "trace_codegen_llmd_style_knee_over_round_robin",
        ratio(&k[2].1, &k[0].1),
        "ratio",
    );
    Ok(())
}
