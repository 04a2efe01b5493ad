//! Cluster policies (`lb_type: cluster`) against the mock host: the header written, the 403,
//! the shared statistics recorded at first byte and stream end, and every count given back.

use super::*;
use crate::cluster::hash::slot_of;
use crate::cluster::stats::table::ServiceTable;
use crate::host::mock::MockHost;
use crate::host::HostErrorKind;

const HEADER: &str = "x-higress-target-cluster";
const A: &str = "outbound|80||a.static";
const B: &str = "outbound|80||b.static";
const C: &str = "outbound|80||c.static";

fn engine(json: &str) -> (MockHost, Balancer) {
    let mut host = MockHost::new().with_route("chat", "outbound|80||default");
    let config = PluginConfig::parse(json.as_bytes()).unwrap();
    let e = Balancer::configure(&mut host, config, 42, LogLevel::Trace);
    (host, e)
}

fn hash_engine() -> (MockHost, Balancer) {
    engine(&format!(
        r#"{{"lb_type":"cluster","lb_policy":"cluster_hash","lb_config":{{"hash_header":"x-user","clusters":[{{"cluster":"{A}","weight":30}},{{"cluster":"{B}","weight":30}},{{"cluster":"{C}","weight":40}}]}}}}"#
    ))
}

fn metrics_engine(mode: &str, extra: &str) -> (MockHost, Balancer) {
    engine(&format!(
        r#"{{"lb_type":"cluster","lb_policy":"cluster_metrics","lb_config":{{"mode":"{mode}","service_list":["{A}","{B}","{C}"]{extra}}}}}"#
    ))
}

fn header(host: &MockHost, name: &str) -> Option<String> {
    host.request_header(name).unwrap()
}

/// A request carrying `headers`; returns the cluster the plugin wrote.
fn send(
    host: &mut MockHost,
    e: &mut Balancer,
    ctx: u32,
    headers: &[(&str, &str)],
) -> Option<String> {
    host.request_headers = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    host.live_contexts.push(ctx);
    let verdict = e.on_request_headers(host, ctx, false);
    let written = header(host, HEADER);
    if host.local_responses.is_empty() {
        assert_eq!(verdict, Verdict::Continue, "decided at headers, never held");
    }
    written
}

fn respond(host: &mut MockHost, e: &mut Balancer, ctx: u32, status: &str) {
    host.response_headers = vec![(":status".into(), status.into())];
    e.on_response_headers(host, ctx);
}

fn end(host: &mut MockHost, e: &mut Balancer, ctx: u32) {
    host.live_contexts.retain(|&c| c != ctx);
    e.on_done(host, ctx);
}

/// The one shared record of the route's statistics.
fn table(host: &MockHost) -> ServiceTable {
    let shared = host.shared.borrow();
    let mut records = shared.iter().filter(|(k, _)| k.starts_with("ailb.cm."));
    let (_, (bytes, _)) = records.next().expect("a record");
    assert!(records.next().is_none(), "one record per route config");
    // Rings are kept only by the Least*Latency modes (`Mode::ring_capacity`).
    [100, 0]
        .into_iter()
        .find_map(|capacity| ServiceTable::new(&[A, B, C], capacity).read(bytes))
        .expect("the record reads back")
}

fn stats(host: &MockHost, name: &str) -> crate::cluster::stats::ServiceStats {
    let t = table(host);
    t.get(t.index_of(name).unwrap()).unwrap().clone()
}

fn hash_cluster(value: &[u8]) -> &'static str {
    match slot_of(value) {
        0..30 => A,
        30..60 => B,
        _ => C,
    }
}

#[test]
fn hash_sends_a_header_value_to_its_slot_s_cluster_every_time() {
    let (mut host, mut e) = hash_engine();
    // Higress's vectors: alice → slot 79, bob → 44, test-0 → 20.
    for (ctx, (value, want)) in [("alice", C), ("bob", B), ("test-0", A), ("alice", C)]
        .into_iter()
        .enumerate()
    {
        let ctx = ctx as u32 + 2;
        let got = send(&mut host, &mut e, ctx, &[("x-user", value)]);
        assert_eq!(got.as_deref(), Some(want), "{value}");
        end(&mut host, &mut e, ctx);
    }
    assert_eq!(host.metric("ai_lb.cluster_hash.routed"), 4);
    assert_eq!(e.tracked(), (0, 0));
    assert!(
        host.shared.borrow().is_empty(),
        "cluster_hash keeps no state"
    );
}

