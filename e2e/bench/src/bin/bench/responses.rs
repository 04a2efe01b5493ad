//! Responses continuations (docs/sessions-and-queues.md "Agent sessions"): chains of
//! `previous_response_id` turns, many at once over 2 gateways × 4 fake pods (each turn through
//! the other gateway), beside a background load of unrelated chat requests, routed by
//! global_least_request with its agent sessions (a continuation goes to the pod that produced
//! its previous response) and, side by side in the same run (two interleaved rounds each),
//! with `agentSessions: false` (load-only routing). The pods share one response store (a
//! backend whose servers share stored responses), so a continuation answered elsewhere
//! succeeds but prefills its whole history uncached: the fake engine's prefill costs per
//! uncached token, which is what the TTFT ratio weighs.

use crate::common::percentile;
use ailb_e2e::bed::Bed;
use ailb_e2e::gateway::{glr_config, open, Gateway};
use ailb_fakepod::ResponseStore;
use serde_json::json;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const CHAINS: usize = 32;
const TURNS: usize = 8;
/// New input per turn, bytes (about 4 per token): an agent's turn adds little to a long
/// history.
const INPUT_BYTES: usize = 800;
const OUTPUT_TOKENS: u64 = 16;
/// Clients sending unrelated chat requests back to back while the chains run.
const BACKGROUND: usize = 8;

/// One streamed turn: status, the pod that answered, time to the first body bytes (the
/// fake pod sends `response.created` once the prompt is prefilled) and the answer's id.
struct Turn {
    status: u16,
    pod: String,
    ttft_ms: f64,
    id: Option<String>,
}

fn turn(gw: &Gateway, input: &str, previous: Option<&str>) -> anyhow::Result<Turn> {
    let mut body = json!({"model": "fake-model", "input": input, "stream": true,
        "max_output_tokens": OUTPUT_TOKENS});
    if let Some(p) = previous {
        body["previous_response_id"] = json!(p);
    }
    let t0 = Instant::now();
    let mut s = open(
        &gw.url,
        "POST",
        "/v1/responses",
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    )?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let (mut raw, mut buf, mut ttft) = (Vec::new(), [0u8; 16 * 1024], None);
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if ttft.is_none() {
            if let Some(h) = find(&raw, b"\r\n\r\n") {
                if raw.len() > h + 4 {
                    ttft = Some(t0.elapsed().as_secs_f64() * 1000.0);
                }
            }
        }
    }
    let head_end = find(&raw, b"\r\n\r\n").unwrap_or(raw.len());
    let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let pod = head
        .lines()
        .find_map(|l| l.strip_prefix("x-pod:"))
        .map(|v| v.trim().to_string())
        .unwrap_or_default();
    // The first response id in the stream: `response.created` comes first (item ids are
    // `msg_…`).
    let text = String::from_utf8_lossy(&raw[head_end..]);
    let id = text.find("\"id\":\"resp-").and_then(|at| {
        let rest = &text[at + 6..];
        rest.find('"').map(|end| rest[..end].to_string())
    });
    Ok(Turn {
        status,
        pod,
        ttft_ms: ttft.unwrap_or(f64::NAN),
        id,
    })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Unrelated chat requests, back to back from each of [`BACKGROUND`] clients, until `stop`.
fn background(gws: &[Gateway], stop: &AtomicBool) {
    std::thread::scope(|s| {
        for b in 0..BACKGROUND {
            s.spawn(move || {
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let text = format!("background {b} request {i} ").repeat(40);
                    let body = json!({"model": "fake-model", "max_tokens": OUTPUT_TOKENS,
                        "messages": [{"role": "user", "content": text}]});
                    let gw = &gws[(b + i) % gws.len()];
                    let _ = ailb_e2e::gateway::http(
                        &gw.url,
                        "POST",
                        "/v1/chat/completions",
                        &[("content-type", "application/json")],
                        body.to_string().as_bytes(),
                    );
                    i += 1;
                }
            });
        }
    });
}

/// Every chain at once (started 20 ms apart), each turn through the other gateway, beside the
/// background load: every chain's turns.
fn chains(gws: &[Gateway]) -> Vec<Vec<Turn>> {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let stop = &stop;
        s.spawn(move || background(gws, stop));
        let runs = chain_turns(gws);
        stop.store(true, Ordering::Relaxed);
        runs
    })
}

