//! prefix_cache's `latencyModel` in the plain-Envoy build against the mock host
//! (docs/latency-model.md §5): requests are placed by the worker's predictions inside the local
//! pick, the warm pod is kept or left by the objective, only the lowest class is shed and a
//! shed request takes nothing, a model past `maxMAPE` gives way to the token gate and keeps
//! learning, and two workers sharing the proxy's shared data predict with each other's answers
//! (merged on the root tick; a failed merge loses nothing).

use crate::balancer::{shared, Balancer, Verdict};
use crate::config::{Build, PluginConfig};
use crate::host::mock::MockHost;
use crate::host::HostErrorKind;
use crate::host::LogLevel;
use crate::latency::record::Fleet;
use serde_json::{json, Value};

const DBG: &str = "x-dbg";
const EPS: [&str; 3] = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"];

/// A plain-Envoy prefix_cache config over `eps` with `latencyModel` = `latency` and `extra`
/// merged into its `lb_config`.
fn config(eps: &[&str], latency: &Value, extra: Value) -> PluginConfig {
    let mut lb = json!({"endpoints": eps, "debugHeader": DBG, "latencyModel": latency});
    if let (Some(lb), Some(extra)) = (lb.as_object_mut(), extra.as_object()) {
        lb.extend(extra.clone());
    }
    let cfg = json!({"lb_policy": "prefix_cache", "lb_config": lb});
    PluginConfig::parse_for(cfg.to_string().as_bytes(), Build::Envoy).unwrap()
}

fn proxy(eps: &[&str], latency: Value, extra: Value) -> (MockHost, Balancer) {
    let mut host = MockHost::new();
    host.now_ms = 1_000_000;
    let e = Balancer::configure(&mut host, config(eps, &latency, extra), 42, LogLevel::Trace);
    (host, e)
}

/// Another worker of `host`'s proxy: its own VM, the same shared data.
fn worker(host: &MockHost, eps: &[&str], latency: Value) -> (MockHost, Balancer) {
    let mut other = MockHost::new();
    other.shared = host.shared.clone();
    other.now_ms = host.now_ms;
    let cfg = config(eps, &latency, json!({}));
    let e = Balancer::configure(&mut other, cfg, 7, LogLevel::Trace);
    (other, e)
}

/// A new conversation's streamed first turn of about `tokens` prompt tokens (4 bytes each).
fn prompt(n: usize, tokens: usize) -> Vec<u8> {
    let text = format!("conversation {n}: {}", "word ".repeat(tokens * 4 / 5));
    json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": text}]})
        .to_string()
        .into_bytes()
}

/// Turn `turn` of a conversation over a long document (about 2,000 tokens), streamed.
fn doc(turn: usize) -> Vec<u8> {
    let mut messages = vec![
        json!({"role": "user", "content": format!("a long document {}", "text ".repeat(1_600))}),
    ];
    for t in 1..=turn {
        messages.push(json!({"role": "assistant", "content": format!("answer {t}")}));
        messages.push(json!({"role": "user", "content": format!("question {t}")}));
    }
    json!({"model": "m", "stream": true, "messages": messages})
        .to_string()
        .into_bytes()
}

/// A request sent and routed (its stream open): where it went, what the pick booked ahead of
/// it and for it, the debug header's fields.
struct Sent {
    ctx: u32,
    to: String,
    ahead: u64,
    own: u64,
    debug: String,
}

fn booked_on(host: &MockHost, pod: &str) -> u64 {
    let shared = host.shared.borrow();
    shared
        .iter()
        .filter(|(k, _)| k.starts_with("ailb.glr."))
        .flat_map(|(_, (v, _))| shared::decode_counts(v))
        .filter(|(line, _)| *line == format!("~p{pod}"))
        .map(|(_, n)| n)
        .sum()
}

/// Every count and booking left in this proxy's records.
fn held(host: &MockHost) -> u64 {
    let shared = host.shared.borrow();
    shared
        .iter()
        .filter(|(k, _)| k.starts_with("ailb.glr."))
        .flat_map(|(_, (v, _))| shared::decode_counts(v))
        .filter(|(line, _)| !line.starts_with("~r"))
        .map(|(_, n)| n)
        .sum()
}

