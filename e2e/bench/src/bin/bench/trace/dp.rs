//! `ailb-bench dp`: issue 49's data-parallel figures (docs/trace-bench.md "The DP section").
//! Two pods of four DP ranks each behind one port (fleet.rs `dp_bed`: every rank a whole
//! engine of the trace fleet's cost), code-generation conversations at one rate, and on the
//! same arrivals, each run cold:
//!
//! * `rank_oracle`: O2, the capacity-bounded oracle (routers.rs), over the 8 ranks' engines,
//!   sending to the pod with `X-data-parallel-rank`;
//! * `rank_blind`: the plugin as a user configures it today (run.rs `plugin`): it picks the
//!   pod, the pod's own balancer (vLLM's DPLB, least loaded) picks the rank;
//! * `rank_aware`: the same plugin with `dataParallelSize` 4, run when the plugin takes the key
//!   (dist/check-config).
//!
//! Each figure is the median over seeds 1..=3 (`AILB_DP_SEEDS=n` runs n) with its spread.
//! The scale is the trace bench's (`AILB_TRACE_TIME_SCALE`, `AILB_TRACE_TOKEN_SCALE`).

use super::fleet::{Cost, Scale, LLMD_H100};
use super::plugin_keys::plugin_takes;
use super::routers::{Oracle, Ranked};
use super::run::{bench, penalty_ms, plugin, run, Run, Via};
use crate::common::bench_over_seeds;
use ailb_bench::trace::gen::codegen;
use ailb_bench::trace::infinite;
use ailb_bench::trace::replay::{debug_field, Options};
use ailb_bench::trace::workload::Workload;
use ailb_e2e::bed::Bed;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const DP_PODS: usize = 2;
pub const DP_RANKS: usize = 4;

/// Conversations per second of trace time and the span they start over: about 90
/// conversations, 450 requests per seed. The conversations running at once have sent prompts
/// of about two thirds of the 8 ranks' KV (8 × 307,328 tokens) on average and more than all of
/// it at the peak (`demand` logs both), near the trace bench's b2b working set (73 % of the
/// fleet's KV): a conversation keeps its history cached only on the rank it stays on, and the
/// oracle itself is bounded (its hit is below O1's). Prefill stays within the fleet's rate.
const RATE: f64 = 0.35;
const SPAN_S: u64 = 260;