#[test]
fn a_client_cannot_pick_the_cluster_itself() {
    let (mut host, mut e) = hash_engine();
    let got = send(&mut host, &mut e, 2, &[("x-user", "bob"), (HEADER, C)]);
    assert_eq!(got.as_deref(), Some(B));
    let n = host
        .request_headers
        .iter()
        .filter(|(k, _)| k == HEADER)
        .count();
    assert_eq!(n, 1);
}

#[test]
fn hash_without_its_header_answers_403() {
    let (mut host, mut e) = hash_engine();
    for (ctx, headers) in [(2, vec![]), (3, vec![("x-user", "")])] {
        host.local_responses.clear();
        let got = send(&mut host, &mut e, ctx, &headers);
        assert_eq!(
            e.on_request_headers(&mut host, ctx + 10, false),
            Verdict::Pause
        );
        assert_eq!(got, None, "no cluster written");
        assert_eq!(
            host.local_responses[0],
            (403, "ai_lb_hash_header_required".into())
        );
        end(&mut host, &mut e, ctx);
        end(&mut host, &mut e, ctx + 10);
    }
    assert_eq!(host.metric("ai_lb.cluster_hash.rejected_403"), 4);
    assert_eq!(host.metric("ai_lb.cluster_hash.routed"), 0);
    assert_eq!(e.tracked(), (0, 0));
}

#[test]
fn hash_takes_a_10_kb_header_value() {
    let (mut host, mut e) = hash_engine();
    let value = "k".repeat(10 * 1024);
    let got = send(&mut host, &mut e, 2, &[("x-user", &value)]);
    assert_eq!(got.as_deref(), Some(hash_cluster(value.as_bytes())));
}

#[test]
fn header_write_failure_answers_500() {
    let (mut host, mut e) = metrics_engine("LeastBusy", "");
    host.set_header_status = Some(HostErrorKind::BadArgument);
    send(&mut host, &mut e, 2, &[]);
    assert_eq!(
        host.local_responses,
        vec![(500, "ai_lb_cluster_header_failed".into())]
    );
    assert_eq!(host.metric("ai_lb.cluster.header_failed_500"), 1);
    end(&mut host, &mut e, 2);
    assert_eq!(
        table(&host).stats().iter().map(|s| s.ongoing).sum::<i64>(),
        0
    );
}

#[test]
fn least_busy_spreads_open_requests_and_gives_every_count_back() {
    let (mut host, mut e) = metrics_engine("LeastBusy", "");
    let mut picked: Vec<String> = (2..5)
        .map(|ctx| send(&mut host, &mut e, ctx, &[]).unwrap())
        .collect();
    picked.sort();
    assert_eq!(picked, [A, B, C], "each open request on an idle service");
    assert!(table(&host).stats().iter().all(|s| s.ongoing == 1));
    for ctx in 2..5 {
        respond(&mut host, &mut e, ctx, "200");
        end(&mut host, &mut e, ctx);
        end(&mut host, &mut e, ctx); // on_log then on_done: once only
    }
    let t = table(&host);
    assert!(t.stats().iter().all(|s| s.ongoing == 0 && s.success == 1));
    assert_eq!(host.metric("ai_lb.cluster_metrics.routed"), 3);
    assert_eq!(e.tracked(), (0, 0));
}