fn send(
    host: &mut MockHost,
    e: &mut Balancer,
    ctx: u32,
    body: &[u8],
    headers: &[(&str, &str)],
) -> Sent {
    let before: Vec<u64> = EPS.iter().map(|p| booked_on(host, p)).collect();
    host.request_headers = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    host.body = body.to_vec();
    host.live_contexts.push(ctx);
    assert_eq!(e.on_request_headers(host, ctx, false), Verdict::Pause);
    e.on_request_body(host, ctx, body.len(), true);
    let header = |list: &[(String, String)], name: &str| {
        list.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let to = header(&host.request_headers, "x-gateway-destination-endpoint");
    let to = to.split(',').next().unwrap_or_default().to_string();
    let at = EPS.iter().position(|p| *p == to);
    let ahead = at.map_or(0, |i| before[i]);
    Sent {
        ctx,
        own: booked_on(host, &to).saturating_sub(ahead),
        ahead,
        to,
        debug: String::new(),
    }
}

/// Answers `s` as a pod prefilling `rate` tokens/s (one lane: the tokens booked ahead of it,
/// then its own, after 20 ms) and decoding `tpot` ms per token, 8 tokens, from `t0`.
fn answer(host: &mut MockHost, e: &mut Balancer, s: &mut Sent, t0: u64, (rate, tpot): (f64, f64)) {
    let ttft = 20.0 + (s.ahead + s.own) as f64 * 1000.0 / rate;
    host.now_ms = t0 + ttft as u64;
    host.response_headers = vec![
        (":status".into(), "200".into()),
        ("content-type".into(), "text/event-stream".into()),
    ];
    assert!(e.on_response_headers(host, s.ctx));
    s.debug = host
        .response_headers
        .iter()
        .find(|(k, _)| k == DBG)
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let token =
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
    host.response_body = token.as_bytes().to_vec();
    e.on_response_body(host, s.ctx, token.len(), false);
    host.now_ms += (7.0 * tpot) as u64;
    let usage = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\
                 \"completion_tokens\":8}}\n\ndata: [DONE]\n\n";
    host.response_body = usage.as_bytes().to_vec();
    e.on_response_body(host, s.ctx, usage.len(), true);
    assert!(
        !String::from_utf8_lossy(&host.response_body).contains("usage"),
        "the usage event the plugin asked for is taken out"
    );
    host.live_contexts.retain(|&c| c != s.ctx);
    e.on_done(host, s.ctx);
}

/// Pod i's speed: 10.0.0.1 prefills at 16,000 tokens/s, the others at 4,000.
fn speed(pod: &str) -> (f64, f64) {
    match pod {
        "10.0.0.1:8000" => (16_000.0, 10.0),
        _ => (4_000.0, 30.0),
    }
}

/// `batches` of three new prompts of 500-2,000 tokens in flight at once, each answered at its
/// pod's speed; a merge tick after each batch (the picks read the coefficients it solves).
fn learn(host: &mut MockHost, e: &mut Balancer, ctx: &mut u32, batches: usize) {
    for b in 0..batches {
        let t0 = host.now_ms;
        let mut sent: Vec<Sent> = (0..3)
            .map(|_| {
                *ctx += 1;
                let n = *ctx as usize;
                send(host, e, *ctx, &prompt(n, 500 + (n * 337) % 1_500), &[])
            })
            .collect();
        for s in sent.iter_mut() {
            let sp = speed(&s.to);
            answer(host, e, s, t0, sp);
        }
        host.now_ms = t0 + 10_000 + b as u64;
        e.on_tick(host);
    }
}

fn field<'a>(debug: &'a str, name: &str) -> Option<&'a str> {
    debug
        .split("; ")
        .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
}