fn chain_turns(gws: &[Gateway]) -> Vec<Vec<Turn>> {
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..CHAINS)
            .map(|c| {
                s.spawn(move || {
                    std::thread::sleep(Duration::from_millis(20 * c as u64));
                    let mut prev: Option<String> = None;
                    let mut out = Vec::new();
                    for t in 0..TURNS {
                        let gw = &gws[(c + t) % gws.len()];
                        let words = format!("chain {c} turn {t} asks about something new. ");
                        let input: String = words.repeat(INPUT_BYTES / words.len() + 1);
                        match turn(gw, &input[..INPUT_BYTES], prev.as_deref()) {
                            Ok(got) => {
                                prev = got.id.clone();
                                out.push(got);
                            }
                            Err(_) => break,
                        }
                    }
                    out
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_default())
            .collect()
    })
}

/// One setup's figures: the share of continuations on their previous answer's pod, the
/// continuations' TTFT p50 (ms), and the failed turns.
fn measure(runs: &[Vec<Turn>]) -> (f64, f64, usize) {
    let (mut hit, mut continued, mut failed) = (0usize, 0usize, 0usize);
    let mut ttft = Vec::new();
    for run in runs {
        failed += TURNS - run.len();
        for (t, got) in run.iter().enumerate() {
            if got.status != 200 {
                failed += 1;
                continue;
            }
            if t == 0 {
                continue;
            }
            continued += 1;
            hit += usize::from(got.pod == run[t - 1].pod);
            ttft.push(got.ttft_ms);
        }
    }
    ttft.sort_by(f64::total_cmp);
    (
        hit as f64 / continued.max(1) as f64,
        percentile(&ttft, 0.5),
        failed,
    )
}

pub fn continuations() -> anyhow::Result<()> {
    let store = ResponseStore::new();
    let bed = Bed::new(4, |c| {
        c.responses = store.clone();
        c.max_running = 6;
        c.prefill_us_per_token = 100;
        c.decode_us_per_token = 2_000;
        c.decode_batch_penalty = 0.0;
    });
    let run = |agent_sessions: bool, tag: &str| -> anyhow::Result<(f64, f64, usize)> {
        bed.redis.cmd(&["FLUSHALL"]);
        bed.reset_pods();
        let cfg = glr_config(
            bed.redis.port,
            json!({"agentSessions": agent_sessions, "timeout": 2000}),
        );
        let gws: Vec<Gateway> = (0..2)
            .map(|i| Gateway::start(&bed.spec(&format!("{tag}-{i}"), Some(cfg.clone()))))
            .collect::<anyhow::Result<_>>()?;
        let figures = measure(&chains(&gws));
        let stat = |name: &str| gws.iter().map(|g| g.stat(name)).sum::<i64>();
        eprintln!(
            "{tag}: hit {:.3}, continuation TTFT p50 {:.1} ms, failed {}; recorded {}, unknown {}, rebound {}",
            figures.0,
            figures.1,
            figures.2,
            stat("ai_lb.session.response_recorded"),
            stat("ai_lb.session.continuation_unknown"),
            stat("ai_lb.session.rebound"),
        );
        Ok(figures)
    };
    // Side by side: each setup twice, interleaved, the figures of both rounds pooled by mean.
    let mut on = Vec::new();
    let mut off = Vec::new();
    for round in 0..2 {
        on.push(run(true, &format!("responses-agent-{round}"))?);
        off.push(run(false, &format!("responses-load-only-{round}"))?);
    }
    let mean = |v: &[(f64, f64, usize)], f: fn(&(f64, f64, usize)) -> f64| {
        v.iter().map(f).sum::<f64>() / v.len() as f64
    };
    let failed: usize = on.iter().chain(&off).map(|f| f.2).sum();
    anyhow::ensure!(failed == 0, "{failed} turns failed");
    let hit = mean(&on, |f| f.0);
    let ratio = mean(&on, |f| f.1) / mean(&off, |f| f.1);
    eprintln!(
        "load-only: continuations on their previous pod {:.3}",
        mean(&off, |f| f.0)
    );
    println!("BENCH responses_continuation_hit {hit:.3} ratio");
    println!("BENCH responses_continuation_ttft_p50_over_load_only {ratio:.2} ratio");
    Ok(())
}
