//! `ailb-bench slo`: issue 50's benchmark (docs/trace-bench.md "The SLO section"). llm-d's
//! predicted-latency ladder (ailb_bench::trace::latency_ladder) on four pods of two GPU speeds
//! (fleet.rs `TWO_GPU_SPEEDS`), every router on the same arrivals, each run cold:
//!
//! * `prefix_cache`: the plugin as today (run.rs `plugin`: the token gate);
//! * `latency`: the plugin with `latencyModel` and its SLOs, run when the plugin knows the key
//!   (dist/check-config does not call it unknown);
//! * `llmd_style`: llm-d's predicted-latency scheduler in one process (llmd_predictor.rs);
//!
//! then `latency` again on a uniform fleet of the same capacity. Every request carries the
//! SLOs as `x-slo-ttft-ms` / `x-slo-tpot-ms`. Each figure is the median over three seeds, with
//! its spread (max − min), as real_engine.rs reports. `AILB_SLO_TIME_SCALE` and
//! `AILB_SLO_TOKEN_SCALE` override the scale, `AILB_SLO_SEEDS` the number of seeds.

use super::fleet::{Cost, Scale, TWO_GPU_SPEEDS};
use super::llmd_predictor::{LlmdPredictor, Setup};
use super::plugin_keys::plugin_takes;
use super::run::{bench, pct, penalty_ms, plugin, run, Run, Via};
use super::slo_figures::{figures, statuses, Figures, Slo};
use super::{env_f64, slo_rates};
use crate::common::{bench_over_seeds, median};
use ailb_bench::trace::infinite;
use ailb_bench::trace::latency_ladder::{latency_ladder, LatencyLadder};
use ailb_bench::trace::replay::Options;
use ailb_bench::trace::workload::Workload;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

pub const SLO_PODS: usize = 4;