fn seeds() -> Vec<u64> {
    let n = std::env::var("AILB_DP_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3u64);
    (1..=n.max(1)).collect()
}

fn workload(seed: u64, s: Scale) -> Workload {
    let mut w = codegen(&[(RATE, Duration::from_secs(SPAN_S))], s.tokens, seed);
    w.name = format!("dp_codegen_{seed}");
    w
}

/// O2 over every rank's engine, pod by pod: its endpoint `i` is rank `i % DP_RANKS` of pod
/// `i / DP_RANKS`, as [`Ranked`] maps it.
fn rank_oracle(bed: &Bed) -> Via {
    let engines = bed
        .pods
        .iter()
        .flat_map(|p| p.ranks().list.iter().map(|r| r.engine.clone()))
        .collect();
    Via::Router(Arc::new(Ranked {
        inner: Oracle::new(engines),
        ranks: DP_RANKS,
    }))
}

/// run.rs `plugin`'s keys with the ranks.
fn aware_lb(s: Scale) -> Value {
    json!({ "maxTTFTPenaltyMs": penalty_ms(s), "dataParallelSize": DP_RANKS })
}

/// One seed's hit rates.
struct Seed {
    oracle: f64,
    blind: f64,
    aware: Option<f64>,
}

pub fn dp() -> anyhow::Result<()> {
    let t0 = Instant::now();
    let s = super::scale();
    let with_aware = plugin_takes("dp", "dataParallelSize", &aware_lb(s), "rank_aware");
    let bed = LLMD_H100.dp_bed(DP_PODS, DP_RANKS, s);
    let mut seeds = Vec::new();
    for seed in self::seeds() {
        let w = workload(seed, s);
        eprintln!(
            "dp: seed {seed}: {} requests in {} conversations; O1 {:.3}",
            w.requests(),
            w.conversations.len(),
            infinite::infinite_hit(&w, Cost::block_tokens(s))
        );
        let opts = || Options::new(s.time);
        let oracle = run(&bed, "rank_oracle", &w, rank_oracle(&bed), opts())?;
        show(&bed, &oracle);
        demand(&oracle, w.span(), s);
        let blind = run(&bed, "rank_blind", &w, plugin(1, s), opts())?;
        show(&bed, &blind);
        let aware = if with_aware {
            let via = Via::Gateways {
                n: 1,
                lb: aware_lb(s),
            };
            let r = run(&bed, "rank_aware", &w, via, opts())?;
            show(&bed, &r);
            Some(r.hit())
        } else {
            None
        };
        seeds.push(Seed {
            oracle: oracle.hit(),
            blind: blind.hit(),
            aware,
        });
    }
    drop(bed);
    report(&seeds);
    bench("dp_section_wall_s", t0.elapsed().as_secs_f64(), "s");
    Ok(())
}

fn report(seeds: &[Seed]) {
    let of = |f: fn(&Seed) -> Option<f64>| seeds.iter().filter_map(f).collect::<Vec<f64>>();
    bench_over_seeds("dp_hit_rank_oracle", &of(|sd| Some(sd.oracle)), "ratio");
    bench_over_seeds("dp_hit_rank_blind", &of(|sd| Some(sd.blind)), "ratio");
    bench_over_seeds("dp_hit_rank_aware", &of(|sd| sd.aware), "ratio");
    bench_over_seeds(
        "dp_hit_over_rank_oracle",
        &of(|sd| Some(sd.aware? / sd.oracle)),
        "ratio",
    );
    bench_over_seeds(
        "dp_hit_rank_blind_over_rank_oracle",
        &of(|sd| Some(sd.blind / sd.oracle)),
        "ratio",
    );
}

/// What explains a run's hit rate, on stderr: per rank its requests and hit rate as the
/// engines counted them; the share of later turns that reached the (pod, rank) of the
/// conversation's previous turn (where its history is cached); and through the plugin, the
/// share of answers whose serving rank is the one its debug header named (`endpoint=…@rank`).
fn show(bed: &Bed, r: &Run) {
    let mut requests = Vec::new();
    let (mut hits, mut full) = (Vec::new(), Vec::new());
    for p in &bed.pods {
        for k in p.state().ranks {
            requests.push(k.requests_total);
            hits.push(k.prefix_hit_tokens as f64 / k.prefix_query_tokens.max(1) as f64);
            full.push(k.cache_blocks_used as f64 / k.cache_blocks_capacity.max(1) as f64);
        }
    }
    let two = |v: &[f64]| {
        v.iter()
            .map(|h| format!("{h:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    eprintln!(
        "  per rank: requests {requests:?}, hit [{}], cache filled [{}]",
        two(&hits),
        two(&full)
    );
    let at: HashMap<(usize, usize), (Option<usize>, Option<usize>)> = r
        .ok()
        .map(|x| ((x.conv, x.turn), (x.pod, x.rank)))
        .collect();
    let later: Vec<bool> = r
        .ok()
        .filter(|x| x.turn > 0)
        .filter_map(|x| Some(at.get(&(x.conv, x.turn - 1))? == &(x.pod, x.rank)))
        .collect();
    let stayed = later.iter().filter(|&&b| b).count() as f64 / later.len().max(1) as f64;
    let named: Vec<bool> = r
        .ok()
        .filter_map(|x| {
            let endpoint = debug_field(x.debug.as_deref(), "endpoint")?;
            let rank = endpoint.rsplit_once('@')?.1.parse::<usize>().ok()?;
            Some(x.rank == Some(rank))
        })
        .collect();
    let honoured = if named.is_empty() {
        String::new()
    } else {
        let n = named.iter().filter(|&&b| b).count();
        format!(
            ", served by the rank the plugin named {n} of {}",
            named.len()
        )
    };
    eprintln!(
        "  later turns on their previous turn's rank {stayed:.3}{honoured}; shed {:.3}",
        r.shed_share()
    );
}

/// How much cache the workload wants, on stderr: sampled every second over the span the
/// conversations start in, the conversations running (from their first request to their last
/// answer) and the prompts they have sent so far (their latest, full size), against the ranks'
/// KV.
fn demand(r: &Run, span: Duration, s: Scale) {
    // Per conversation: its turns' (sent, prompt tokens) in order, and its end.
    let mut conv: HashMap<usize, (Vec<(f64, u64)>, f64)> = HashMap::new();
    for x in r.ok() {
        let at = x.at.as_secs_f64();
        let c = conv.entry(x.conv).or_default();
        c.0.push((at, x.prompt_tokens));
        c.1 = c.1.max(at + x.e2e.map_or(0.0, |d| d.as_secs_f64()));
    }
    let (mut running, mut tokens, mut peak) = (0.0, 0.0, 0.0f64);
    let seconds = span.as_secs().max(1);
    for t in 0..seconds {
        let t = t as f64;
        let now: Vec<u64> = conv
            .values()
            .filter(|(turns, end)| turns.first().is_some_and(|f| f.0 <= t) && t < *end)
            .filter_map(|(turns, _)| turns.iter().filter(|x| x.0 <= t).map(|x| x.1).max())
            .collect();
        let held = now.iter().sum::<u64>() as f64 / s.tokens;
        running += now.len() as f64;
        tokens += held;
        peak = peak.max(held);
    }
    let n = seconds as f64;
    let kv = (DP_PODS * DP_RANKS) as f64 * LLMD_H100.kv_tokens as f64;
    eprintln!(
        "  conversations at once {:.0}, their prompts {:.2} M tokens (peak {:.2} M), the ranks' KV {:.2} M",
        running / n,
        tokens / n / 1e6,
        peak / 1e6,
        kv / 1e6
    );
}
