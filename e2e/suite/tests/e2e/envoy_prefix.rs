//! prefix_cache without Redis in real Envoy 1.40: two Envoy processes × two workers in front of
//! the same fake pods, sharing nothing (docs/redis-data-model.md §9). Conversations keep their
//! pod across both proxies, identical openings land together, with `prefixAnchor: preamble` a
//! shared system prompt lands together too, a hot conversation spills to the same next pod, a
//! dead pod's conversations move to one pod (the ring's next, used by Envoy's retry) from both
//! proxies, and a pod whose scraped queue is full is left until it recovers.

use ailb_e2e::bed::Bed;
use ailb_e2e::envoy::{Envoy, SCRAPE_CLUSTER};
use ailb_e2e::gateway::http;
use ailb_fakepod::MetricsSource;
use ailb_testkit::wait_until;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const SYSTEM: &str = "You are a meticulous support engineer for a cloud storage product. Answer \
    precisely, cite the documentation section when you can, never invent API names, and keep \
    answers under two hundred words unless asked for detail.";

fn bed(pods: usize) -> Bed {
    Bed::new(pods, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 10_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 20;
    })
}

/// The prefix_cache config with `extra` merged into its `lb_config`.
fn plugin_with(pods: &[String], extra: Value) -> Value {
    let mut lb = json!({"endpoints": pods, "debugHeader": "x-ai-lb-debug"});
    if let (Some(lb), Some(extra)) = (lb.as_object_mut(), extra.as_object()) {
        lb.extend(extra.clone());
    }
    json!({"lb_policy": "prefix_cache", "lb_config": lb})
}

/// Two Envoys (2 workers each) with the same prefix_cache config.
fn envoys(bed: &Bed) -> [Envoy; 2] {
    envoys_with(bed, json!({}))
}

fn envoys_with(bed: &Bed, extra: Value) -> [Envoy; 2] {
    let pods = bed.pod_addrs();
    [
        Envoy::start(&pods, &plugin_with(&pods, extra.clone())),
        Envoy::start(&pods, &plugin_with(&pods, extra)),
    ]
}

/// Conversation `topic` at turn `turn`: the system prompt, the earlier exchanges, the next
/// question.
fn turn_body(topic: &str, opening: &str, turn: usize, max_tokens: u64) -> Vec<u8> {
    let mut messages = vec![
        json!({"role": "system", "content": SYSTEM}),
        json!({"role": "user", "content": opening}),
    ];
    for t in 1..=turn {
        messages.push(json!({"role": "assistant", "content": format!("{topic}: answer {t}")}));
        messages.push(json!({"role": "user", "content": format!("{topic}: follow-up {t}")}));
    }
    json!({"model": "m", "messages": messages, "max_tokens": max_tokens})
        .to_string()
        .into_bytes()
}

