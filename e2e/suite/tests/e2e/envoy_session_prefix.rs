//! Sessions on prefix_cache without Redis in real Envoy 1.40: two Envoy processes × two workers
//! in front of the same fake pods, sharing nothing (docs/redis-data-model.md §10). Sessions
//! sharing one conversation prefix go to their own pods (a session wins over a prefix match),
//! the same from both proxies; a session whose pod's scraped queue is full leaves it
//! (`session_rebound`, counted) and comes back when the pod recovers. Also a pod that dies:
//! sessions and plain least request leave it once Envoy's retry showed it down (failure
//! memory ejects it).

use ailb_e2e::bed::Bed;
use ailb_e2e::envoy::{Envoy, SCRAPE_CLUSTER};
use ailb_e2e::gateway::http;
use ailb_fakepod::MetricsSource;
use ailb_testkit::wait_until;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

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

/// Turn `turn` of a conversation every session shares (same system prompt and opening).
fn shared_turn(turn: usize) -> Vec<u8> {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a support engineer. Answer briefly."}),
        json!({"role": "user", "content": "my upload stalls at 99%"}),
    ];
    for t in 1..=turn {
        messages.push(json!({"role": "assistant", "content": format!("answer {t}")}));
        messages.push(json!({"role": "user", "content": format!("follow-up {t}")}));
    }
    json!({"model": "m", "messages": messages, "max_tokens": 2})
        .to_string()
        .into_bytes()
}

