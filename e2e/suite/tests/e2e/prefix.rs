//! prefix_cache end to end: the built plugin in two emulator gateways (2 workers each), four
//! fake pods with per-pod prefix caches, one real redis-server.

use ailb_e2e::bed::{wait_for_zero, Bed};
use ailb_e2e::gateway::{http, Gateway};
use ailb_testkit::wait_until;
use serde_json::{json, Value};
use std::time::Duration;

fn prefix_config(port: u16, extra: Value) -> Value {
    let mut lb = json!({"serviceFQDN": "redis.static", "servicePort": port, "timeout": 1000, "affinityMaxImbalance": 3, "affinityMaxImbalanceRatio": 1.5});
    if let (Some(lb), Some(extra)) = (lb.as_object_mut(), extra.as_object()) {
        lb.extend(extra.clone());
    }
    json!({"lb_policy": "prefix_cache", "lb_config": lb})
}

fn bed() -> Bed {
    Bed::new(4, |c| {
        c.max_running = 32;
        c.decode_us_per_token = 1_000;
        c.prefill_us_per_token = 10;
    })
}

fn two_gateways(bed: &Bed) -> (Gateway, Gateway) {
    two_gateways_with(bed, json!({}))
}

fn two_gateways_with(bed: &Bed, extra: Value) -> (Gateway, Gateway) {
    let cfg = prefix_config(bed.redis.port, extra);
    (
        bed.gateway(&bed.spec("px-a", Some(cfg.clone()))),
        bed.gateway(&bed.spec("px-b", Some(cfg))),
    )
}

/// Sends one chat turn; returns the pod that answered.
fn send(gw: &Gateway, messages: &[Value], max_tokens: u64) -> String {
    send_to(&gw.url, messages, max_tokens)
}

