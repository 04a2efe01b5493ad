//! Cluster-level policies (`lb_type: cluster`) end to end in the emulator: three services as
//! three clusters behind one route that follows `x-higress-target-cluster`, 2 gateways × 2
//! workers. cluster_hash keeps a header value on its Higress slot's service and answers 403
//! without the header; cluster_metrics AdaptiveScore moves traffic off a slow and a failing
//! service; a first token's time counts for the worker's next decision while its answer still
//! streams; a configured cluster that does not exist is a 503, never a hang.

use ailb_core::cluster::hash::slot_of;
use ailb_e2e::bed::{chat_body, Bed};
use ailb_e2e::cluster::{
    cluster_config, hash_plugin, metrics_plugin, service_of, services, slow_and_failing, Service,
    TARGET_HEADER,
};
use ailb_e2e::gateway::{http, open, Gateway};
use ailb_testkit::wait_until;
use serde_json::{json, Value};
use std::collections::BTreeMap;

const NAMES: [&str; 3] = ["llm-a", "llm-b", "llm-c"];

/// Two gateways (2 workers each) running `plugin` over `svcs`.
fn gateways(bed: &Bed, svcs: &[Service], plugin: &Value) -> Vec<Gateway> {
    (0..2)
        .map(|i| {
            let spec = bed.spec(&format!("cl-{i}"), Some(plugin.clone()));
            let cfg = cluster_config(bed, &spec, svcs);
            Gateway::start_config(&cfg, &spec.id).unwrap_or_else(|e| panic!("{e}"))
        })
        .collect()
}

/// One chat request with `headers`: (status, `x-pod`, body).
fn send(gw: &Gateway, text: &str, headers: &[(&str, &str)]) -> (u16, String, String) {
    send_tokens(gw, text, headers, 2)
}

/// A chat request asking for `max_tokens` output tokens.
fn send_tokens(
    gw: &Gateway,
    text: &str,
    headers: &[(&str, &str)],
    max_tokens: u64,
) -> (u16, String, String) {
    let mut h = vec![("content-type", "application/json")];
    h.extend_from_slice(headers);
    let (status, hs, body) = http(
        &gw.url,
        "POST",
        "/v1/chat/completions",
        &h,
        &chat_body(text, max_tokens),
    )
    .unwrap_or_else(|e| panic!("{text}: no answer: {e}"));
    let pod = hs
        .iter()
        .find(|(k, _)| k == "x-pod")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    (status, pod, String::from_utf8_lossy(&body).into_owned())
}

/// Higress's slot table for weights 30/30/40 (docs/higress-cluster-policies.md §2).
fn expected_service(value: &str) -> &'static str {
    match slot_of(value.as_bytes()) {
        0..30 => NAMES[0],
        30..60 => NAMES[1],
        _ => NAMES[2],
    }
}

#[test]
fn cluster_hash_keeps_a_value_on_one_service_across_gateways_and_workers() {
    let bed = Bed::new(6, |_| {});
    let svcs = services(&NAMES, 2);
    let plugin = hash_plugin("x-user", &[(NAMES[0], 30), (NAMES[1], 30), (NAMES[2], 40)]);
    let gws = gateways(&bed, &svcs, &plugin);
    let mut covered = std::collections::BTreeSet::new();
    for u in 0..24 {
        let user = format!("consumer-{u}");
        let want = expected_service(&user);
        covered.insert(want);
        // 8 requests over both gateways, each on a new connection (so over both workers),
        // half of them naming another service themselves: the plugin overwrites the header.
        for i in 0..8 {
            let mut h = vec![("x-user", user.as_str())];
            if i % 2 == 1 {
                h.push((TARGET_HEADER, NAMES[(u + i) % 3]));
            }
            let (status, pod, body) = send(&gws[i % 2], &format!("{user} {i}"), &h);
            assert_eq!(status, 200, "{user}: {body}");
            assert_eq!(service_of(&svcs, &pod), Some(want), "{user} #{i} on {pod}");
        }
    }
    assert_eq!(covered.len(), 3, "the values cover every service");
    // No hash header, or an empty one: Higress's 403, and no upstream sees it.
    for h in [vec![], vec![("x-user", "")]] {
        let (status, pod, body) = send(&gws[0], "anonymous", &h);
        assert_eq!((status, body.as_str()), (403, "hash header required"));
        assert_eq!(pod, "");
    }
    let routed: i64 = gws
        .iter()
        .map(|g| g.stat("ai_lb.cluster_hash.routed"))
        .sum();
    assert_eq!(routed, 24 * 8);
    assert_eq!(gws[0].stat("ai_lb.cluster_hash.rejected_403"), 2);
}