#[test]
fn new_prompts_go_where_their_ttft_is_predicted_lowest() {
    let (mut host, mut e) = proxy(&EPS, json!({"mergeIntervalMs": 200}), json!({}));
    assert!(host.tick_ms.is_some_and(|t| t <= 100), "{:?}", host.tick_ms);
    let mut ctx = 0;
    learn(&mut host, &mut e, &mut ctx, 30);
    assert_eq!(host.metric("ai_lb.latency.samples"), 90);
    assert_eq!(host.metric("ai_lb.latency.bad_samples"), 0);
    assert!(host.metric("ai_lb.latency.merges") >= 30);
    assert_eq!(held(&host), 0, "every count and booking given back");
    // Six 2,000-token prompts at once: by request count each pod would take two; by
    // predicted TTFT the fast pod takes most (2,000 tokens in 145 ms, a slow pod in 520 ms).
    let t0 = host.now_ms;
    let mut sent: Vec<Sent> = (0..6)
        .map(|i| {
            send(
                &mut host,
                &mut e,
                1_000 + i,
                &prompt(900 + i as usize, 2_000),
                &[],
            )
        })
        .collect();
    let on_fast = sent.iter().filter(|s| s.to == EPS[0]).count();
    assert!(on_fast >= 4, "{on_fast} of 6 on the fast pod");
    for s in sent.iter_mut() {
        let sp = speed(&s.to);
        answer(&mut host, &mut e, s, t0, sp);
        let ttft = field(&s.debug, "predicted_ttft_ms")
            .unwrap()
            .parse::<f64>()
            .unwrap() as u64;
        let truth = 20 + (s.ahead + s.own) * 1000 / speed(&s.to).0 as u64;
        // Within a quarter: a pod's few dozen samples still feel the fleet prior's pull
        // (docs/latency-model.md §3).
        assert!(
            ttft.abs_diff(truth) * 4 <= truth,
            "{}: {ttft} ms, truth {truth}",
            s.debug
        );
        assert!(
            field(&s.debug, "predicted_tpot_ms").is_some(),
            "{}",
            s.debug
        );
        assert!(s.debug.contains("reason=prefix_miss"), "{}", s.debug);
    }
    assert_eq!(held(&host), 0);
}

#[test]
fn the_warm_pod_is_kept_while_it_meets_the_objective() {
    // No samples yet: every pod is predicted at the configured 1,000 tokens/s.
    let gate = json!({"peakPrefillThroughput": 1_000, "maxTTFTPenaltyMs": 500});
    let (mut host, mut e) = proxy(&EPS, json!({}), gate);
    let first = send(&mut host, &mut e, 1, &doc(0), &[]);
    let mut s = first;
    let t0 = host.now_ms;
    answer(&mut host, &mut e, &mut s, t0, (1_000.0, 10.0));
    let warm = s.to.clone();
    // 3,000 tokens booked ahead on the warm pod: about 3,000 ms there against about 2,000 ms
    // for the whole prompt on a cold one.
    let set_booked = |host: &mut MockHost, tokens: u64| {
        let mut shared = host.shared.borrow_mut();
        for (key, (v, _)) in shared.iter_mut() {
            if key.starts_with("ailb.glr.") {
                let mut counts = shared::decode_counts(v);
                counts.insert(format!("~p{warm}"), tokens);
                *v = shared::encode_counts(&counts);
            }
        }
    };
    type Case<'a> = (u32, &'a [(&'a str, &'a str)], bool, &'a str);
    let cases: [Case; 4] = [
        (2, &[("x-slo-ttft-ms", "4000")], true, "meets 4 s: kept"),
        (
            3,
            &[("x-slo-ttft-ms", "2500")],
            false,
            "misses 2.5 s, a cold pod meets it",
        ),
        (
            4,
            &[],
            false,
            "no objective: 1 s slower than a cold pod, past the 500 ms penalty",
        ),
        (
            5,
            &[("x-slo-ttft-ms", "abc")],
            false,
            "a bad header: the route's (none)",
        ),
    ];
    for (ctx, headers, kept, says) in cases {
        set_booked(&mut host, 3_000);
        let mut s = send(&mut host, &mut e, ctx, &doc(1), headers);
        let t0 = host.now_ms;
        answer(&mut host, &mut e, &mut s, t0, (1_000.0, 10.0));
        let reason = if kept {
            "reason=prefix_hit"
        } else {
            "reason=prefix_spill"
        };
        assert_eq!(s.to == warm, kept, "{says}: {}", s.debug);
        assert!(s.debug.contains(reason), "{says}: {}", s.debug);
    }
    assert_eq!(host.metric("ai_lb.latency.bad_objective"), 1);
    set_booked(&mut host, 0);
    assert_eq!(held(&host), 0);
}