/// [`send`] by the gateway's URL (for a thread of its own).
fn send_to(url: &str, messages: &[Value], max_tokens: u64) -> String {
    let body =
        json!({"model": "fake-model", "messages": messages, "max_tokens": max_tokens}).to_string();
    let (status, headers, _) = http(
        url,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        body.as_bytes(),
    )
    .unwrap();
    assert_eq!(status, 200);
    headers
        .iter()
        .find(|(k, _)| k == "x-pod")
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

fn system(text: &str) -> Value {
    json!({"role": "system", "content": text})
}

fn user(text: String) -> Value {
    json!({"role": "user", "content": text})
}

#[test]
fn it_keeps_multi_turn_sessions_on_one_pod_across_gateways() {
    let bed = bed();
    let (a, b) = two_gateways(&bed);
    for s in 0..8 {
        let mut messages = vec![system(&format!(
            "You are assistant number {s}. {}",
            "Be concise. ".repeat(20)
        ))];
        let mut pods = Vec::new();
        for round in 0..4 {
            messages.push(user(format!(
                "session {s} question {round}: {}",
                "tell me more ".repeat(10)
            )));
            // Alternate gateways: the affinity lives in Redis, not in a gateway.
            let gw = if round % 2 == 0 { &a } else { &b };
            pods.push(send(gw, &messages, 2));
            messages.push(json!({"role": "assistant", "content": format!("answer {round}")}));
        }
        assert!(
            pods.iter().all(|p| *p == pods[0]),
            "session {s} moved: {pods:?}"
        );
    }
    assert!(
        a.stat("ai_lb.prefix.hit") + b.stat("ai_lb.prefix.hit") >= 24,
        "3 of 4 turns per session hit"
    );
    assert!(wait_for_zero(&bed, Duration::from_secs(5)).is_zero());
}

/// By default a match on the system prompt alone is no reason to prefer a pod
/// (`prefixAnchor: conversation`): new conversations under one system prompt spread over the
/// pods by load, while each conversation's next turn still follows its own pod.
#[test]
fn it_spreads_new_conversations_under_one_system_prompt() {
    let bed = bed();
    let (a, b) = two_gateways(&bed);
    let sys = system(&format!(
        "Shared system prompt. {}",
        "Rules apply. ".repeat(40)
    ));
    // Each first turn is held in flight while the next arrives, so the least-loaded choice
    // must move on; a preamble match would pull every one of them to the same pod.
    let first: Vec<_> = (0..8)
        .map(|q| {
            let gw = if q % 2 == 0 {
                a.url.clone()
            } else {
                b.url.clone()
            };
            let sys = sys.clone();
            let t = std::thread::spawn(move || {
                send_to(&gw, &[sys, user(format!("conversation {q}"))], 300)
            });
            std::thread::sleep(Duration::from_millis(20));
            t
        })
        .collect();
    let pods: Vec<String> = first.into_iter().map(|t| t.join().unwrap()).collect();
    let distinct: std::collections::BTreeSet<&String> = pods.iter().collect();
    assert!(
        distinct.len() >= 3,
        "8 conversations under one system prompt piled up: {pods:?}"
    );
    let hits = a.stat("ai_lb.prefix.hit") + b.stat("ai_lb.prefix.hit");
    assert_eq!(hits, 0, "no first turn matched the shared system prompt");
    // The next turn of each conversation goes where its first turn went.
    for (q, pod) in pods.iter().enumerate() {
        let gw = if q % 2 == 0 { &b } else { &a };
        let next = send(
            gw,
            &[
                sys.clone(),
                user(format!("conversation {q}")),
                json!({"role": "assistant", "content": "ok"}),
                user("and then?".into()),
            ],
            1,
        );
        assert_eq!(&next, pod, "conversation {q} left its pod");
    }
}

/// `prefixAnchor: preamble`: one long system prompt serving many short conversations keeps
/// them on the pod that holds it.
#[test]
fn it_sends_different_questions_under_one_system_prompt_to_its_pod() {
    let bed = bed();
    let (a, b) = two_gateways_with(&bed, json!({"prefixAnchor": "preamble"}));
    let sys = system(&format!(
        "Shared system prompt. {}",
        "Rules apply. ".repeat(40)
    ));
    let home = send(&a, &[sys.clone(), user("first question".into())], 1);
    for q in 0..6 {
        let gw = if q % 2 == 0 { &a } else { &b };
        let pod = send(
            gw,
            &[sys.clone(), user(format!("a different question {q}"))],
            1,
        );
        assert_eq!(
            pod, home,
            "question {q} should share the system prompt's block"
        );
    }
}

#[test]
fn it_spills_a_hot_prefix_and_brings_it_back() {
    let bed = bed();
    let (a, b) = two_gateways_with(&bed, json!({"prefixAnchor": "preamble"}));
    let sys = system(&format!(
        "Hot system prompt. {}",
        "Policy text. ".repeat(40)
    ));
    let home = send(&a, &[sys.clone(), user("warm up".into())], 1);
    // Six long requests under the same prefix pile onto its pod (within the thresholds at
    // first), then the guard sends the rest elsewhere.
    let routed = || a.stat("ai_lb.prefix.routed") + b.stat("ai_lb.prefix.routed");
    let routed_before = routed();
    let held: Vec<_> = (0..10)
        .map(|i| {
            let (url, sys) = (if i % 2 == 0 { a.url.clone() } else { b.url.clone() }, sys.clone());
            std::thread::spawn(move || {
                let body = json!({"model": "fake-model", "messages": [sys, {"role": "user", "content": format!("long {i}")}], "max_tokens": 1500}).to_string();
                let (_, headers, _) = http(&url, "POST", "/v1/chat/completions", &[("content-type", "application/json")], body.as_bytes()).unwrap();
                headers.iter().find(|(k, _)| k == "x-pod").map(|(_, v)| v.clone()).unwrap_or_default()
            })
        })
        .collect();
    assert!(
        wait_until(Duration::from_secs(5), || routed() >= routed_before + 10),
        "all 10 routed"
    );
    let on_home = bed
        .counts()
        .load
        .get(
            &bed.pods
                .iter()
                .find(|p| p.name == home)
                .unwrap()
                .addr
                .to_string(),
        )
        .copied()
        .unwrap_or(0.0);
    let spills = a.stat("ai_lb.prefix.spill") + b.stat("ai_lb.prefix.spill");
    eprintln!("in flight on the home pod {on_home}, spills {spills}");
    assert!(
        spills >= 3,
        "a hot prefix must spill once its pod is overloaded"
    );
    assert!(
        on_home <= 5.0,
        "the guard bounds the home pod's load: {on_home}"
    );
    let pods: Vec<String> = held.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(pods.iter().any(|p| *p != home), "{pods:?}");
    // Load evened out: the prefix brings new questions home again.
    assert!(wait_for_zero(&bed, Duration::from_secs(10)).is_zero());
    assert_eq!(
        send(&b, &[sys.clone(), user("after the storm".into())], 1),
        home
    );
}

#[test]
fn it_moves_a_dead_pods_prefixes() {
    let bed = bed();
    let (a, b) = two_gateways(&bed);
    let mut messages = vec![
        system("Session about a pod that dies."),
        user("first".into()),
    ];
    let home = send(&a, &messages, 1);
    bed.mark_unhealthy(&home, &[&a, &b]);
    messages.push(json!({"role": "assistant", "content": "ok"}));
    messages.push(user("second".into()));
    let moved = send(&b, &messages, 1);
    assert_ne!(moved, home, "a departed pod's prefix is not followed");
    messages.push(json!({"role": "assistant", "content": "ok"}));
    messages.push(user("third".into()));
    assert_eq!(
        send(&a, &messages, 1),
        moved,
        "and the conversation stays on its new pod"
    );
}

/// The token gate's bookkeeping end to end (docs/redis-data-model.md §13): a streamed prompt's
/// uncached tokens are booked on its pod until its first bytes, given back while the stream
/// still runs, and its time to first bytes teaches the pod's prefill rate; nothing is left
/// booked when every stream has ended.
#[test]
fn a_streams_prefill_booking_goes_back_at_its_first_bytes_and_teaches_the_rate() {
    let bed = Bed::new(2, |c| {
        c.max_running = 32;
        c.decode_us_per_token = 20_000; // 40 tokens: 0.8 s of streaming after the first bytes
        c.prefill_us_per_token = 50; // 20,000 tokens/s
    });
    let (a, _b) = two_gateways(&bed);
    let keys = ailb_core::redis::scripts::Keys::new(
        "ailb",
        ailb_e2e::gateway::ROUTE,
        ailb_e2e::gateway::CLUSTER,
    );
    for turn in 0..3 {
        let doc = format!(
            "turn {turn} document: {}",
            "words of a long shared text. ".repeat(600)
        );
        let body = json!({"model": "fake-model", "stream": true, "max_tokens": 40,
            "messages": [user(doc)]})
        .to_string();
        let url = a.url.clone();
        let stream = std::thread::spawn(move || {
            http(
                &url,
                "POST",
                "/v1/chat/completions",
                &[("content-type", "application/json")],
                body.as_bytes(),
            )
            .map(|(status, _, body)| (status, String::from_utf8_lossy(&body).into_owned()))
        });
        // Held: one lease, its booking given back once the first bytes came (within a tick).
        let given_back = wait_until(Duration::from_secs(3), || {
            let c = bed.counts();
            c.leases == 1 && c.bookings == 0 && c.prefill == 0.0
        });
        assert!(
            given_back && !stream.is_finished(),
            "turn {turn}: {:?}",
            bed.counts()
        );
        let (status, text) = stream.join().unwrap().unwrap();
        assert_eq!(status, 200);
        assert!(text.contains("data: [DONE]"), "streamed");
    }
    assert!(wait_for_zero(&bed, Duration::from_secs(5)).is_zero());
    assert!(a.stat("ai_lb.prefix.first_bytes_sent") >= 1);
    // ~4,400 tokens at 20,000 tokens/s on a pod that had nothing ahead: the rate learned is
    // of that order (the time to first bytes also holds the gateway and the first decode step).
    let rates: Vec<i64> = bed
        .pods
        .iter()
        .filter_map(|p| {
            ailb_testkit::try_cmd(bed.redis.port, &["HGET", &keys.rates, &p.addr.to_string()])
                .and_then(|v| v.as_str().and_then(|s| s.parse().ok()))
        })
        .collect();
    assert!(!rates.is_empty(), "no rate learned");
    assert!(
        rates.iter().all(|&r| (4_000..=40_000).contains(&r)),
        "{rates:?} tokens/s"
    );
}