/// cluster_hash's `key` block (Higress PR #3921): a cookie's value and a JSON body field are
/// hashed onto Higress's slots like a header's value, through both gateways; a request without
/// the key is the PR's 403.
#[test]
fn cluster_hash_key_block_hashes_a_cookie_and_a_body_field() {
    let bed = Bed::new(3, |_| {});
    let svcs = services(&NAMES, 1);
    let weights = [(NAMES[0], 30), (NAMES[1], 30), (NAMES[2], 40)];
    let with_key = |key: Value| {
        let mut p = hash_plugin("x-user", &weights);
        p["lb_config"]["key"] = key;
        p
    };
    let cookie = gateways(
        &bed,
        &svcs,
        &with_key(json!({"source": "cookie", "name": "uid"})),
    );
    for u in 0..12 {
        let user = format!("cookie-user-{u}");
        let jar = format!("theme=dark; uid={user}; lang=en");
        for (i, gw) in cookie.iter().enumerate() {
            // x-user names another user: the key block, not hash_header, decides.
            let h = [("cookie", jar.as_str()), ("x-user", "someone-else")];
            let (status, pod, body) = send(gw, &format!("{user} {i}"), &h);
            assert_eq!(status, 200, "{user}: {body}");
            assert_eq!(
                service_of(&svcs, &pod),
                Some(expected_service(&user)),
                "{user}"
            );
        }
    }
    let (status, _, body) = send(&cookie[0], "no cookie", &[("x-user", "u")]);
    assert_eq!((status, body.as_str()), (403, "hash key required"));
    drop(cookie);
    let body_key = with_key(json!({"source": "body", "jsonPath": "$.metadata.session"}));
    let gws = gateways(&bed, &svcs, &body_key);
    for u in 0..12 {
        let session = format!("session-{u}");
        let body = json!({"model": "fake-model", "max_tokens": 2,
            "metadata": {"session": session},
            "messages": [{"role": "user", "content": format!("hello {u}")}]})
        .to_string();
        for gw in &gws {
            let (status, hs, answer) = http(
                &gw.url,
                "POST",
                "/v1/chat/completions",
                &[("content-type", "application/json")],
                body.as_bytes(),
            )
            .unwrap_or_else(|e| panic!("{session}: {e}"));
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
            let pod = hs
                .iter()
                .find(|(k, _)| k == "x-pod")
                .map(|(_, v)| v.clone());
            assert_eq!(
                pod.and_then(|p| service_of(&svcs, &p)),
                Some(expected_service(&session)),
                "{session}"
            );
        }
    }
    let (status, _, body) = send(&gws[0], "no session field", &[]);
    assert_eq!((status, body.as_str()), (403, "hash key required"));
}

#[test]
fn cluster_metrics_adaptive_moves_traffic_off_the_slow_and_the_failing_service() {
    // llm-a: pods 0, 1; llm-b: pods 2, 3, three times slower to the first token; llm-c: pods
    // 4, 5, half of their answers 500 (seeded).
    let bed = Bed::new(6, |c| {
        c.decode_us_per_token = 10_000;
        c.prefill_us_per_token = 200;
        slow_and_failing(c, 0.5, 11);
    });
    let svcs = services(&NAMES, 2);
    let gws = gateways(&bed, &svcs, &metrics_plugin(&svcs, "AdaptiveScore"));
    let mut landed: BTreeMap<&str, usize> = BTreeMap::new();
    let mut late: BTreeMap<&str, usize> = BTreeMap::new();
    for i in 0..90 {
        let (status, pod, body) = send(&gws[i % 2], &format!("q{i}"), &[]);
        let svc = service_of(&svcs, &pod).unwrap_or_else(|| panic!("#{i}: {status} {body}"));
        assert!(
            status == 200 || (svc == NAMES[2] && status == 500),
            "#{i}: {status} from {svc}"
        );
        *landed.entry(svc).or_default() += 1;
        if i >= 30 {
            *late.entry(svc).or_default() += 1;
        }
    }
    let logs = || gws.iter().map(Gateway::logs).collect::<Vec<_>>().join("\n");
    // A uniform pick would give each about 30 (and 20 of the last 60).
    let get = |m: &BTreeMap<&str, usize>, s: &str| m.get(s).copied().unwrap_or(0);
    assert!(
        get(&landed, NAMES[2]) <= 8,
        "failing service: {landed:?}\n{}",
        logs()
    );
    assert!(
        get(&late, NAMES[1]) <= 6,
        "slow service after warm-up: {late:?}\n{}",
        logs()
    );
    assert!(
        get(&late, NAMES[0]) >= 50,
        "fast service after warm-up: {late:?}"
    );
    let routed: i64 = gws
        .iter()
        .map(|g| g.stat("ai_lb.cluster_metrics.routed"))
        .sum();
    assert_eq!(routed, 90);
    for g in &gws {
        assert_eq!(
            g.stat("ai_lb.cluster_metrics.stats_failed"),
            0,
            "{}",
            g.logs()
        );
    }
}

