//! prefix_cache's latency-aware placement through the balancer on the mock host
//! (docs/latency-model.md §5): the pick carries the request's objectives, its reply's
//! prediction reaches the debug header, the streamed answer is learnt and merged on the tick,
//! a shed reply is a 429 that holds nothing, and bad objective headers give way to the route's.

use super::tests::{configured, deliver};
use super::*;
use crate::host::mock::MockHost;
use crate::redis::resp::encode_command;
use serde_json::json;

const CLUSTER: &str = "outbound|8000||llm.static";
const POD: &str = "10.0.0.2:80";

fn route(latency: serde_json::Value, extra: serde_json::Value) -> (MockHost, Balancer) {
    let mut lb = json!({"serviceFQDN": "redis.static", "servicePort": 6379,
        "debugHeader": "x-dbg", "verifyCachedTokens": false, "latencyModel": latency});
    if let (Some(a), serde_json::Value::Object(b)) = (lb.as_object_mut(), extra) {
        a.extend(b);
    }
    let cfg = json!({"lb_policy": "prefix_cache", "lb_config": lb}).to_string();
    let host = MockHost::new()
        .with_route("chat", CLUSTER)
        .with_hosts(&[("10.0.0.1:80", "Healthy"), (POD, "Healthy")]);
    configured(host, PluginConfig::parse(cfg.as_bytes()).unwrap())
}

/// Sends a streamed chat as request `ctx` with `headers`; the pick's ARGV (after the keys).
fn send(host: &mut MockHost, e: &mut Balancer, ctx: u32, headers: &[(&str, &str)]) -> Vec<String> {
    let body = json!({"model": "m", "stream": true,
        "messages": [{"role": "user", "content": "q".repeat(4000)}]})
    .to_string();
    host.live_contexts.push(ctx);
    host.body = body.clone().into_bytes();
    host.request_headers = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(e.on_request_headers(host, ctx, false), Verdict::Pause);
    assert_eq!(
        e.on_request_body(host, ctx, body.len(), true),
        Verdict::Pause
    );
    let args = host.last_query_args();
    let numkeys: usize = args[2].parse().unwrap();
    args[3 + numkeys..].to_vec()
}

#[test]
fn the_objectives_go_to_the_pick_and_the_answer_is_learnt_and_merged() {
    let (mut host, mut e) = route(
        json!({"sloTTFTMs": 2000, "mergeIntervalMs": 100}),
        json!({}),
    );
    let argv = send(&mut host, &mut e, 2, &[("x-slo-tpot-ms", "40")]);
    // ARGV[24..27]: placed by prediction, the route's TTFT objective, the header's TPOT one,
    // not sheddable (no priority classes).
    assert_eq!(argv[23..27], ["1", "2000", "40", "0"]);
    let token = host.next_token - 4;
    let reply = encode_command(&[
        "OK", POD, "0", "0", "0", "3", "1000", "1000", "0", "120000", "25000",
    ]);
    deliver(&mut host, &mut e, token, &reply);
    assert_eq!(host.override_host.as_deref(), Some(POD));
    host.response_headers = vec![
        (":status".into(), "200".into()),
        ("content-type".into(), "text/event-stream".into()),
    ];
    host.now_ms += 150;
    assert!(e.on_response_headers(&mut host, 2));
    let debug = host
        .response_headers
        .iter()
        .find(|(k, _)| k == "x-dbg")
        .unwrap();
    assert!(
        debug
            .1
            .ends_with("; predicted_ttft_ms=120.0; predicted_tpot_ms=25.0"),
        "{}",
        debug.1
    );
    let chunks = [
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n".to_string(),
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":11}}\n\n"
            .to_string(),
        "data: [DONE]\n\n".to_string(),
    ];
    for (i, c) in chunks.iter().enumerate() {
        host.response_body = c.clone().into_bytes();
        e.on_response_body(&mut host, 2, c.len(), i + 1 == chunks.len());
        host.now_ms += 100;
    }
    host.live_contexts.clear();
    e.on_done(&mut host, 2);
    assert_eq!(host.metric("ai_lb.latency.samples"), 1);
    assert_eq!(host.metric("ai_lb.latency.placed"), 1);
    // The tick merges: one EVAL of latency_merge.lua with this worker's one batch of one pod.
    host.redis_calls.clear();
    host.now_ms += 200;
    e.on_tick(&mut host);
    let merges: Vec<usize> = (0..host.redis_calls.len())
        .filter(|&i| host.query_args(i)[1].contains("latency models, merged"))
        .collect();
    assert_eq!(merges.len(), 1, "{:?}", host.redis_calls);
    let args = host.query_args(merges[0]);
    let argv = &args[5..];
    assert_eq!(argv[4], "1", "one batch");
    assert_eq!(
        (argv[5].as_str(), argv[6].as_str(), argv[7].as_str()),
        ("1", "1", POD)
    );
    let record: Vec<f64> = argv[8].split(',').map(|x| x.parse().unwrap()).collect();
    assert_eq!(record.len(), crate::latency::book::RECORD_FIELDS);
    assert_eq!(record[9], 1.0, "one answer's weight");
    // Its reply: the fleet's records become this worker's.
    let token = host.next_token - 4;
    deliver(&mut host, &mut e, token, &encode_command(&[POD, &argv[8]]));
    assert_eq!(host.metric("ai_lb.latency.merges"), 1);
    // No merge is due again before the interval.
    host.redis_calls.clear();
    e.on_tick(&mut host);
    assert!(host.redis_calls.is_empty());
}

