//! Agent sessions end to end (docs/sessions-and-queues.md "Agent sessions"): two emulator
//! gateways × two workers in front of fake pods, one real redis-server, no session key
//! configured. Responses chains (`previous_response_id`, streamed or not) continue on the pod
//! that produced their previous answer whichever gateway takes them — the fake pods keep their
//! responses per pod as vLLM does, so a continuation sent elsewhere would be a 404 —, an agent's
//! own session header keeps its pod, a route can turn both off, and bad input is placed and
//! counted without leaving anything behind.

use ailb_e2e::bed::{chat_body, probe_until_zero, wait_for_zero, Bed};
use ailb_e2e::gateway::{glr_config, http, Gateway};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::time::Duration;

const DEBUG: &str = "x-ai-lb-debug";

/// What one request got: status, pod, debug reason, and the answer's own id.
#[derive(Debug, Clone)]
struct Got {
    status: u16,
    pod: String,
    reason: String,
    id: Option<String>,
}

fn send(gw: &Gateway, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Got {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let (status, headers, body) = http(&gw.url, "POST", path, &all, body).unwrap();
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let text = String::from_utf8_lossy(&body);
    // A JSON answer's id, or a stream's first event's `response.id`.
    let id = match serde_json::from_str::<Value>(&text) {
        Ok(v) => v["id"].as_str().map(String::from),
        Err(_) => text
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .and_then(|d| serde_json::from_str::<Value>(d).ok())
            .and_then(|v| v["response"]["id"].as_str().map(String::from)),
    };
    Got {
        status,
        pod: get("x-pod"),
        reason: get(DEBUG).rsplit("reason=").next().unwrap_or("").into(),
        id,
    }
}

fn responses_turn(gw: &Gateway, input: &str, previous: Option<&str>, stream: bool) -> Got {
    let mut body = json!({"model": "fake-model", "input": input, "max_output_tokens": 3,
        "stream": stream});
    if let Some(p) = previous {
        body["previous_response_id"] = json!(p);
    }
    send(gw, "/v1/responses", &[], body.to_string().as_bytes())
}

/// `chains` Responses conversations of `turns` turns at once, each turn through the other
/// gateway, every other chain streamed: every turn's result.
fn chains(a: &Gateway, b: &Gateway, chains: usize, turns: usize) -> Vec<Vec<Got>> {
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..chains)
            .map(|c| {
                s.spawn(move || {
                    let mut prev: Option<String> = None;
                    (0..turns)
                        .map(|t| {
                            let gw = if (c + t) % 2 == 0 { a } else { b };
                            let input = format!("chain {c} turn {t} ").repeat(20);
                            let got = responses_turn(gw, &input, prev.as_deref(), c % 2 == 1);
                            prev = got.id.clone();
                            got
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

fn sum(gws: [&Gateway; 2], stat: &str) -> i64 {
    gws.iter().map(|g| g.stat(stat)).sum()
}

#[test]
fn responses_chains_continue_on_their_pod_across_gateways() {
    let bed = Bed::new(4, |c| {
        c.decode_us_per_token = 1_000;
        c.prefill_us_per_token = 5;
    });
    let (n, turns) = (12, 5);
    for policy in ["global_least_request", "prefix_cache"] {
        bed.redis.cmd(&["FLUSHALL"]);
        let mut cfg = glr_config(bed.redis.port, json!({"debugHeader": DEBUG}));
        cfg["lb_policy"] = json!(policy);
        let a = bed.gateway(&bed.spec(&format!("{policy}-a"), Some(cfg.clone())));
        let b = bed.gateway(&bed.spec(&format!("{policy}-b"), Some(cfg)));
        let runs = chains(&a, &b, n, turns);
        let mut pods = HashSet::new();
        for (c, run) in runs.iter().enumerate() {
            let first = &run[0];
            assert_eq!(first.status, 200, "{policy} chain {c}: {first:?}");
            assert!(first.id.as_deref().is_some_and(|i| i.starts_with("resp-")));
            pods.insert(first.pod.clone());
            for (t, got) in run.iter().enumerate().skip(1) {
                // Another pod would not know the previous response: a 404.
                assert_eq!(got.status, 200, "{policy} chain {c} turn {t}: {got:?}");
                assert_eq!(
                    (got.pod.as_str(), got.reason.as_str()),
                    (first.pod.as_str(), "continuation"),
                    "{policy} chain {c} turn {t}"
                );
            }
        }
        assert!(
            pods.len() >= 2,
            "{policy}: chains spread over the pods: {pods:?}"
        );
        let continued = (n * (turns - 1)) as i64;
        assert_eq!(sum([&a, &b], "ai_lb.session.hit"), continued, "{policy}");
        assert_eq!(sum([&a, &b], "ai_lb.session.agent"), continued, "{policy}");
        assert_eq!(
            sum([&a, &b], "ai_lb.session.response_recorded"),
            (n * turns) as i64,
            "{policy}"
        );
        assert_eq!(sum([&a, &b], "ai_lb.session.continuation_unknown"), 0);
        // One key per answer, in the route's hash tag, with agentSessionTTL.
        let keys = bed.redis.cmd(&["KEYS", "*:resp:*"]);
        let keys: Vec<String> = match keys {
            ailb_core::redis::resp::Value::Array(Some(items)) => items
                .iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect(),
            other => panic!("{other:?}"),
        };
        assert_eq!(keys.len(), n * turns, "{policy}");
        assert!(
            keys.iter().all(|k| k.starts_with("ailb:{llm-route|")),
            "{keys:?}"
        );
        let ttl = bed.redis.cmd(&["TTL", keys[0].as_str()]).as_i64().unwrap();
        assert!((1..=1800).contains(&ttl), "{ttl}");
        assert!(
            wait_for_zero(&bed, Duration::from_secs(5)).is_zero(),
            "{policy}: leases"
        );
    }
}

#[test]
fn an_agents_own_header_keeps_its_pod_and_a_route_can_turn_it_off() {
    let bed = Bed::new(3, |c| {
        c.decode_us_per_token = 1_000;
        c.prefill_us_per_token = 1;
    });
    let on = glr_config(bed.redis.port, json!({"debugHeader": DEBUG}));
    let off = glr_config(
        bed.redis.port,
        json!({"debugHeader": DEBUG, "agentSessions": false}),
    );
    let (a, b) = (
        bed.gateway(&bed.spec("on-a", Some(on.clone()))),
        bed.gateway(&bed.spec("on-b", Some(on))),
    );
    let huge = "h".repeat(10 * 1024);
    let sessions = [
        ("x-claude-code-session-id", "cc-1".to_string()),
        ("session_id", "codex-1".to_string()),
        (
            "x-session-affinity",
            "\u{4f1a}\u{8bdd}-opencode".to_string(),
        ),
        ("x-session-id", huge),
    ];
    for (name, id) in &sessions {
        let turns: Vec<Got> = (0..6)
            .map(|t| {
                let gw = if t % 2 == 0 { &a } else { &b };
                send(
                    gw,
                    "/v1/chat/completions",
                    &[(name, id)],
                    &chat_body("hi", 2),
                )
            })
            .collect();
        assert!(turns.iter().all(|g| g.status == 200), "{name}: {turns:?}");
        assert!(
            turns.iter().all(|g| g.pod == turns[0].pod),
            "{name}: {turns:?}"
        );
        assert!(
            turns[1..].iter().all(|g| g.reason == "agent_session"),
            "{name}"
        );
    }
    assert_eq!(sum([&a, &b], "ai_lb.session.agent"), 24);
    assert_eq!(sum([&a, &b], "ai_lb.session.bound"), 4);
    assert_eq!(sum([&a, &b], "ai_lb.session.hit"), 20);
    // Turned off: least request, nothing recognised or recorded.
    let c = bed.gateway(&bed.spec("off", Some(off)));
    let mut pods = HashSet::new();
    for _ in 0..6 {
        let got = send(
            &c,
            "/v1/chat/completions",
            &[("session_id", "codex-1")],
            &chat_body("hi", 2),
        );
        assert_eq!(got.reason, "least_request");
        pods.insert(got.pod);
    }
    assert!(pods.len() >= 2, "{pods:?}");
    let got = responses_turn(&c, "hello", None, false);
    assert_eq!(got.status, 200);
    assert_eq!(c.stat("ai_lb.session.agent"), 0);
    assert_eq!(c.stat("ai_lb.session.response_recorded"), 0);
    assert!(wait_for_zero(&bed, Duration::from_secs(5)).is_zero());
}

#[test]
fn unknown_and_garbage_previous_responses_are_placed_and_counted() {
    let bed = Bed::new(2, |c| {
        c.decode_us_per_token = 1_000;
        c.prefill_us_per_token = 1;
    });
    let gw = bed.gateway(&bed.spec(
        "gw",
        Some(glr_config(bed.redis.port, json!({"debugHeader": DEBUG}))),
    ));
    // Unknown: placed by the policy (the fake pod then answers 404, as vLLM would).
    let got = responses_turn(&gw, "x", Some("resp-never-produced"), false);
    assert_eq!((got.status, got.reason.as_str()), (404, "least_request"));
    assert_eq!(gw.stat("ai_lb.session.continuation_unknown"), 1);
    // Garbage: not a response id (a number, an object, 100 KB): counted, placed, answered.
    let long = "r".repeat(100 * 1024);
    for (i, garbage) in [json!(7), json!({"id": "resp-1"}), json!(long)]
        .into_iter()
        .enumerate()
    {
        let body = json!({"model": "fake-model", "input": "x", "max_output_tokens": 2,
            "previous_response_id": garbage});
        let got = send(&gw, "/v1/responses", &[], body.to_string().as_bytes());
        assert_eq!(got.reason, "least_request", "{i}");
        assert_eq!(gw.stat("ai_lb.session.continuation_unknown"), 2 + i as i64);
    }
    // A body that is not JSON: the pod's 400, nothing recognised, nothing held.
    let got = send(&gw, "/v1/responses", &[], b"{not json");
    assert_eq!(got.status, 400);
    // An error answer records nothing.
    let before = gw.stat("ai_lb.session.response_recorded");
    let got = send(
        &gw,
        "/v1/responses",
        &[("x-fake-fault", "status:500")],
        json!({"input": "x"}).to_string().as_bytes(),
    );
    assert_eq!(got.status, 500);
    assert_eq!(gw.stat("ai_lb.session.response_recorded"), before);
    // The 500's count stays on its pod for failurePenaltyMs (failure memory,
    // docs/redis-data-model.md §14) until a pick's reclaim gives it back: probes drive it.
    assert!(probe_until_zero(&bed, &gw.url, Duration::from_secs(10)).is_zero());
}