/// (status, answering pod, debug header).
fn send(url: &str, body: &[u8]) -> (u16, String, String) {
    let headers = [("content-type", "application/json")];
    match http(url, "POST", "/v1/chat/completions", &headers, body) {
        Ok((status, hs, _)) => {
            let h = |n: &str| {
                hs.iter()
                    .find(|(k, _)| k == n)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            (status, h("x-pod"), h("x-ai-lb-debug"))
        }
        Err(e) => (0, String::new(), e.to_string()),
    }
}

fn stat(envoys: &[Envoy], name: &str) -> i64 {
    envoys.iter().map(|e| e.stat(name)).sum()
}

#[test]
fn envoy_conversations_keep_their_pod_across_two_proxies() {
    let bed = bed(4);
    let envoys = envoys(&bed);
    // 24 conversations over 4 pods: the ring's positions follow the fake pods' random ports,
    // and with 12 an unlucky ring put every conversation on 2 pods about once in 500 runs.
    const CONVERSATIONS: usize = 24;
    let mut homes: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for turn in 0..5 {
        for c in 0..CONVERSATIONS {
            // Each turn through the other proxy than the last.
            let envoy = &envoys[(c + turn) % 2];
            let body = turn_body(
                &format!("c{c}"),
                &format!("c{c}: my upload stalls"),
                turn,
                2,
            );
            let (status, pod, debug) = send(&envoy.url, &body);
            assert_eq!(status, 200, "{debug}");
            homes.entry(c).or_default().insert(pod);
        }
    }
    for (c, pods) in &homes {
        assert_eq!(pods.len(), 1, "conversation {c} moved: {pods:?}");
    }
    let used: BTreeSet<&String> = homes.values().flatten().collect();
    assert!(
        used.len() >= 3,
        "{CONVERSATIONS} conversations spread: {used:?}"
    );
    // Each proxy knew the conversations it had seen (hits), and agreed on the rest (misses
    // decided by the same ring walk).
    for e in &envoys {
        assert!(
            e.stat("ai_lb.prefix.hit") >= CONVERSATIONS as i64,
            "{}",
            e.logs()
        );
    }
    assert_eq!(
        stat(&envoys, "ai_lb.prefix.routed"),
        5 * CONVERSATIONS as i64
    );
    assert_eq!(stat(&envoys, "ai_lb.prefix.spill"), 0);
    assert_eq!(stat(&envoys, "ai_lb.fallback.body_timeout"), 0);
    // Every later turn found its earlier turns' KV blocks on its pod.
    let (hit, query) = bed.pods.iter().fold((0, 0), |(h, q), p| {
        let s = p.state();
        (h + s.prefix_hit_tokens, q + s.prefix_query_tokens)
    });
    assert!(
        hit * 10 >= query * 6,
        "pod prefix hits {hit} of {query} tokens"
    );
}

#[test]
fn envoy_identical_openings_land_together_and_different_ones_spread() {
    let bed = bed(4);
    let envoys = envoys(&bed);
    // Many clients, one templated task: the shared system prompt and the same first message.
    let mut landed = BTreeSet::new();
    for i in 0..10 {
        let body = turn_body("t", "Summarise today's incident report.", 0, 2);
        let (status, pod, debug) = send(&envoys[i % 2].url, &body);
        assert_eq!(status, 200, "{debug}");
        landed.insert(pod);
    }
    assert_eq!(landed.len(), 1, "{landed:?}");
    // The same system prompt with different first messages: each conversation is known by its
    // first message (docs/redis-data-model.md §9, the anchor), so they spread over the pods and
    // each pod prefills the system prompt once. 24 of them, as in the test above: the ring
    // follows the fake pods' random ports, and 12 all landed on 2 of 4 pods about once in 700
    // rings (a simulation of the ring, 20,000 random port sets).
    let mut spread = BTreeSet::new();
    for i in 0..24 {
        let body = turn_body("u", &format!("User {i} asks about bucket {i}."), 0, 2);
        let (status, pod, debug) = send(&envoys[i % 2].url, &body);
        assert_eq!(status, 200, "{debug}");
        spread.insert(pod);
    }
    assert!(spread.len() >= 3, "{spread:?}");
}

#[test]
fn envoy_a_hot_conversation_spills_to_the_same_next_pod_from_both_proxies() {
    let bed = bed(4);
    let envoys = envoys(&bed);
    let urls: Vec<String> = envoys.iter().map(|e| e.url.clone()).collect();
    // Warm it: its home pod.
    let body = turn_body("hot", "hot: the shared question", 0, 2);
    let (status, home, _) = send(&urls[0], &body);
    assert_eq!(status, 200);
    // 40 copies in flight at once (20 per proxy), each 1.5 s long.
    let mut threads = Vec::new();
    for i in 0..40 {
        let url = urls[i % 2].clone();
        let body = turn_body("hot", "hot: the shared question", 0, 150);
        threads.push(std::thread::spawn(move || send(&url, &body)));
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut by_pod: BTreeMap<String, usize> = BTreeMap::new();
    for t in threads {
        let (status, pod, debug) = t.join().unwrap();
        assert_eq!(status, 200, "{debug}");
        *by_pod.entry(pod).or_default() += 1;
    }
    // Each proxy keeps the conversation on its home pod until that pod is 8 requests above
    // the least loaded (the guard: 9 in flight there, 0 elsewhere), then every further copy
    // spills along the ring walk from the anchor, the same walk on both proxies: one next pod,
    // within its bounded load.
    let spills = stat(&envoys, "ai_lb.prefix.spill");
    let at_home = by_pod.get(&home).copied().unwrap_or(0);
    assert!((10..=18).contains(&at_home), "{home}: {by_pod:?}");
    assert_eq!(spills, 40 - at_home as i64, "{by_pod:?}");
    assert_eq!(by_pod.len(), 2, "one spill pod: {by_pod:?}");
    let peak = bed.peaks().into_iter().max().unwrap();
    assert!(peak <= 28, "peak running {peak}: {by_pod:?}");
}

#[test]
fn envoy_a_dead_pods_conversations_move_to_one_pod_from_both_proxies() {
    let mut bed = bed(4);
    let envoys = envoys(&bed);
    let conv =
        |c: usize, turn: usize| turn_body(&format!("d{c}"), &format!("d{c}: hello"), turn, 2);
    let mut home = Vec::new();
    for c in 0..12 {
        let (status, pod, _) = send(&envoys[c % 2].url, &conv(c, 0));
        assert_eq!(status, 200);
        home.push(pod);
    }
    // Stop the pod holding the most conversations.
    let mut per_pod: BTreeMap<&String, usize> = BTreeMap::new();
    for p in &home {
        *per_pod.entry(p).or_default() += 1;
    }
    let dead = per_pod
        .iter()
        .max_by_key(|(_, n)| **n)
        .unwrap()
        .0
        .to_string();
    let at = bed.pods.iter().position(|p| p.name == dead).unwrap();
    let pod = bed.pods.remove(at);
    // Dead, holding its port (`PodHandle::die`).
    let _dead = pod.die();
    let mut after: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for turn in 1..4 {
        for c in 0..12 {
            let (status, pod, debug) = send(&envoys[(c + turn) % 2].url, &conv(c, turn));
            assert_eq!(status, 200, "{debug}");
            after.entry(c).or_default().insert(pod);
        }
    }
    for (c, pods) in &after {
        assert_eq!(pods.len(), 1, "conversation {c} split: {pods:?}");
        let now = pods.iter().next().unwrap();
        if home[*c] == dead {
            assert_ne!(*now, dead);
        } else {
            assert_eq!(*now, home[*c], "conversation {c} on a live pod moved");
        }
    }
}

/// A long system prompt (several blocks) many users share, then `user`'s own conversation.
fn shared_prompt_body(user: &str, turn: usize, max_tokens: u64) -> Vec<u8> {
    let system = format!(
        "{SYSTEM} {}",
        "Quote the runbook step by step. ".repeat(300)
    );
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": format!("{user}: where is my data?")}),
    ];
    for t in 1..=turn {
        messages.push(json!({"role": "assistant", "content": format!("{user}: answer {t}")}));
        messages.push(json!({"role": "user", "content": format!("{user}: follow-up {t}")}));
    }
    json!({"model": "m", "messages": messages, "max_tokens": max_tokens})
        .to_string()
        .into_bytes()
}

#[test]
fn envoy_a_shared_system_prompt_lands_together_across_two_proxies_with_the_preamble_anchor() {
    let bed = bed(4);
    let envoys = envoys_with(&bed, json!({"prefixAnchor": "preamble"}));
    // 16 users, the same long system prompt, different questions, alternating proxies: each
    // proxy hashes the prompt to the same pod, then knows it.
    let mut landed = BTreeSet::new();
    for u in 0..16 {
        let body = shared_prompt_body(&format!("user {u}"), 0, 2);
        let (status, pod, debug) = send(&envoys[u % 2].url, &body);
        assert_eq!(status, 200, "{debug}");
        landed.insert(pod);
    }
    assert_eq!(landed.len(), 1, "{landed:?}");
    let home = landed.into_iter().next().unwrap();
    // Their later turns stay on it, each turn through the other proxy than the last.
    for turn in 1..4 {
        for u in 0..8 {
            let body = shared_prompt_body(&format!("user {u}"), turn, 2);
            let (status, pod, debug) = send(&envoys[(u + turn) % 2].url, &body);
            assert_eq!(status, 200, "{debug}");
            assert_eq!(pod, home, "user {u} turn {turn}: {debug}");
        }
    }
    assert_eq!(stat(&envoys, "ai_lb.prefix.spill"), 0);
    // The pod prefilled the prompt once: nearly every later request found it cached.
    let (hit, query) = bed.pods.iter().fold((0, 0), |(h, q), p| {
        let s = p.state();
        (h + s.prefix_hit_tokens, q + s.prefix_query_tokens)
    });
    assert!(
        hit * 10 >= query * 9,
        "pod prefix hits {hit} of {query} tokens"
    );
    // A burst of 24 new users at once (12 per proxy, each 1.5 s long): each proxy keeps the
    // prompt's pod until it is over the guard, then spills along the ring walk from the
    // prompt's key, the same walk on both: one spill pod.
    let urls: Vec<String> = envoys.iter().map(|e| e.url.clone()).collect();
    let mut threads = Vec::new();
    for u in 0..24 {
        let url = urls[u % 2].clone();
        let body = shared_prompt_body(&format!("burst {u}"), 0, 150);
        threads.push(std::thread::spawn(move || send(&url, &body)));
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut by_pod: BTreeMap<String, usize> = BTreeMap::new();
    for t in threads {
        let (status, pod, debug) = t.join().unwrap();
        assert_eq!(status, 200, "{debug}");
        *by_pod.entry(pod).or_default() += 1;
    }
    let at_home = by_pod.get(&home).copied().unwrap_or(0);
    assert!((10..=18).contains(&at_home), "{home}: {by_pod:?}");
    assert_eq!(by_pod.len(), 2, "one spill pod: {by_pod:?}");
}

/// A vLLM metrics page with this queue.
fn vllm_page(waiting: u32) -> String {
    format!(
        "# TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{model_name=\"m\"}} {waiting}\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{model_name=\"m\"}} 1\n\
         # TYPE vllm:gpu_cache_usage_perc gauge\n\
         vllm:gpu_cache_usage_perc{{model_name=\"m\"}} 0.1\n"
    )
}

#[test]
fn envoy_a_pod_whose_scraped_queue_is_full_is_left_until_it_recovers() {
    // Each pod serves its /metrics from a file the test rewrites.
    let dir = std::env::temp_dir().join(format!("ailb-envoy-guard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let page = |name: &str| dir.join(format!("{name}.prom"));
    for i in 0..4 {
        std::fs::write(page(&format!("pod-{i}")), vllm_page(0)).unwrap();
    }
    let bed = Bed::new(4, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 1_000;
        c.metrics = MetricsSource::File(page(&c.name));
    });
    let pods = bed.pod_addrs();
    let guard = json!({"scrapeCluster": SCRAPE_CLUSTER, "scrapeIntervalMs": 100,
        "scrapeTimeoutMs": 300, "queueThresholdCritical": 5});
    let envoy = Envoy::start(&pods, &plugin_with(&pods, guard));
    let scrapes = || envoy.stat("ai_lb.metrics.scrape_ok");
    // Two full rounds over the 4 pods after `since` scrapes: every pod's page read anew.
    let rescraped = |since: i64| {
        assert!(
            wait_until(Duration::from_secs(10), || scrapes() >= since + 8),
            "no scrapes: {}",
            envoy.logs()
        );
    };
    rescraped(0);
    let conv = |turn: usize| turn_body("g", "g: my upload stalls", turn, 2);
    let (status, home, debug) = send(&envoy.url, &conv(0));
    assert_eq!(status, 200, "{debug}");
    let (_, again, debug) = send(&envoy.url, &conv(1));
    assert_eq!(again, home, "{debug}");
    assert!(debug.contains("prefix_hit"), "{debug}");
    // Its pod reports 50 waiting: the known conversation spills, and new ones avoid it.
    std::fs::write(page(&home), vllm_page(50)).unwrap();
    rescraped(scrapes());
    let (status, moved, debug) = send(&envoy.url, &conv(2));
    assert_eq!(status, 200, "{debug}");
    assert_ne!(moved, home, "{debug}");
    assert!(debug.contains("prefix_spill"), "{debug}");
    assert_eq!(envoy.stat("ai_lb.prefix.saturated"), 1);
    for c in 0..12 {
        let body = turn_body(&format!("n{c}"), &format!("n{c}: a new question"), 0, 2);
        let (status, pod, debug) = send(&envoy.url, &body);
        assert_eq!(status, 200, "{debug}");
        assert_ne!(pod, home, "conversation {c}: {debug}");
    }
    // Recovered: the conversation's first turns are served from their pod again.
    std::fs::write(page(&home), vllm_page(0)).unwrap();
    rescraped(scrapes());
    let (status, back, debug) = send(&envoy.url, &conv(1));
    assert_eq!(status, 200, "{debug}");
    assert_eq!(back, home, "{debug}");
    assert!(debug.contains("prefix_hit"), "{debug}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The token gate per proxy in real Envoy (docs/redis-data-model.md §13): with prefill
/// estimated at 1,000 tokens/s and a 1 s penalty, a conversation's new turns (a few uncached
/// tokens each) stay on the pod holding its ~2,000-token document, and every streamed
/// response's first bytes give its booking back (counted). The spill over a long booked queue
/// is tested per proxy in core (local_prefix_tests.rs).
#[test]
fn envoy_streams_give_their_prefill_booking_back_at_first_bytes() {
    let bed = bed(3);
    let pods = bed.pod_addrs();
    let gate = json!({"peakPrefillThroughput": 1_000, "maxTTFTPenaltyMs": 1_000});
    let envoy = Envoy::start(&pods, &plugin_with(&pods, gate));
    let doc = format!("a long shared document: {}", "text of it. ".repeat(700));
    let body = |turn: usize, max_tokens: u64| {
        let mut messages = vec![json!({"role": "user", "content": doc})];
        for t in 1..=turn {
            messages.push(json!({"role": "assistant", "content": format!("answer {t}")}));
            messages.push(json!({"role": "user", "content": format!("follow-up {t}")}));
        }
        json!({"model": "m", "stream": true, "messages": messages, "max_tokens": max_tokens})
            .to_string()
            .into_bytes()
    };
    let (status, home, debug) = send(&envoy.url, &body(0, 2));
    assert_eq!(status, 200, "{debug}");
    for turn in 1..4 {
        let (status, pod, debug) = send(&envoy.url, &body(turn, 2));
        assert_eq!((status, pod.as_str()), (200, home.as_str()), "{debug}");
        assert!(debug.ends_with("prefix_hit"), "{debug}");
    }
    assert!(
        wait_until(Duration::from_secs(3), || envoy
            .stat("ai_lb.prefix.first_bytes_sent")
            >= 4),
        "every stream's first bytes: {}",
        envoy.stat("ai_lb.prefix.first_bytes_sent")
    );
}