#[test]
fn only_the_lowest_class_is_shed_and_a_shed_request_takes_nothing() {
    let extra = json!({"priorityHeader": "x-priority", "maxRequestCount": 1000,
        "peakPrefillThroughput": 1_000});
    let (mut host, mut e) = proxy(&EPS, json!({}), extra);
    // 2,000 tokens at 1,000 tokens/s against a 1 ms objective: a miss of 2,000, shed with
    // probability 1 - 1/2,000.
    let slo = ("x-slo-ttft-ms", "1");
    let mut shed = 0;
    for ctx in 1..=20 {
        let mut s = send(
            &mut host,
            &mut e,
            ctx,
            &doc(0),
            &[slo, ("x-priority", "sheddable")],
        );
        if host.local_responses.len() > shed {
            shed += 1;
            assert_eq!(host.local_responses[shed - 1].0, 429);
            assert!(s.to.is_empty());
            assert_eq!(held(&host), 0, "nothing counted, nothing booked");
            host.live_contexts.retain(|&c| c != ctx);
            e.on_done(&mut host, ctx);
        } else {
            let t0 = host.now_ms;
            answer(&mut host, &mut e, &mut s, t0, (1_000.0, 10.0));
        }
    }
    assert!(shed >= 18, "{shed} of 20 shed");
    assert_eq!(host.metric("ai_lb.latency.shed"), shed as i64);
    for (ctx, class) in [(30, "critical"), (31, "standard")] {
        let mut s = send(
            &mut host,
            &mut e,
            ctx,
            &doc(0),
            &[slo, ("x-priority", class)],
        );
        assert!(!s.to.is_empty(), "{class} is never shed");
        let t0 = host.now_ms;
        answer(&mut host, &mut e, &mut s, t0, (1_000.0, 10.0));
    }
    assert_eq!(host.local_responses.len(), shed);
    assert_eq!(held(&host), 0);
}

#[test]
fn a_model_past_its_error_bound_gives_way_to_the_token_gate_and_keeps_learning() {
    let (mut host, mut e) = proxy(&EPS[..1], json!({"maxMAPE": 0.01}), json!({}));
    // Answers that no linear model predicts within 1 %: every other one three times slower.
    for ctx in 1..=60u32 {
        let mut s = send(&mut host, &mut e, ctx, &prompt(ctx as usize, 1_000), &[]);
        let rate = if ctx % 2 == 0 { 4_000.0 } else { 12_000.0 };
        let t0 = host.now_ms;
        answer(&mut host, &mut e, &mut s, t0, (rate, 10.0));
        let predicted = field(&s.debug, "predicted_ttft_ms").is_some();
        let fallback = host.metric("ai_lb.latency.fallback");
        assert_eq!(predicted, fallback == 0, "{ctx}: {}", s.debug);
        host.now_ms += 1_000;
    }
    let fallback = host.metric("ai_lb.latency.fallback");
    assert!(fallback > 0, "the bound was never crossed");
    assert_eq!(host.metric("ai_lb.latency.placed") + fallback, 60);
    assert_eq!(
        host.metric("ai_lb.latency.samples"),
        60,
        "every answer learnt"
    );
    let warned = host
        .logs
        .borrow()
        .iter()
        .any(|(_, l)| l.contains("past maxMAPE"));
    assert!(warned);
    assert_eq!(held(&host), 0);
}

#[test]
fn two_workers_predict_with_each_others_answers_and_a_failed_merge_loses_nothing() {
    // A day's half-life: the records hardly fade over the test's few minutes.
    let latency = json!({"mergeIntervalMs": 100, "halfLifeS": 86_400});
    let (mut h1, mut w1) = proxy(&EPS, latency.clone(), json!({}));
    let (mut h2, mut w2) = worker(&h1, &EPS, latency);
    let mut ctx = 0;
    learn(&mut h1, &mut w1, &mut ctx, 20);
    // A sample learnt since worker 1's last merge, whose next merge the host refuses: kept
    // for the one after.
    let t = h1.now_ms + 1_000;
    h1.now_ms = t;
    let mut s = send(&mut h1, &mut w1, 500, &prompt(500, 1_000), &[]);
    let sp = speed(&s.to);
    answer(&mut h1, &mut w1, &mut s, t, sp);
    h1.shared_set_status = Some(HostErrorKind::InternalFailure);
    h1.now_ms = t + 5_000;
    w1.on_tick(&mut h1);
    assert_eq!(h1.metric("ai_lb.latency.merge_failures"), 1);
    h1.shared_set_status = None;
    h1.now_ms = t + 10_000;
    w1.on_tick(&mut h1);
    let records = {
        let shared = h1.shared.borrow();
        let (_, (text, _)) = shared
            .iter()
            .find(|(k, _)| k.starts_with("ailb.lat."))
            .expect("the proxy's record");
        Fleet::parse(text)
    };
    let weight: f64 = records.pods.iter().map(|(_, v)| v[9]).sum();
    assert!(
        (weight - 61.0).abs() < 1.0,
        "all 61 samples merged: {weight}"
    );
    assert_eq!(records.pods.len(), 3);
    // Worker 2 never served a request: its tick reads worker 1's models, and its picks go
    // where they predict.
    h2.now_ms = t + 10_050;
    w2.on_tick(&mut h2);
    assert_eq!(h2.metric("ai_lb.latency.merges"), 1);
    let mut s = send(&mut h2, &mut w2, 1, &prompt(7_000, 2_000), &[]);
    assert_eq!(s.to, EPS[0], "the fast pod, learnt by the other worker");
    let t0 = h2.now_ms;
    answer(&mut h2, &mut w2, &mut s, t0, speed(EPS[0]));
    let ttft = field(&s.debug, "predicted_ttft_ms")
        .unwrap()
        .parse::<f64>()
        .unwrap() as u64;
    let truth = 20 + s.own * 1000 / 16_000;
    assert!(
        ttft.abs_diff(truth) * 5 <= truth,
        "{ttft} ms, truth {truth}"
    );
    assert_eq!(held(&h2), 0);
}