/// LeastFirstTokenLatency scores services by time to the first token alone, taken at the first
/// body chunk of each answer. Streamed answers come in many chunks and the plugin reads only
/// the first (the balancer ignores the others): llm-b is three times slower to its first
/// token, and once both services have samples the traffic leaves it. Without the samples
/// every service scores the same and a random pick sends it about half.
#[test]
fn least_first_token_latency_reads_the_first_chunk_of_streamed_answers() {
    let bed = Bed::new(4, |c| {
        c.prefill_us_per_token = 5_000;
        c.decode_us_per_token = 2_000;
        if matches!(c.name.as_str(), "pod-2" | "pod-3") {
            c.ttft_multiplier = 3.0;
        }
    });
    let svcs = services(&NAMES[..2], 2);
    let gws = gateways(
        &bed,
        &svcs,
        &metrics_plugin(&svcs, "LeastFirstTokenLatency"),
    );
    let mut late: BTreeMap<&str, usize> = BTreeMap::new();
    for i in 0..60 {
        let body = serde_json::json!({"model": "fake-model", "stream": true, "max_tokens": 8,
            "messages": [{"role": "user", "content": format!("question {i} about the weather")}]});
        let (status, hs, answer) = http(
            &gws[i % 2].url,
            "POST",
            "/v1/chat/completions",
            &[("content-type", "application/json")],
            body.to_string().as_bytes(),
        )
        .unwrap_or_else(|e| panic!("#{i}: no answer: {e}"));
        let pod = hs
            .iter()
            .find(|(k, _)| k == "x-pod")
            .map(|(_, v)| v.as_str());
        let svc = pod.and_then(|p| service_of(&svcs, p));
        assert!(status == 200, "#{i}: {status} from {svc:?}");
        assert!(
            String::from_utf8_lossy(&answer).matches("data:").count() >= 8,
            "#{i}: not a streamed answer"
        );
        if i >= 20 {
            *late.entry(svc.unwrap_or("none")).or_default() += 1;
        }
    }
    let slow = late.get(NAMES[1]).copied().unwrap_or(0);
    assert!(
        slow <= 4,
        "slow-to-first-token service after warm-up: {late:?}"
    );
    for g in &gws {
        assert_eq!(
            g.stat("ai_lb.cluster_metrics.stats_failed"),
            0,
            "{}",
            g.logs()
        );
    }
}

/// A streamed answer left open: the response head and its first `data:` event read, the rest
/// unread. Returns the connection (the stream lives while it does) and the pod that answered.
fn open_stream(gw: &Gateway, text: &str) -> (std::net::TcpStream, String) {
    use std::io::Read;
    let body = serde_json::json!({"model": "fake-model", "stream": true, "max_tokens": 400,
        "messages": [{"role": "user", "content": text}]})
    .to_string();
    let headers = [("content-type", "application/json")];
    let mut s = open(
        &gw.url,
        "POST",
        "/v1/chat/completions",
        &headers,
        body.as_bytes(),
    )
    .unwrap_or_else(|e| panic!("{text}: {e}"));
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("data:") {
        let n = s.read(&mut buf).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert!(n > 0, "{text}: closed before the first token");
        got.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&got).to_lowercase();
    let pod = head
        .lines()
        .find_map(|l| l.strip_prefix("x-pod:"))
        .map(|p| p.trim().to_string())
        .unwrap_or_else(|| panic!("{text}: no x-pod in {head}"));
    (s, pod)
}

