//! Session stickiness: the prefix benchmark's sessions (60 sessions × 5 rounds, shared system
//! prompts, 2 gateways, 4 pods), each round sent to the other gateway and carrying its session
//! id. The same plan once through prefix_cache with `sessionHeader` and once through
//! prefix_cache alone (which ignores the header: `agentSessions: false`, since `x-session-id`
//! is also an agent's header it recognises by default); then the same through
//! global_least_request with and without the header, where nothing but the session keeps a
//! conversation on its pod.

use crate::prefix::prefix_config;
use ailb_e2e::bed::Bed;
use ailb_e2e::gateway::{glr_config, Gateway};
use ailb_fakepod::load::{self, client::Outcome, LoadConfig, Plan, Summary, Workload};
use serde_json::Value;
use std::collections::HashMap;
use std::time::Duration;

const HEADER: &str = "x-session-id";

/// Share of a session's turns served by the pod of its first turn, over every session.
fn stickiness(plan: &Plan, outcomes: &[Outcome]) -> f64 {
    let mut first: HashMap<usize, String> = HashMap::new();
    let (mut same, mut total) = (0usize, 0usize);
    for (r, o) in plan.requests.iter().zip(outcomes) {
        let (Some((session, _)), Some(pod), None) = (r.session, &o.pod, &o.error) else {
            continue;
        };
        let home = first.entry(session).or_insert_with(|| pod.clone());
        total += 1;
        same += usize::from(home == pod);
    }
    same as f64 / total.max(1) as f64
}

pub fn session_stickiness_and_ttft() -> anyhow::Result<()> {
    let bed = Bed::new(4, |c| {
        c.max_running = 8;
        c.prefill_us_per_token = 200;
        c.decode_us_per_token = 5_000;
        c.decode_batch_penalty = 0.0;
    });
    let run = |plugin: Value, tag: &str| -> anyhow::Result<(Summary, f64, [i64; 4])> {
        // Every run starts from an empty Redis: no binding or prefix key of the previous one.
        bed.redis.cmd(&["FLUSHALL"]);
        let gws: Vec<Gateway> = (0..2)
            .map(|i| Gateway::start(&bed.spec(&format!("{tag}-{i}"), Some(plugin.clone()))))
            .collect::<anyhow::Result<_>>()?;
        let mut lc = LoadConfig::new(
            gws.iter().map(|g| g.url.clone()).collect(),
            Workload::Sessions(Default::default()),
        );
        lc.seed = 5;
        lc.timeout = Duration::from_secs(120);
        lc.admin_urls = bed.pods.iter().map(|p| p.url()).collect();
        lc.reset_pods = true;
        // Every round to the other gateway, every request naming its session.
        let mut plan = load::plan(&lc);
        for r in &mut plan.requests {
            if let Some((session, round)) = r.session {
                r.target = (session + round) % gws.len();
                r.headers
                    .push((HEADER.into(), format!("session-{session}")));
            }
        }
        let (s, outcomes) = bed.rt.block_on(load::run_plan_outcomes(&lc, &plan))?;
        eprintln!("{tag}: {}", s.line());
        let stat = |name: &str| gws.iter().map(|g| g.stat(name)).sum::<i64>();
        let counters = [
            stat("ai_lb.session.hit"),
            stat("ai_lb.session.bound"),
            stat("ai_lb.session.rebound"),
            stat("ai_lb.session.fallback"),
        ];
        Ok((s, stickiness(&plan, &outcomes), counters))
    };
    let mut sticky_cfg = prefix_config(bed.redis.port);
    sticky_cfg["lb_config"]["sessionHeader"] = HEADER.into();
    let (sticky, sticky_share, counters) = run(sticky_cfg, "session")?;
    let mut plain_cfg = prefix_config(bed.redis.port);
    plain_cfg["lb_config"]["agentSessions"] = false.into();
    let (plain, plain_share, _) = run(plain_cfg, "prefix-only")?;
    anyhow::ensure!(
        sticky.sequence == plain.sequence,
        "both runs must replay the same plan"
    );
    anyhow::ensure!(
        sticky.ok == sticky.count,
        "session run failed requests: {}",
        sticky.line()
    );
    eprintln!(
        "session counters hit/bound/rebound/fallback {counters:?}; prefix-only stickiness {plain_share:.3}"
    );
    println!("BENCH session_stickiness {sticky_share:.3} ratio");
    println!(
        "BENCH session_ttft_p50_ratio_vs_prefix_only {:.2} ratio",
        sticky.ttft_ms.p50 / plain.ttft_ms.p50
    );
    // What the session option adds on its own: the prefix run's prompts keep a session on its
    // pod through the cache keys too, least request has nothing else that would.
    let mut lr_cfg = glr_config(bed.redis.port, serde_json::json!({"agentSessions": false}));
    let (_, lr_plain_share, _) = run(lr_cfg.clone(), "least-request")?;
    lr_cfg["lb_config"]["sessionHeader"] = HEADER.into();
    let (lr, lr_share, lr_counters) = run(lr_cfg, "least-request-session")?;
    anyhow::ensure!(
        lr.ok == lr.count,
        "least-request session run failed requests: {}",
        lr.line()
    );
    eprintln!("least-request session counters hit/bound/rebound/fallback {lr_counters:?}");
    println!("BENCH session_stickiness_least_request {lr_share:.3} ratio");
    println!("BENCH session_stickiness_least_request_without_sessions {lr_plain_share:.3} ratio");
    Ok(())
}