/// Sets this proxy's booked prefill tokens of `pod` (the counts record's `~p` line).
fn set_booked(host: &mut MockHost, pod: &str, tokens: u64) {
    let eps: Vec<String> = EPS.iter().map(|e| e.to_string()).collect();
    let key = crate::balancer::policies::least_request::counts::counts_key(&eps);
    let r = shared::update(host, &key, |cur| {
        let mut counts = cur.map(|v| shared::decode_counts(&v)).unwrap_or_default();
        counts.insert(format!("~p{pod}"), tokens);
        counts.retain(|_, n| *n > 0);
        (shared::encode_counts(&counts), ())
    });
    assert!(r.is_ok());
}

#[test]
fn a_pod_at_its_cap_is_no_choice_and_a_kept_session_wins_over_the_prediction() {
    let extra = json!({"peakPrefillThroughput": 1_000, "maxRequestCount": 1,
        "sessionHeader": "x-session-id"});
    let (mut host, mut e) = proxy(&EPS, json!({}), extra);
    // 100,000 tokens booked on every pod but the first: the models prefer it by far.
    set_booked(&mut host, EPS[1], 100_000);
    set_booked(&mut host, EPS[2], 100_000);
    let mut first = send(&mut host, &mut e, 1, &prompt(1, 1_000), &[]);
    assert_eq!(first.to, EPS[0]);
    // While the first holds its one slot, the next goes to a slow pod.
    let mut second = send(&mut host, &mut e, 2, &prompt(2, 1_000), &[]);
    assert!(second.to == EPS[1] || second.to == EPS[2], "{}", second.to);
    let t0 = host.now_ms;
    answer(&mut host, &mut e, &mut first, t0, (1_000.0, 10.0));
    answer(&mut host, &mut e, &mut second, t0, (1_000.0, 10.0));
    set_booked(&mut host, EPS[1], 0);
    set_booked(&mut host, EPS[2], 0);
    // A session's pod, then 100,000 tokens booked there: a new prompt is placed elsewhere,
    // the session's next request stays.
    let session = [("x-session-id", "s-1")];
    let mut s = send(&mut host, &mut e, 3, &prompt(3, 1_000), &session);
    let home = s.to.clone();
    let t0 = host.now_ms;
    answer(&mut host, &mut e, &mut s, t0, (1_000.0, 10.0));
    set_booked(&mut host, &home, 100_000);
    let mut other = send(&mut host, &mut e, 4, &prompt(4, 1_000), &[]);
    assert_ne!(other.to, home);
    answer(&mut host, &mut e, &mut other, t0, (1_000.0, 10.0));
    let mut again = send(&mut host, &mut e, 5, &prompt(5, 1_000), &session);
    answer(&mut host, &mut e, &mut again, t0, (1_000.0, 10.0));
    assert_eq!(again.to, home, "{}", again.debug);
    assert!(again.debug.contains("reason=session"), "{}", again.debug);
    set_booked(&mut host, &home, 0);
    assert_eq!(held(&host), 0);
}