/// A time to first token reaches the worker's next decision while its answer still streams:
/// the sample is held by the worker until its next write of the shared record, and its own
/// decisions see it at once (`SharedStats::pending`, core/src/balancer/service_stats.rs).
/// One worker, LeastFirstTokenLatency over two services: two short requests give each service
/// one fast sample (the second leaves the first's service, which holds all of the traffic so
/// far: `rate_limit`). A long prompt then goes to the lower mean and takes hundreds of ms to its
/// first token; once that token is out, the next request must go to the other service. Were
/// the time counted only at the end of the long answer (seconds later), the next request would
/// see the same means and follow the long one; were it lost, both services would score alike
/// and the next request would follow a coin (5 rounds: 1 in 32).
#[test]
fn a_first_token_counts_before_the_answer_ends() {
    let bed = Bed::new(4, |c| {
        c.prefill_us_per_token = 2_000;
        c.decode_us_per_token = 10_000; // 400 tokens: 4 s of streaming
    });
    let svcs = services(&NAMES[..2], 2);
    let plugin = metrics_plugin(&svcs, "LeastFirstTokenLatency");
    let long_prompt = "tell me everything about the weather ".repeat(60);
    for round in 0..5 {
        let mut spec = bed.spec(&format!("ttft-now-{round}"), Some(plugin.clone()));
        spec.workers = 1;
        let gw = Gateway::start_config(&cluster_config(&bed, &spec, &svcs), &spec.id)
            .unwrap_or_else(|e| panic!("{e}"));
        let warm: Vec<_> = (0..2)
            .map(|i| service_of(&svcs, &send(&gw, &format!("hi {round} {i}"), &[]).1))
            .collect();
        assert!(
            warm[0] != warm[1],
            "round {round}: warm-up went to {warm:?}"
        );
        let (first, pod) = open_stream(&gw, &format!("round {round}: {long_prompt}"));
        let streaming = service_of(&svcs, &pod);
        let (status, pod, _) = send(&gw, &format!("round {round}: the next one"), &[]);
        assert_eq!(status, 200);
        let next = service_of(&svcs, &pod);
        assert!(
            streaming.is_some() && next.is_some() && next != streaming,
            "round {round}: the next request went to {next:?}, the streaming one to {streaming:?}: the first token's time was not counted\n{}",
            gw.logs()
        );
        drop(first);
    }
}

/// A configured cluster the gateway does not have: Envoy's 503 at once, every time; the
/// values hashed to real clusters are served.
#[test]
fn a_cluster_that_does_not_exist_is_503_never_a_hang() {
    let bed = Bed::new(2, |_| {});
    let svcs = services(&NAMES[..2], 1);
    let plugin = hash_plugin("x-user", &[(NAMES[0], 50), ("outbound|80||gone.dns", 50)]);
    let gws = gateways(&bed, &svcs, &plugin);
    let mut statuses = BTreeMap::new();
    for u in 0..30 {
        let user = format!("user-{u}");
        let (status, pod, body) = send(&gws[u % 2], &user, &[("x-user", user.as_str())]);
        if slot_of(user.as_bytes()) < 50 {
            assert_eq!((status, pod.as_str()), (200, "pod-0"), "{user}: {body}");
        } else {
            assert_eq!((status, body.as_str()), (503, ""), "{user} on {pod}");
        }
        *statuses.entry(status).or_insert(0) += 1;
    }
    assert_eq!(statuses.len(), 2, "both kinds of values: {statuses:?}");
    let not_found: i64 = gws
        .iter()
        .map(|g| g.stat("gateway.cluster_not_found"))
        .sum();
    assert_eq!(not_found, statuses[&503]);

    // cluster_metrics naming a missing service: each request is answered (503 when it was
    // picked), the failure is recorded and the service is avoided from then on.
    let plugin = metrics_plugin(
        &[
            svcs[0].clone(),
            Service {
                name: "outbound|80||gone.dns".into(),
                pods: vec![],
            },
        ],
        "AdaptiveScore",
    );
    let gws = gateways(&bed, &svcs, &plugin);
    let mut missing = 0;
    for i in 0..20 {
        let (status, pod, _) = send(&gws[i % 2], &format!("m{i}"), &[]);
        match status {
            200 => assert_eq!(pod, "pod-0"),
            503 => missing += 1,
            other => panic!("#{i}: {other}"),
        }
    }
    // Once llm-a has a latency sample, the service without one scores lower and is tried.
    assert!(
        (1..=4).contains(&missing),
        "the missing service is tried, then avoided after its 503: {missing}"
    );
    for g in &gws {
        assert_eq!(
            g.stat("ai_lb.cluster_metrics.stats_failed"),
            0,
            "{}",
            g.logs()
        );
    }
}