#[test]
fn a_shed_is_a_429_that_holds_nothing_and_only_the_lowest_class_may_be_shed() {
    let extra = json!({"priorityHeader": "x-priority", "maxRequestCount": 100});
    let (mut host, mut e) = route(json!({"sloTTFTMs": 100}), extra);
    let argv = send(&mut host, &mut e, 2, &[("x-priority", "sheddable")]);
    assert_eq!(argv[26], "1", "sheddable");
    let token = host.next_token - 4;
    deliver(
        &mut host,
        &mut e,
        token,
        &encode_command(&["SHED", "900", "30000"]),
    );
    assert_eq!(host.local_responses.last().map(|r| r.0), Some(429));
    assert_eq!(host.metric("ai_lb.latency.shed"), 1);
    assert_eq!(host.metric("ai_lb.prefix.rejected_429"), 1);
    for class in ["critical", "standard"] {
        let argv = send(&mut host, &mut e, 3, &[("x-priority", class)]);
        assert_eq!(argv[26], "0", "{class} is never shed for a prediction");
        host.live_contexts.clear();
        e.on_done(&mut host, 3);
    }
}

#[test]
fn a_bad_objective_gives_way_to_the_routes() {
    let (mut host, mut e) = route(json!({"sloTTFTMs": 700}), json!({}));
    let argv = send(
        &mut host,
        &mut e,
        2,
        &[("x-slo-ttft-ms", "-3"), ("x-slo-tpot-ms", "NaN")],
    );
    assert_eq!(argv[23..27], ["1", "700", "0", "0"]);
    assert_eq!(host.metric("ai_lb.latency.bad_objective"), 1);
    let warned = host
        .logs
        .borrow()
        .iter()
        .filter(|(_, l)| l.contains("x-slo-ttft-ms"))
        .count();
    let _ = send(&mut host, &mut e, 3, &[("x-slo-ttft-ms", "abc")]);
    assert_eq!(host.metric("ai_lb.latency.bad_objective"), 2);
    let again = host
        .logs
        .borrow()
        .iter()
        .filter(|(_, l)| l.contains("x-slo-ttft-ms"))
        .count();
    assert_eq!((warned, again), (1, 1), "logged once");
}