/// Seeds 1..=3; `AILB_SLO_SEEDS=n` runs the first n (one, to work on the section).
fn seeds() -> Vec<u64> {
    let n = std::env::var("AILB_SLO_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3u64);
    (1..=n.max(1)).collect()
}

/// The section's scale: trace time 50 × faster, tokens × 1/4, as the trace bench. A scaled
/// answer's first token stands for 1/tokens tokens and takes as many decode steps, so a
/// smaller token scale would put a floor under every TTFT (at 1/16, 400 ms on a fast pod).
pub fn scale() -> Scale {
    Scale {
        time: env_f64("AILB_SLO_TIME_SCALE", 50.0),
        tokens: env_f64("AILB_SLO_TOKEN_SCALE", 0.25),
    }
}

/// The SLOs that matter on `cost`'s fleet at scale `s` (trace time, full size). TTFT: 5 × what
/// a mean question (729 tokens) takes on the mean pod unloaded, its prefill and its first
/// token as the bench's pods take it (one decode step of a scaled token: 1/tokens steps), as
/// the trace bench's knee SLO is 5 × a cold prefill; a request misses it by waiting behind
/// others' prefill or by a long question of its own. TPOT: 1.6 × the mean pod's unloaded
/// decode step (48 ms on `TWO_GPU_SPEEDS`, 50 in whole wall milliseconds at the default scale:
/// twice a fast pod's step, 1.33 × a slow one's), which a batch or a prefill chunk sharing the
/// step pushes past.
pub fn slo_targets(cost: &Cost, s: Scale) -> Slo {
    let mean = cost.uniform();
    let step_s = mean.decode_ms / 1e3;
    let question = LatencyLadder::default().question.mean;
    Slo {
        ttft_s: 5.0 * (question / mean.fast_tps + step_s / s.tokens),
        tpot_s: 1.6 * step_s,
    }
}

/// The latency-aware plugin's own keys over prefix_cache's defaults: the SLOs, and its
/// defaults that are times in the bench's compressed time, as `maxTTFTPenaltyMs` is: a model
/// merge every 100 ms (the least it takes; its 1,000 ms default would be 50 s of trace time),
/// a 600 s half-life and a 30 ms prior TPOT (per full-size token), each ÷ 50 (and the TPOT
/// ÷ 1/4 per scaled token).
fn latency_lb(slo: Slo, s: Scale) -> Value {
    json!({
        "maxTTFTPenaltyMs": penalty_ms(s),
        "latencyModel": {
            "sloTTFTMs": slo.ttft_wall_ms(s).round() as u64,
            "sloTPOTMs": slo.tpot_wall_ms(s).round() as u64,
            "mergeIntervalMs": 100,
            "halfLifeS": (600.0 / s.time).round().max(10.0) as u64,
            "priorTPOTMs": 30.0 / s.tokens / s.time,
        },
    })
}

/// Whether the plugin takes `latencyModel` (before it does, it accepts the config and ignores
/// the key with a warning, so the `latency` run would be `prefix_cache` again).
fn plugin_knows_latency_model(lb: &Value) -> bool {
    plugin_takes("slo", "latencyModel", lb, "latency")
}

fn options(slo: Slo, s: Scale) -> Options {
    let mut o = Options::new(s.time);
    o.headers = vec![
        (
            "x-slo-ttft-ms".into(),
            format!("{}", slo.ttft_wall_ms(s).round()),
        ),
        (
            "x-slo-tpot-ms".into(),
            format!("{}", slo.tpot_wall_ms(s).round()),
        ),
    ];
    o
}

/// llm-d's predictor on `cost`'s fleet: told the SLOs, its penalty and a start from the
/// fleet's mean pod (one calibration for the pool), in wall time.
fn llmd(cost: &Cost, slo: Slo, s: Scale) -> Arc<LlmdPredictor> {
    let mean = cost.uniform();
    let step_ms = mean.decode_ms / s.tokens / s.time;
    let ms_per_k = 1e6 / (mean.fast_tps * s.tokens * s.time);
    Arc::new(LlmdPredictor::new(
        SLO_PODS,
        Setup {
            slo_ttft_ms: slo.ttft_wall_ms(s),
            slo_tpot_ms: slo.tpot_wall_ms(s),
            penalty_ms: penalty_ms(s) as f64,
            ttft_prior: [step_ms, ms_per_k, 0.0],
            tpot_prior: [step_ms, step_ms * cost.batch_penalty],
            capacity_blocks: cost.kv(s) as usize / Cost::block_tokens(s),
        },
    ))
}

/// One seed's figures per router.
#[derive(Default)]
struct Seed {
    prefix_cache: Figures,
    llmd_style: Figures,
    latency: Option<Figures>,
    uniform: Option<Figures>,
    learned_rate_error: Option<f64>,
}

fn show(name: &str, r: &Run, f: &Figures, cost: &Cost, span_s: f64, s: Scale) {
    let uncached: u64 = r
        .ok()
        .map(|r| r.prompt_tokens.saturating_sub(r.cached_tokens))
        .sum();
    let capacity = (cost.fast_tps + cost.slow_tps) / 2.0 * SLO_PODS as f64;
    let mut client: Vec<f64> = r
        .ok()
        .filter_map(|r| r.ttft_client.map(|d| d.as_secs_f64()))
        .collect();
    client.sort_by(f64::total_cmp);
    eprintln!(
        "  {}; hit {:.3}, prefill busy {:.2}, client ttft p50 {:.3} s",
        f.line(name),
        r.hit(),
        uncached as f64 / s.tokens / span_s / capacity,
        pct(&client, 0.5)
    );
    let st = statuses(r);
    if !st.is_empty() {
        eprintln!("    not 200: {st:?}");
    }
}

pub fn slo() -> anyhow::Result<()> {
    let t0 = Instant::now();
    let s = scale();
    let cost = TWO_GPU_SPEEDS;
    let slo = slo_targets(&cost, s).in_whole_wall_ms(s);
    let lat_lb = latency_lb(slo, s);
    let with_latency = plugin_knows_latency_model(&lat_lb);
    eprintln!(
        "slo: SLO TTFT {:.3} s, TPOT {:.0} ms (trace time; {:.2} ms and {:.2} ms per token in wall time)",
        slo.ttft_s,
        slo.tpot_s * 1e3,
        slo.ttft_wall_ms(s),
        slo.tpot_wall_ms(s)
    );
    let shape = LatencyLadder::default();
    let span_s = shape.stage.as_secs_f64() * shape.rates.len() as f64;
    let workloads: Vec<Workload> = seeds()
        .into_iter()
        .map(|seed| latency_ladder(&shape, s.tokens, seed))
        .collect();
    let mut seeds: Vec<Seed> = workloads.iter().map(|_| Seed::default()).collect();
    let bed = cost.bed(SLO_PODS, s);
    for (w, seed) in workloads.iter().zip(&mut seeds) {
        eprintln!(
            "slo: {} requests in {} conversations; O1 {:.3}",
            w.requests(),
            w.conversations.len(),
            infinite::infinite_hit(w, Cost::block_tokens(s))
        );
        let px = run(&bed, "slo_prefix_cache", w, plugin(1, s), options(slo, s))?;
        seed.prefix_cache = figures(&px, slo, span_s, s);
        show("prefix_cache", &px, &seed.prefix_cache, &cost, span_s, s);
        let peer = llmd(&cost, slo, s);
        let ll = run(
            &bed,
            "slo_llmd_style",
            w,
            Via::Router(peer.clone()),
            options(slo, s),
        )?;
        seed.llmd_style = figures(&ll, slo, span_s, s);
        show("llmd_style", &ll, &seed.llmd_style, &cost, span_s, s);
        eprintln!(
            "    its TTFT error per pod {:?}, coefficients {:?}",
            peer.ttft_mape(),
            peer.coefficients()
        );
        if with_latency {
            let via = Via::Gateways {
                n: 1,
                lb: lat_lb.clone(),
            };
            let lat = run(&bed, "slo_latency", w, via, options(slo, s))?;
            let f = figures(&lat, slo, span_s, s);
            show("latency", &lat, &f, &cost, span_s, s);
            seed.latency = Some(f);
            seed.learned_rate_error = slo_rates::learned_rate_error(&bed, &cost, s);
        }
    }
    drop(bed);
    if with_latency {
        let uniform = cost.uniform();
        let bed = uniform.bed(SLO_PODS, s);
        for (w, seed) in workloads.iter().zip(&mut seeds) {
            let via = Via::Gateways {
                n: 1,
                lb: lat_lb.clone(),
            };
            let r = run(&bed, "slo_latency_uniform", w, via, options(slo, s))?;
            let f = figures(&r, slo, span_s, s);
            show("latency_uniform", &r, &f, &uniform, span_s, s);
            seed.uniform = Some(f);
        }
    }
    report(&seeds);
    bench("slo_section_wall_s", t0.elapsed().as_secs_f64(), "s");
    Ok(())
}

/// Per seed, the latency plugin's figure over `base`'s (seeds without it are left out).
fn ratios(seeds: &[Seed], f: fn(&Figures) -> f64, base: fn(&Seed) -> &Figures) -> Vec<f64> {
    seeds
        .iter()
        .filter_map(|sd| sd.latency.as_ref().map(|l| f(l) / f(base(sd))))
        .collect()
}

fn report(seeds: &[Seed]) {
    let px: fn(&Seed) -> &Figures = |sd| &sd.prefix_cache;
    let e2e: fn(&Figures) -> f64 = |f| f.e2e_p50;
    let ttft50: fn(&Figures) -> f64 = |f| f.ttft_p50;
    let ttft95: fn(&Figures) -> f64 = |f| f.ttft_p95;
    let tpot99: fn(&Figures) -> f64 = |f| f.tpot_p99;
    let goodput: fn(&Figures) -> f64 = |f| f.goodput;
    for (name, f) in [
        ("slo_e2e_p50_over_prefix_cache", e2e),
        ("slo_ttft_p50_over_prefix_cache", ttft50),
        ("slo_ttft_p95_over_prefix_cache", ttft95),
        ("slo_tpot_p99_over_prefix_cache", tpot99),
        ("slo_goodput_over_prefix_cache", goodput),
    ] {
        bench_over_seeds(name, &ratios(seeds, f, px), "ratio");
    }
    bench_over_seeds(
        "slo_goodput_over_llmd_style",
        &ratios(seeds, goodput, |sd| &sd.llmd_style),
        "ratio",
    );
    let mixed_over_uniform: Vec<f64> = seeds
        .iter()
        .filter_map(|sd| Some(sd.latency?.goodput / sd.uniform?.goodput))
        .collect();
    bench_over_seeds(
        "slo_goodput_mixed_over_uniform_fleet",
        &mixed_over_uniform,
        "ratio",
    );
    let mape: Vec<f64> = seeds
        .iter()
        .filter_map(|sd| sd.latency?.ttft_mape)
        .collect();
    if seeds.iter().any(|sd| sd.latency.is_some()) && mape.is_empty() {
        eprintln!("slo: no predicted_ttft_ms in the plugin's debug header: no slo_ttft_mape");
    }
    bench_over_seeds("slo_ttft_mape", &mape, "ratio");
    let shed: Vec<f64> = seeds
        .iter()
        .filter_map(|sd| sd.latency.map(|l| l.shed))
        .collect();
    bench_over_seeds("slo_shed_share", &shed, "ratio");
    let rates: Vec<f64> = seeds
        .iter()
        .filter_map(|sd| sd.learned_rate_error)
        .collect();
    bench_over_seeds("slo_learned_rate_error_max", &rates, "ratio");
    let table: [(&str, Vec<Figures>); 4] = [
        (
            "prefix_cache",
            seeds.iter().map(|sd| sd.prefix_cache).collect(),
        ),
        ("llmd_style", seeds.iter().map(|sd| sd.llmd_style).collect()),
        (
            "latency",
            seeds.iter().filter_map(|sd| sd.latency).collect(),
        ),
        (
            "latency_uniform",
            seeds.iter().filter_map(|sd| sd.uniform).collect(),
        ),
    ];
    for (name, v) in table.iter().filter(|(_, v)| !v.is_empty()) {
        let m = |g: fn(&Figures) -> f64| median(&v.iter().map(g).collect::<Vec<f64>>());
        let med = Figures {
            e2e_p50: m(e2e),
            ttft_p50: m(ttft50),
            ttft_p95: m(ttft95),
            tpot_p99: m(tpot99),
            attainment: m(|f| f.attainment),
            goodput: m(goodput),
            shed: m(|f| f.shed),
            ttft_mape: None,
        };
        eprintln!("slo: median of {} seeds: {}", v.len(), med.line(name));
    }
}