/// The Higress hash of AdaptiveScore's global in-flight counts: (service → count), and the
/// number of leases beside it.
fn inflight_counts(bed: &Bed) -> (BTreeMap<String, i64>, i64) {
    use ailb_core::redis::inflight::InflightKeys;
    use ailb_core::redis::resp::Value as Resp;
    let keys = InflightKeys::new("higress:adaptive_score_inflight", ailb_e2e::gateway::ROUTE);
    let mut counts = BTreeMap::new();
    if let Resp::Array(Some(items)) = bed.redis.cmd(&["HGETALL", &keys.counts]) {
        for pair in items.chunks(2) {
            if let [k, v] = pair {
                let n = v.as_str().and_then(|s| s.parse().ok()).unwrap_or(i64::MIN);
                counts.insert(k.as_str().unwrap_or_default().to_string(), n);
            }
        }
    }
    let leases = bed
        .redis
        .cmd(&["ZCARD", &keys.leases])
        .as_i64()
        .unwrap_or(-1);
    (counts, leases)
}

/// AdaptiveScore with `global_inflight_enabled`: both gateways count every request in
/// Higress's Redis hash while it runs and give it back when it ends; with Redis down every
/// request is still served, by the local scores, and nothing is left counted.
#[test]
fn cluster_metrics_global_inflight_counts_in_redis_and_survives_redis_down() {
    let mut bed = Bed::new(6, |c| {
        c.decode_us_per_token = 20_000;
    });
    let svcs = services(&NAMES, 2);
    let mut plugin = metrics_plugin(&svcs, "AdaptiveScore");
    plugin["lb_config"]["global_inflight_enabled"] = true.into();
    plugin["lb_config"]["serviceFQDN"] = "redis.static".into();
    plugin["lb_config"]["servicePort"] = bed.redis.port.into();
    let gws = gateways(&bed, &svcs, &plugin);
    // 8 requests of ~2 s at once over both gateways: all counted in Redis while they run (the
    // last read, once all 8 are in or after 1.5 s, is what is checked).
    let in_flight = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let gw = &gws[i % 2];
                s.spawn(move || {
                    let (status, _, body) = send_tokens(gw, &format!("g{i}"), &[], 100);
                    assert_eq!(status, 200, "{body}\n{}", gw.logs());
                })
            })
            .collect();
        let mut seen = inflight_counts(&bed);
        wait_until(std::time::Duration::from_millis(1500), || {
            seen = inflight_counts(&bed);
            seen.0.values().sum::<i64>() == 8 && seen.1 == 8
        });
        for h in handles {
            h.join().unwrap();
        }
        seen
    });
    assert_eq!(
        in_flight.0.values().sum::<i64>(),
        8,
        "counted in Redis: {in_flight:?}"
    );
    assert_eq!(in_flight.1, 8, "one lease each: {in_flight:?}");
    assert!(
        in_flight.0.len() >= 2,
        "spread over services: {in_flight:?}"
    );
    let global: i64 = gws
        .iter()
        .map(|g| g.stat("ai_lb.cluster_metrics.inflight_global"))
        .sum();
    assert_eq!(global, 8);
    // Releases are fire-and-forget: give them a moment.
    let mut after = inflight_counts(&bed);
    for _ in 0..50 {
        if after == (BTreeMap::new(), 0) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        after = inflight_counts(&bed);
    }
    assert_eq!(after, (BTreeMap::new(), 0), "everything given back");

    bed.redis.stop();
    for i in 0..6 {
        let (status, pod, body) = send(&gws[i % 2], &format!("d{i}"), &[]);
        assert_eq!(status, 200, "#{i} with Redis down: {body}");
        assert!(service_of(&svcs, &pod).is_some());
    }
    let local: i64 = gws
        .iter()
        .map(|g| g.stat("ai_lb.cluster_metrics.inflight_local"))
        .sum();
    assert_eq!(local, 6);
    bed.redis.restart();
    let (status, _, body) = send(&gws[0], "back", &[]);
    assert_eq!(status, 200, "{body}");
    for g in &gws {
        assert_eq!(
            g.stat("ai_lb.cluster_metrics.stats_failed"),
            0,
            "{}",
            g.logs()
        );
    }
}