/// (answering pod, debug reason) of one request of session `sid` (none when empty).
fn send(url: &str, sid: &str, body: &[u8]) -> (String, String) {
    let mut headers = vec![("content-type", "application/json")];
    if !sid.is_empty() {
        headers.push(("x-session-id", sid));
    }
    let (status, hs, _) = http(url, "POST", "/v1/chat/completions", &headers, body).unwrap();
    assert_eq!(status, 200);
    let h = |n: &str| {
        hs.iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let reason = h("x-ai-lb-debug")
        .split("reason=")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (h("x-pod"), reason)
}

#[test]
fn envoy_prefix_sessions_win_over_the_prefix_and_leave_a_saturated_pod() {
    let dir = std::env::temp_dir().join(format!("ailb-envoy-session-{}", std::process::id()));
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
    let plugin = json!({"lb_policy": "prefix_cache", "lb_config": {
        "endpoints": pods, "debugHeader": "x-ai-lb-debug", "sessionHeader": "x-session-id",
        "scrapeCluster": SCRAPE_CLUSTER, "scrapeIntervalMs": 100, "scrapeTimeoutMs": 300,
        "queueThresholdCritical": 5}});
    let envoys = [Envoy::start(&pods, &plugin), Envoy::start(&pods, &plugin)];
    // Two full rounds over the 4 pods on each proxy after `since`: every page read anew.
    let scrapes = || {
        envoys
            .iter()
            .map(|e| e.stat("ai_lb.metrics.scrape_ok"))
            .collect::<Vec<_>>()
    };
    let rescraped = |since: Vec<i64>| {
        let ok = wait_until(Duration::from_secs(10), || {
            scrapes()
                .iter()
                .zip(&since)
                .all(|(now, was)| *now >= was + 8)
        });
        assert!(ok, "no scrapes: {}", envoys[0].logs());
    };
    rescraped(vec![0, 0]);
    // Without a session the conversation has one pod (its prefix).
    let (prefix_pod, _) = send(&envoys[0].url, "", &shared_turn(0));
    assert_eq!(send(&envoys[0].url, "", &shared_turn(1)).0, prefix_pod);
    // 12 sessions, all on that very conversation: each keeps its own pod on both proxies.
    let sessions: Vec<String> = (0..12).map(|s| format!("sess-{s}")).collect();
    let mut home = BTreeMap::new();
    for (i, sid) in sessions.iter().enumerate() {
        let (first, reason) = send(&envoys[i % 2].url, sid, &shared_turn(0));
        assert_eq!(reason, "session", "{sid}");
        for t in 1..4 {
            let got = send(&envoys[(i + t) % 2].url, sid, &shared_turn(t));
            assert_eq!(got, (first.clone(), "session".into()), "{sid} turn {t}");
        }
        home.insert(sid.clone(), first);
    }
    let used: BTreeSet<&String> = home.values().collect();
    assert!(used.len() >= 2, "sessions beat the shared prefix: {used:?}");
    let stat = |name: &str| envoys.iter().map(|e| e.stat(name)).sum::<i64>();
    assert_eq!(stat("ai_lb.session.hit"), 48);
    // The pod holding the most sessions reports 50 waiting: they leave it (counted), the
    // others stay.
    let mut per_pod: BTreeMap<&String, usize> = BTreeMap::new();
    for p in home.values() {
        *per_pod.entry(p).or_default() += 1;
    }
    let (hot, _) = per_pod.into_iter().max_by_key(|(_, n)| *n).unwrap();
    let hot = hot.clone();
    std::fs::write(page(&hot), vllm_page(50)).unwrap();
    rescraped(scrapes());
    let mut moved = 0;
    for sid in &sessions {
        for e in &envoys {
            let (pod, reason) = send(&e.url, sid, &shared_turn(4));
            if home[sid] == hot {
                moved += 1;
                assert_ne!(pod, hot, "{sid}");
                assert_eq!(reason, "session_rebound", "{sid}");
            } else {
                assert_eq!((&pod, reason.as_str()), (&home[sid], "session"), "{sid}");
            }
        }
    }
    assert!(moved >= 2);
    assert_eq!(stat("ai_lb.session.rebound"), moved);
    // Recovered: every session on its own pod again.
    std::fs::write(page(&hot), vllm_page(0)).unwrap();
    rescraped(scrapes());
    for sid in &sessions {
        for e in &envoys {
            assert_eq!(
                send(&e.url, sid, &shared_turn(5)),
                (home[sid].clone(), "session".into())
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Plain-Envoy global_least_request sessions when a pod dies: Envoy's retry answers the next
/// turn from the session's ring walk, the plugin sees the answer came from another pod and
/// failure memory ejects the dead one proxy-wide, and the following turns go straight to the
/// walk's next pod as `session_rebound` (docs/sessions-and-queues.md "Sessions"); the other
/// sessions stay.
#[test]
fn envoy_least_request_sessions_leave_a_pod_that_stopped_answering() {
    let mut bed = Bed::new(3, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 1_000;
    });
    let pods = bed.pod_addrs();
    let plugin = json!({"lb_policy": "global_least_request", "lb_config": {
        "endpoints": pods, "debugHeader": "x-ai-lb-debug", "sessionHeader": "x-session-id"}});
    let envoy = Envoy::start(&pods, &plugin);
    let sessions: Vec<String> = (0..9).map(|s| format!("user-{s}")).collect();
    let mut home = BTreeMap::new();
    for sid in &sessions {
        let (pod, reason) = send(&envoy.url, sid, &shared_turn(0));
        assert_eq!(reason, "session", "{sid}");
        home.insert(sid.clone(), pod);
    }
    let dead = home[&sessions[0]].clone();
    let at = bed.pods.iter().position(|p| p.name == dead).unwrap();
    let pod = bed.pods.remove(at);
    // Dead, holding its port (`PodHandle::die`).
    let _dead = pod.die();
    // The first turn after the death: still sent to its pod, answered through Envoy's retry.
    let mut moved = BTreeMap::new();
    for sid in sessions.iter().filter(|s| home[*s] == dead) {
        let (pod, _) = send(&envoy.url, sid, &shared_turn(1));
        assert_ne!(pod, dead, "{sid}");
        moved.insert(sid.clone(), pod);
    }
    assert!(
        envoy.stat("ai_lb.session.pod_down") >= 1,
        "{}",
        envoy.logs()
    );
    // From then on: straight to the walk's next pod, counted; the others stay.
    let rebound_before = envoy.stat("ai_lb.session.rebound");
    for sid in &sessions {
        let got = send(&envoy.url, sid, &shared_turn(2));
        if home[sid] == dead {
            assert_eq!(got, (moved[sid].clone(), "session_rebound".into()), "{sid}");
        } else {
            assert_eq!(got, (home[sid].clone(), "session".into()), "{sid}");
        }
    }
    assert_eq!(
        envoy.stat("ai_lb.session.rebound") - rebound_before,
        moved.len() as i64
    );
}

/// Plain-Envoy global_least_request without sessions when a pod dies: it holds no requests,
/// so it would be the least loaded pod of every tie; after the first request Envoy's retry
/// had to serve elsewhere, failure memory ejects it, the plugin lists it last while it is
/// ejected (30 s) and no request is sent to it first again (docs/plain-envoy.md "Failure
/// memory").
#[test]
fn envoy_least_request_lists_a_pod_that_stopped_answering_last() {
    let mut bed = Bed::new(3, |c| {
        c.max_running = 64;
        c.decode_us_per_token = 1_000;
    });
    let pods = bed.pod_addrs();
    let plugin = json!({"lb_policy": "global_least_request", "lb_config": {
        "endpoints": pods, "debugHeader": "x-ai-lb-debug"}});
    let envoy = Envoy::start(&pods, &plugin);
    let dead = pods[0].clone();
    let pod = bed.pods.remove(0);
    // Dead, holding its port (`PodHandle::die`).
    let _dead = pod.die();
    // One at a time: every pod at 0 in flight, so each request is a tie.
    let mut sent_to_dead = 0;
    let mut answered_by = BTreeSet::new();
    for i in 0..30 {
        let headers = [("content-type", "application/json")];
        let (status, hs, _) = http(
            &envoy.url,
            "POST",
            "/v1/chat/completions",
            &headers,
            &shared_turn(i % 3),
        )
        .unwrap();
        assert_eq!(status, 200, "{}", envoy.logs());
        let h = |n: &str| {
            hs.iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let debug = h("x-ai-lb-debug");
        assert!(debug.ends_with("reason=least_request"), "{debug}");
        if debug.starts_with(&format!("endpoint={dead};")) {
            sent_to_dead += 1;
        }
        answered_by.insert(h("x-pod"));
    }
    assert_eq!(
        answered_by,
        BTreeSet::from(["pod-1".to_string(), "pod-2".to_string()])
    );
    assert_eq!(sent_to_dead, 1, "{}", envoy.logs());
    assert_eq!(envoy.stat("ai_lb.glr.pod_down"), 1);
    assert_eq!(envoy.stat("ai_lb.session.pod_down"), 0);
    // Failure memory ejected it at its first request Envoy retried elsewhere.
    assert_eq!(envoy.stat("ai_lb.eject.ejected"), 1);
}