#[test]
fn statistics_are_shared_by_every_worker_of_a_proxy() {
    let (mut host, mut vm1) = metrics_engine("LeastBusy", "");
    let mut host2 = MockHost::new().with_route("chat", "outbound|80||default");
    host2.shared = host.shared.clone();
    let config = PluginConfig::parse(
        format!(r#"{{"lb_type":"cluster","lb_policy":"cluster_metrics","lb_config":{{"mode":"LeastBusy","service_list":["{A}","{B}","{C}"]}}}}"#).as_bytes(),
    )
    .unwrap();
    let mut vm2 = Balancer::configure(&mut host2, config, 7, LogLevel::Trace);
    let a = send(&mut host, &mut vm1, 2, &[]).unwrap();
    let b = send(&mut host2, &mut vm2, 2, &[]).unwrap();
    let c = send(&mut host, &mut vm1, 3, &[]).unwrap();
    let mut all = vec![a, b.clone(), c];
    all.sort();
    assert_eq!(all, [A, B, C]);
    // A stream that answered well gives its count back at its end, not at its worker's next
    // write: held there, the other worker would see its service busy and steer around it.
    respond(&mut host2, &mut vm2, 2, "200");
    vm2.on_response_body(&mut host2, 2, 0, false);
    end(&mut host2, &mut vm2, 2);
    assert_eq!(
        table(&host).stats().iter().map(|s| s.ongoing).sum::<i64>(),
        2
    );
    assert_eq!(
        send(&mut host, &mut vm1, 4, &[]),
        Some(b),
        "the other worker's freed service is the least busy"
    );
    // And a stream that got no answer (a reset, a timeout: a failure) gives it back at its
    // end as well.
    send(&mut host2, &mut vm2, 3, &[]).unwrap();
    end(&mut host2, &mut vm2, 3);
    assert_eq!(
        table(&host).stats().iter().map(|s| s.ongoing).sum::<i64>(),
        3
    );
}

#[test]
fn ttft_is_recorded_at_the_first_body_chunk_and_total_latency_at_the_end() {
    let (mut host, mut e) = metrics_engine("LeastFirstTokenLatency", "");
    let t0 = host.now_ms;
    let svc = send(&mut host, &mut e, 2, &[]).unwrap();
    host.now_ms = t0 + 100;
    respond(&mut host, &mut e, 2, "200");
    assert!(
        stats(&host, &svc).ttft.is_empty(),
        "headers are not the first token"
    );
    host.now_ms = t0 + 300;
    assert!(
        !e.on_response_body(&mut host, 2, 0, false),
        "later chunks do not matter"
    );
    host.now_ms = t0 + 400;
    e.on_response_body(&mut host, 2, 0, false);
    let s = stats(&host, &svc);
    assert!(
        s.ttft.is_empty() && s.ewma_ttft.is_none(),
        "held by the worker until its next write"
    );
    assert!(s.total.is_empty());
    host.now_ms = t0 + 1000;
    end(&mut host, &mut e, 2);
    let s = stats(&host, &svc);
    assert_eq!((s.ttft.mean(), s.ewma_ttft), (300.0, Some(300.0)));
    assert_eq!((s.total.mean(), s.ewma_total), (1000.0, Some(1000.0)));
    assert_eq!((s.ongoing, s.success, s.errors), (0, 1, 0));
    // Now the fastest service by TTFT is one without samples (mean 0) and then this one.
    let next = send(&mut host, &mut e, 3, &[]).unwrap();
    assert_ne!(
        next, svc,
        "the measured one is slower than the unmeasured ones"
    );
}

#[test]
fn a_held_ttft_sample_is_written_by_the_workers_next_decision_which_sees_it() {
    let (mut host, mut e) = metrics_engine("LeastFirstTokenLatency", "");
    let t0 = host.now_ms;
    let slow = send(&mut host, &mut e, 2, &[]).unwrap();
    respond(&mut host, &mut e, 2, "200");
    host.now_ms = t0 + 300;
    e.on_response_body(&mut host, 2, 0, false);
    assert!(stats(&host, &slow).ttft.is_empty());
    // The next decision writes the sample in its own compare-and-swap, after reading it: the
    // measured service (mean 300) loses to the unmeasured ones (mean 0).
    for ctx in 3..9 {
        let next = send(&mut host, &mut e, ctx, &[]).unwrap();
        assert_ne!(next, slow, "the decision saw the held sample");
        assert_eq!(stats(&host, &slow).ttft.mean(), 300.0);
    }
}

#[test]
fn a_worker_holding_32_samples_writes_them_at_once() {
    let (mut host, mut e) = metrics_engine("AdaptiveScore", "");
    let t0 = host.now_ms;
    let picks: Vec<String> = (2..34)
        .map(|ctx| send(&mut host, &mut e, ctx, &[]).unwrap())
        .collect();
    host.now_ms = t0 + 50;
    let measured = |host: &MockHost| {
        table(host)
            .stats()
            .iter()
            .filter(|s| s.ewma_ttft.is_some())
            .count()
    };
    for ctx in 2..33 {
        respond(&mut host, &mut e, ctx, "200");
        e.on_response_body(&mut host, ctx, 0, false);
    }
    assert_eq!(measured(&host), 0, "31 samples are held");
    respond(&mut host, &mut e, 33, "200");
    e.on_response_body(&mut host, 33, 0, false);
    let mut services = picks.clone();
    services.sort();
    services.dedup();
    assert_eq!(measured(&host), services.len(), "the 32nd writes them all");
    for ctx in 2..34 {
        end(&mut host, &mut e, ctx);
    }
    assert_eq!(
        table(&host).stats().iter().map(|s| s.ongoing).sum::<i64>(),
        0
    );
}

#[test]
fn errors_are_penalised_and_the_service_cools_down() {
    let (mut host, mut e) = metrics_engine("AdaptiveScore", r#","p2c_choices":3"#);
    let t0 = host.now_ms;
    let bad = send(&mut host, &mut e, 2, &[]).unwrap();
    host.now_ms = t0 + 50;
    respond(&mut host, &mut e, 2, "503");
    e.on_response_body(&mut host, 2, 0, false);
    host.now_ms = t0 + 60;
    end(&mut host, &mut e, 2);
    let s = stats(&host, &bad);
    assert_eq!((s.errors, s.consecutive_errors, s.success), (1, 1, 0));
    assert_eq!(s.ewma_ttft, Some(100.0), "a failure counts double");
    assert!(s.ttft.is_empty(), "AdaptiveScore keeps no rings");
    assert_eq!(s.cooldown_until_ms, (t0 + 60 + 30_000) as i64);
    for ctx in 3..23 {
        let got = send(&mut host, &mut e, ctx, &[]).unwrap();
        assert_ne!(got, bad, "cooling down");
        respond(&mut host, &mut e, ctx, "200");
        end(&mut host, &mut e, ctx);
    }
    // A reset (no response headers) is an error too.
    let (mut host, mut e) = metrics_engine("LeastBusy", "");
    let svc = send(&mut host, &mut e, 2, &[]).unwrap();
    end(&mut host, &mut e, 2);
    assert_eq!(stats(&host, &svc).errors, 1);
}

#[test]
fn garbage_in_shared_data_starts_fresh_statistics() {
    let (mut host, mut e) = metrics_engine("LeastBusy", "");
    send(&mut host, &mut e, 2, &[]);
    end(&mut host, &mut e, 2);
    let key = host.shared.borrow().keys().next().unwrap().clone();
    host.shared
        .borrow_mut()
        .insert(key, (b"\xff\xfe not a record\n%%%\n".to_vec(), 9));
    let svc = send(&mut host, &mut e, 3, &[]).unwrap();
    assert_eq!(host.metric("ai_lb.cluster_metrics.stats_reset"), 1);
    let s = stats(&host, &svc);
    assert_eq!((s.ongoing, s.count), (1, 1));
    end(&mut host, &mut e, 3);
    assert_eq!(stats(&host, &svc).ongoing, 0);
}

#[test]
fn a_record_in_the_former_text_format_starts_fresh_statistics() {
    let (mut host, mut e) = metrics_engine("LeastBusy", "");
    send(&mut host, &mut e, 2, &[]);
    end(&mut host, &mut e, 2);
    let key = host.shared.borrow().keys().next().unwrap().clone();
    let text =
        format!("{A} 1 9 0 0 0 0 - - - -\n{B} 0 0 0 0 0 0 - - - -\n{C} 0 0 0 0 0 0 - - - -\n");
    host.shared.borrow_mut().insert(key, (text.into_bytes(), 4));
    let svc = send(&mut host, &mut e, 3, &[]).unwrap();
    assert_eq!(host.metric("ai_lb.cluster_metrics.stats_reset"), 1);
    let t = table(&host);
    assert_eq!(t.stats().iter().map(|s| s.count).sum::<u64>(), 1);
    assert_eq!(stats(&host, &svc).ongoing, 1);
    end(&mut host, &mut e, 3);
    assert_eq!(stats(&host, &svc).ongoing, 0);
    assert_eq!(
        host.metric("ai_lb.cluster_metrics.stats_reset"),
        1,
        "counted once"
    );
}

#[test]
fn shared_data_failure_still_routes_and_holds_nothing() {
    let (mut host, mut e) = metrics_engine("AdaptiveScore", "");
    host.shared_set_status = Some(HostErrorKind::BadArgument);
    let got = send(&mut host, &mut e, 2, &[]).unwrap();
    assert!([A, B, C].contains(&got.as_str()));
    assert_eq!(host.metric("ai_lb.cluster_metrics.stats_failed"), 1);
    e.on_response_body(&mut host, 2, 0, false);
    end(&mut host, &mut e, 2);
    assert_eq!(host.metric("ai_lb.release.failed"), 0, "nothing was held");
    assert_eq!(e.tracked(), (0, 0));
}

const GLOBAL: &str =
    r#","global_inflight_enabled":true,"serviceFQDN":"redis.static","servicePort":6379"#;

/// AdaptiveScore with the global in-flight count; the script loads sent at configure answered.
fn global_engine() -> (MockHost, Balancer) {
    let (mut host, mut e) = metrics_engine("AdaptiveScore", GLOBAL);
    let loads: Vec<u32> = (0..host.redis_calls.len() as u32)
        .map(|n| host.next_token - 4 * (n + 1))
        .collect();
    assert_eq!(loads.len(), 2, "the service acquire and release scripts");
    for token in loads {
        deliver(&mut host, &mut e, token, b"$3\r\nsha\r\n");
    }
    assert_eq!(e.tracked(), (0, 0));
    host.redis_calls.clear();
    (host, e)
}

#[test]
fn global_inflight_with_redis_down_routes_locally_and_loses_nothing() {
    let (mut host, mut e) = global_engine();
    host.redis_call_status = Some(HostErrorKind::NotFound);
    for ctx in 2..6 {
        assert!(send(&mut host, &mut e, ctx, &[]).is_some());
        respond(&mut host, &mut e, ctx, "200");
        end(&mut host, &mut e, ctx);
    }
    assert!(table(&host).stats().iter().all(|s| s.ongoing == 0));
    assert_eq!(host.metric("ai_lb.cluster_metrics.routed"), 4);
    assert_eq!(host.metric("ai_lb.cluster_metrics.inflight_local"), 4);
    assert_eq!(host.metric("ai_lb.cluster_metrics.inflight_global"), 0);
    assert_eq!(e.tracked(), (0, 0));
}

/// Answers a Redis call the way `redis-server` would reply to the script.
fn deliver(host: &mut MockHost, e: &mut Balancer, token: u32, reply: &[u8]) {
    host.reply = Some(reply.to_vec());
    e.on_redis_reply(host, token, CallStatus::Ok, reply.len());
    host.reply = None;
}

/// A held request whose global pick is in flight: its token.
fn global_pick(host: &mut MockHost, e: &mut Balancer, ctx: u32) -> u32 {
    host.request_headers.clear();
    host.live_contexts.push(ctx);
    let before = host.redis_calls.len();
    assert_eq!(e.on_request_headers(host, ctx, false), Verdict::Pause);
    assert_eq!(host.redis_calls.len(), before + 1, "one script call");
    assert_eq!(
        header(host, HEADER),
        None,
        "nothing written before Redis answers"
    );
    host.next_token - 4
}

#[test]
fn global_inflight_asks_redis_with_local_scores_and_gives_the_lease_back() {
    let (mut host, mut e) = global_engine();
    let token = global_pick(&mut host, &mut e, 2);
    // The body arriving meanwhile must not release the held headers to the router.
    assert_eq!(
        e.on_request_body(&mut host, 2, 100, true),
        Verdict::PauseWatermark
    );
    let args = host.last_query_args();
    assert_eq!(args[0], "EVALSHA");
    assert_eq!(
        &args[3..5],
        [
            "higress:adaptive_score_inflight:chat:AdaptiveScore",
            "{higress:adaptive_score_inflight:chat:AdaptiveScore}:leases"
        ]
    );
    // Every acquire reclaims up to 4 expired leases (docs/redis-data-model.md §6, §8).
    assert_eq!(args[10], "4", "{args:?}");
    // Two candidates (P2C), no samples yet: Go scores them by in flight + 1.
    let pairs = &args[11..];
    assert_eq!(pairs.len(), 4, "{args:?}");
    assert_eq!((pairs[1].as_str(), pairs[3].as_str()), ("1.0", "1.0"));
    let chosen = pairs[2].clone();
    let request_id = args[8].clone();
    let reply = crate::redis::resp::encode_command(&["OK", &chosen, "1", "1"]);
    deliver(&mut host, &mut e, token, &reply);
    assert_eq!(header(&host, HEADER), Some(chosen.clone()));
    assert_eq!(host.resumed, 1);
    assert_eq!(host.metric("ai_lb.cluster_metrics.inflight_global"), 1);
    let t = table(&host);
    let i = t.index_of(&chosen).unwrap();
    assert_eq!((t.stats()[i].ongoing, t.stats()[i].count), (1, 1));
    respond(&mut host, &mut e, 2, "200");
    host.redis_calls.clear();
    end(&mut host, &mut e, 2);
    let args = host.last_query_args();
    assert_eq!(args[args.len() - 1], format!("{request_id}|{chosen}|1"));
    assert_eq!(table(&host).stats()[i].ongoing, 0);
    // The release's reply ends the call.
    let release = host.next_token - 4;
    deliver(&mut host, &mut e, release, b":1\r\n");
    assert_eq!(e.tracked(), (0, 0));
}

#[test]
fn a_global_pick_whose_stream_ended_is_released_on_arrival() {
    let (mut host, mut e) = global_engine();
    let token = global_pick(&mut host, &mut e, 2);
    let args = host.last_query_args();
    let (chosen, request_id) = (args[11].clone(), args[8].clone());
    end(&mut host, &mut e, 2);
    host.live_contexts.retain(|&c| c != 2);
    let reply = crate::redis::resp::encode_command(&["OK", &chosen, "1", "1"]);
    deliver(&mut host, &mut e, token, &reply);
    let args = host.last_query_args();
    assert_eq!(args[args.len() - 1], format!("{request_id}|{chosen}|1"));
    assert_eq!(host.metric("ai_lb.release.orphaned"), 1);
    let counted_here = host
        .shared
        .borrow()
        .keys()
        .any(|k| k.starts_with("ailb.cm."));
    assert!(!counted_here, "nothing was counted in this proxy");
}

#[test]
fn a_lost_global_reply_routes_locally_and_releases_every_candidate() {
    let (mut host, mut e) = global_engine();
    let token = global_pick(&mut host, &mut e, 2);
    e.on_redis_reply(&mut host, token, CallStatus::Failed, 0);
    assert!(header(&host, HEADER).is_some(), "routed by the local path");
    assert_eq!(host.resumed, 1);
    let args = host.last_query_args();
    assert_eq!(
        args.len(),
        5 + 2,
        "a release naming both candidates: {args:?}"
    );
    assert_eq!(host.metric("ai_lb.cluster_metrics.inflight_local"), 1);
    end(&mut host, &mut e, 2);
    assert!(table(&host).stats().iter().all(|s| s.ongoing == 0));
}

#[test]
fn endpoint_routes_beside_a_cluster_rule_strip_its_header_too() {
    let (mut host, mut e) = engine(&format!(
        r#"{{"lb_type":"cluster","lb_policy":"cluster_hash","lb_config":{{"clusters":[{{"cluster":"{A}","weight":100}}]}},"_rules_":[{{"_match_route_":["other"],"lb_policy":"endpoint_metrics"}}]}}"#
    ));
    host.properties
        .insert("route_name".into(), b"other".to_vec());
    host.request_headers = vec![(HEADER.into(), B.into())];
    e.on_request_headers(&mut host, 2, false);
    assert_eq!(
        header(&host, HEADER),
        None,
        "stripped on the endpoint_metrics route"
    );
    host.properties
        .insert("route_name".into(), b"unmatched".to_vec());
    let got = send(
        &mut host,
        &mut e,
        3,
        &[(HEADER, B), ("x-mse-consumer", "u")],
    );
    assert_eq!(got.as_deref(), Some(A));
}

#[test]
fn cluster_rules_still_match_by_route() {
    // Names are read only when something needs them (a rule here): the rule's cluster wins
    // on its route, the global one elsewhere.
    let (mut host, mut e) = engine(&format!(
        r#"{{"lb_type":"cluster","lb_policy":"cluster_hash","lb_config":{{"hash_header":"x-user","clusters":[{{"cluster":"{A}","weight":100}}]}},"_rules_":[{{"_match_route_":["r"],"lb_type":"cluster","lb_policy":"cluster_hash","lb_config":{{"hash_header":"x-user","clusters":[{{"cluster":"{B}","weight":100}}]}}}}]}}"#
    ));
    for (ctx, route, want) in [(2, "r", B), (3, "q", A)] {
        host.properties
            .insert("route_name".into(), route.as_bytes().to_vec());
        let got = send(&mut host, &mut e, ctx, &[("x-user", "u")]);
        assert_eq!(got.as_deref(), Some(want), "{route}");
        end(&mut host, &mut e, ctx);
    }
}

#[test]
fn request_names_are_read_only_where_something_needs_them() {
    let rule = |matcher: &str, policy: &str| {
        format!(
            r#"{{"lb_type":"cluster","lb_policy":"cluster_hash","lb_config":{{"clusters":[{{"cluster":"{A}","weight":100}}]}},"_rules_":[{{{matcher},{policy}}}]}}"#
        )
    };
    let to_b = format!(
        r#""lb_type":"cluster","lb_policy":"cluster_hash","lb_config":{{"clusters":[{{"cluster":"{B}","weight":100}}]}}"#
    );
    // (`:authority` read, `cluster_name` read) by the last request.
    let reads = |host: &MockHost| {
        let read = (
            host.header_reads.borrow().iter().any(|h| h == ":authority"),
            host.property_reads
                .borrow()
                .iter()
                .any(|p| p == "cluster_name"),
        );
        host.header_reads.borrow_mut().clear();
        host.property_reads.borrow_mut().clear();
        read
    };
    // A domain rule reads `:authority`, and routes by it (port stripped).
    let (mut host, mut e) = engine(&rule(r#""_match_domain_":["api.example.com"]"#, &to_b));
    for (ctx, authority, want) in [(2, "api.example.com:443", B), (3, "other.example.com", A)] {
        let got = send(
            &mut host,
            &mut e,
            ctx,
            &[(":authority", authority), ("x-mse-consumer", "u")],
        );
        assert_eq!(got.as_deref(), Some(want), "{authority}");
        assert_eq!(reads(&host), (true, false), "{authority}");
    }
    // A service rule reads `cluster_name` before the choice.
    let (mut host, mut e) = engine(&rule(r#""_match_service_":["default"]"#, &to_b));
    let got = send(&mut host, &mut e, 2, &[("x-mse-consumer", "u")]);
    assert_eq!(
        got.as_deref(),
        Some(B),
        "the mock's cluster is outbound|80||default"
    );
    assert_eq!(reads(&host), (false, true));
    // A route rule to a cluster policy reads the route alone: two host calls less a request.
    let (mut host, mut e) = engine(&rule(r#""_match_route_":["chat"]"#, &to_b));
    let got = send(
        &mut host,
        &mut e,
        2,
        &[(":authority", "api.example.com"), ("x-mse-consumer", "u")],
    );
    assert_eq!(got.as_deref(), Some(B), "the route rule matched");
    assert_eq!(reads(&host), (false, false));
    // An endpoint policy's route keys read `cluster_name` once its config is chosen.
    let (mut host, mut e) = engine(&rule(
        r#""_match_route_":["chat"]"#,
        r#""lb_policy":"endpoint_metrics""#,
    ));
    host.live_contexts.push(2);
    e.on_request_headers(&mut host, 2, false);
    assert_eq!(reads(&host), (false, true));
}

/// How many requests the balancer keeps.
fn kept(e: &Balancer) -> usize {
    e.requests.len()
}

#[test]
fn a_routed_cluster_request_lives_in_the_request_machine_until_its_end() {
    // cluster_metrics: the count, status and first byte live in its `Held::Service`.
    let (mut host, mut e) = metrics_engine("AdaptiveScore", "");
    let t0 = host.now_ms;
    let svc = send(&mut host, &mut e, 2, &[]).unwrap();
    assert_eq!(kept(&e), 1);
    assert!(e.wants_response_body(2), "its first byte is still to come");
    host.response_headers = vec![(":status".into(), "200".into())];
    assert!(
        e.on_response_headers(&mut host, 2),
        "the glue learns it at once"
    );
    host.now_ms = t0 + 40;
    e.on_response_body(&mut host, 2, 0, false);
    assert!(!e.wants_response_body(2), "only the first chunk matters");
    host.now_ms = t0 + 90;
    e.on_response_body(&mut host, 2, 0, false);
    host.now_ms = t0 + 100;
    end(&mut host, &mut e, 2);
    end(&mut host, &mut e, 2); // on_log then on_done: given back once
    assert_eq!(kept(&e), 0);
    let s = stats(&host, &svc);
    assert_eq!(
        (s.ongoing, s.success, s.errors),
        (0, 1, 0),
        "its status was read"
    );
    // The first chunk's time, and the stream's.
    assert_eq!((s.ewma_ttft, s.ewma_total), (Some(40.0), Some(100.0)));
    assert_eq!(host.metric("ai_lb.cluster_metrics.routed"), 1);
    // cluster_hash holds nothing once routed: kept until its end all the same.
    let (mut host, mut e) = hash_engine();
    assert!(send(&mut host, &mut e, 2, &[("x-user", "alice")]).is_some());
    assert_eq!(kept(&e), 1);
    assert!(!e.wants_response_body(2));
    assert!(!e.on_response_headers(&mut host, 2));
    end(&mut host, &mut e, 2);
    assert_eq!(kept(&e), 0);
    assert_eq!(host.metric("ai_lb.cluster_hash.routed"), 1);
}

#[test]
fn refusals_and_a_failed_publish_settle_in_the_request_machine() {
    // The 403 settles in the machine until its stream ends.
    let (mut host, mut e) = hash_engine();
    send(&mut host, &mut e, 2, &[]);
    assert_eq!(host.local_responses.len(), 1);
    assert_eq!(kept(&e), 1);
    end(&mut host, &mut e, 2);
    assert_eq!(kept(&e), 0);
    // A header that cannot be written: the machine answers 500 and the count goes back.
    let (mut host, mut e) = metrics_engine("AdaptiveScore", "");
    host.set_header_status = Some(HostErrorKind::BadArgument);
    send(&mut host, &mut e, 2, &[]);
    assert_eq!(
        host.local_responses,
        vec![(500, "ai_lb_cluster_header_failed".into())]
    );
    assert_eq!(kept(&e), 1);
    assert!(table(&host).stats().iter().all(|s| s.ongoing == 0));
    end(&mut host, &mut e, 2);
    assert_eq!(kept(&e), 0);
    // A global in-flight count asks Redis: held in the machine while it does.
    let (mut host, mut e) = global_engine();
    global_pick(&mut host, &mut e, 2);
    assert_eq!(kept(&e), 1);
    end(&mut host, &mut e, 2);
    assert_eq!(kept(&e), 0, "its pick waits among the orphans");
}

#[test]
fn a_routed_cluster_metrics_request_replaces_the_clients_header() {
    let (mut host, mut e) = metrics_engine("AdaptiveScore", "");
    let chosen = send(&mut host, &mut e, 2, &[(HEADER, "evil"), (HEADER, "evil2")]);
    assert!(chosen.as_deref().is_some_and(|c| [A, B, C].contains(&c)));
    let copies = host.request_headers.iter().filter(|(k, _)| k == HEADER);
    assert_eq!(
        copies.count(),
        1,
        "the published value replaced both copies"
    );
    assert_eq!(header(&host, HEADER), chosen);
    end(&mut host, &mut e, 2);
    // A publish that fails: the client's copy is stripped before the machine answers,
    // whatever it answers.
    let (mut host, mut e) = metrics_engine("AdaptiveScore", "");
    host.set_header_status = Some(HostErrorKind::BadArgument);
    send(&mut host, &mut e, 2, &[(HEADER, "evil")]);
    assert_eq!(header(&host, HEADER), None);
    assert_eq!(host.header_removes, 1);
    end(&mut host, &mut e, 2);
    // cluster_hash reads a request header (its hash key, which may be any name): it strips
    // first, as every other policy does.
    let (mut host, mut e) = hash_engine();
    let chosen = send(
        &mut host,
        &mut e,
        2,
        &[(HEADER, "evil"), ("x-user", "alice")],
    );
    assert!(chosen.is_some_and(|c| c != "evil"));
    assert_eq!(host.header_removes, 1);
}
