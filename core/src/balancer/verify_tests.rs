//! The engine-verified index through the balancer on the mock host (docs/redis-data-model.md
//! §5 "Engine-verified keys", §9): a stream is asked for its usage and the usage event taken
//! out again, cached tokens are compared with the pick's prediction, and a pod found emptied
//! (unrelated conversations all coming back with nothing cached) has its generation bumped — by
//! a Redis script call (Higress), or in shared data (plain Envoy), after which the pod's older
//! conversations are no longer hits on it; a pod that only evicts keeps them.

use super::tests::{configured, deliver};
use super::*;
use crate::config::Build;
use crate::host::mock::MockHost;
use crate::redis::resp::encode_command;
use serde_json::json;

const CLUSTER: &str = "outbound|8000||llm.static";

fn redis_route(extra: serde_json::Value) -> (MockHost, Balancer) {
    let mut lb = json!({"serviceFQDN": "redis.static", "servicePort": 6379});
    if let (Some(a), serde_json::Value::Object(b)) = (lb.as_object_mut(), extra) {
        a.extend(b);
    }
    let cfg = json!({"lb_policy": "prefix_cache", "lb_config": lb}).to_string();
    let host = MockHost::new()
        .with_route("chat", CLUSTER)
        .with_hosts(&[("10.0.0.1:80", "Healthy"), ("10.0.0.2:80", "Healthy")]);
    configured(host, PluginConfig::parse(cfg.as_bytes()).unwrap())
}

/// A chat body whose blocks are long enough for the shortfall rule (a few hundred tokens).
fn chat(stream: Option<bool>, options: Option<serde_json::Value>, turns: &[&str]) -> Vec<u8> {
    let mut messages = vec![json!({"role": "system", "content": "s".repeat(800)})];
    for (i, t) in turns.iter().enumerate() {
        if i > 0 {
            messages.push(json!({"role": "assistant", "content": "a".repeat(800)}));
        }
        messages.push(json!({"role": "user", "content": t.repeat(200)}));
    }
    let mut body = json!({"model": "m", "messages": messages});
    if let Some(s) = stream {
        body["stream"] = json!(s);
    }
    if let Some(o) = options {
        body["stream_options"] = o;
    }
    body.to_string().into_bytes()
}

/// Sends `body` as request `ctx`; the pick's token.
fn send(host: &mut MockHost, e: &mut Balancer, ctx: u32, body: &[u8]) -> u32 {
    host.live_contexts.push(ctx);
    host.body = body.to_vec();
    host.request_headers = vec![("content-length".into(), body.len().to_string())];
    assert_eq!(e.on_request_headers(host, ctx, false), Verdict::Pause);
    assert_eq!(
        e.on_request_body(host, ctx, body.len(), true),
        Verdict::Pause
    );
    host.next_token - 4
}

fn picked(host: &mut MockHost, e: &mut Balancer, token: u32, endpoint: &str, depth: u32) {
    let reply = encode_command(&["OK", endpoint, &depth.to_string(), "0", "0", "0"]);
    deliver(host, e, token, &reply);
}

/// The response `chunks` through request `ctx` with `status`; what the client receives.
fn respond(
    host: &mut MockHost,
    e: &mut Balancer,
    ctx: u32,
    status: &str,
    chunks: &[&str],
) -> String {
    respond_with(host, e, ctx, &[(":status", status)], chunks)
}

/// An event stream's 200.
const SSE: &[(&str, &str)] = &[(":status", "200"), ("content-type", "text/event-stream")];

/// [`respond`] with these response headers.
fn respond_with(
    host: &mut MockHost,
    e: &mut Balancer,
    ctx: u32,
    headers: &[(&str, &str)],
    chunks: &[&str],
) -> String {
    host.response_headers = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut wants = e.on_response_headers(host, ctx);
    let mut client = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        host.response_body = c.as_bytes().to_vec();
        if wants {
            wants = e.on_response_body(host, ctx, c.len(), i + 1 == chunks.len());
        }
        client.extend_from_slice(&host.response_body);
    }
    host.live_contexts.retain(|&c| c != ctx);
    e.on_done(host, ctx);
    String::from_utf8(client).unwrap()
}

fn usage_event(prompt: u64, cached: u64) -> String {
    format!(
        "data: {{\"id\":\"c\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt},\"completion_tokens\":3,\"prompt_tokens_details\":{{\"cached_tokens\":{cached}}}}}}}\n\n"
    )
}

const TOKEN: &str =
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
const DONE: &str = "data: [DONE]\n\n";

#[test]
fn a_stream_is_asked_for_usage_and_the_client_never_sees_it() {
    let (mut host, mut e) = redis_route(json!({}));
    let body = chat(Some(true), None, &["q"]);
    let t = send(&mut host, &mut e, 2, &body);
    assert_eq!(host.body_writes, 0, "the body is rewritten with the choice");
    picked(&mut host, &mut e, t, "10.0.0.2:80", 1);
    assert_eq!(host.body_writes, 1);
    let sent: serde_json::Value = serde_json::from_slice(&host.body).unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    assert_eq!(
        host.request_header("content-length").unwrap(),
        Some(host.body.len().to_string())
    );
    let usage = usage_event(460, 448);
    let (a, b) = usage.split_at(40);
    let client = respond_with(&mut host, &mut e, 2, SSE, &[TOKEN, a, b, DONE]);
    assert_eq!(
        client,
        format!("{TOKEN}{DONE}"),
        "the usage event is taken out"
    );
    assert_eq!(host.metric("ai_lb.prefix.verified"), 1);
    assert_eq!(host.metric("ai_lb.prefix.cached_tokens"), 448);
    assert_eq!(host.metric("ai_lb.prefix.prompt_tokens"), 460);
    // The system prompt and the question: about 1,000 bytes.
    // The system prompt and the question, about 1,000 bytes (250 tokens by the plugin's
    // estimate), all matched: counted in the engine's tokens, its 460.
    assert_eq!(host.metric("ai_lb.prefix.predicted_tokens"), 460);
    assert_eq!(
        host.metric("ai_lb.prefix.verified.10.0.0.2:80.cached_tokens"),
        448
    );
    assert_eq!(
        host.metric("ai_lb.prefix.verified.10.0.0.2:80.prompt_tokens"),
        460
    );
    assert_eq!(host.metric("ai_lb.prefix.shortfall"), 0);
    assert_eq!(e.tracked().0, 0, "nothing kept past the stream");
}

#[test]
fn a_client_that_asked_for_usage_gets_its_stream_untouched() {
    let (mut host, mut e) = redis_route(json!({}));
    let body = chat(Some(true), Some(json!({"include_usage": true})), &["q"]);
    let t = send(&mut host, &mut e, 2, &body);
    assert_eq!(host.body_writes, 0);
    picked(&mut host, &mut e, t, "10.0.0.1:80", 0);
    let usage = usage_event(460, 0);
    let client = respond_with(&mut host, &mut e, 2, SSE, &[TOKEN, &usage, DONE]);
    assert_eq!(client, format!("{TOKEN}{usage}{DONE}"));
    assert_eq!(
        host.metric("ai_lb.prefix.verified"),
        1,
        "a miss predicts nothing"
    );
    assert_eq!(host.metric("ai_lb.prefix.shortfall"), 0);
}

#[test]
fn a_compressed_or_non_sse_answer_is_never_edited() {
    let usage = usage_event(460, 448);
    for headers in [
        &[
            (":status", "200"),
            ("content-type", "text/event-stream"),
            ("content-encoding", "gzip"),
        ][..],
        &[(":status", "200"), ("content-type", "application/json")],
    ] {
        let (mut host, mut e) = redis_route(json!({}));
        let t = send(&mut host, &mut e, 2, &chat(Some(true), None, &["q"]));
        picked(&mut host, &mut e, t, "10.0.0.2:80", 1);
        assert_eq!(host.body_writes, 1);
        let (a, b) = TOKEN.split_at(9);
        let client = respond_with(&mut host, &mut e, 2, headers, &[a, b, &usage, DONE]);
        assert_eq!(client, format!("{TOKEN}{usage}{DONE}"), "{headers:?}");
        assert_eq!(host.metric("ai_lb.prefix.verified"), 1, "still read");
    }
}

#[test]
fn an_unreadable_chunk_is_never_written() {
    let (mut host, mut e) = redis_route(json!({}));
    let t = send(&mut host, &mut e, 2, &chat(Some(true), None, &["q"]));
    picked(&mut host, &mut e, t, "10.0.0.2:80", 1);
    host.response_body_status = Some(crate::host::HostErrorKind::InternalFailure);
    let usage = usage_event(460, 448);
    let client = respond_with(&mut host, &mut e, 2, SSE, &[TOKEN, &usage, DONE]);
    assert_eq!(client, format!("{TOKEN}{usage}{DONE}"), "passed as it is");
    assert_eq!(host.metric("ai_lb.prefix.verified"), 0);
    assert_eq!(e.tracked().0, 0);
}

#[test]
fn a_spilled_or_session_pick_predicts_nothing() {
    for (spilled, session) in [("1", "0"), ("0", "1")] {
        let (mut host, mut e) = redis_route(json!({}));
        let t = send(&mut host, &mut e, 2, &chat(None, None, &["q", "r"]));
        let reply = encode_command(&["OK", "10.0.0.1:80", "2", spilled, session, "0"]);
        deliver(&mut host, &mut e, t, &reply);
        let json = r#"{"usage":{"prompt_tokens":900,"prompt_tokens_details":{"cached_tokens":0}}}"#;
        respond(&mut host, &mut e, 2, "200", &[json]);
        assert_eq!(host.metric("ai_lb.prefix.verified"), 1);
        assert_eq!(host.metric("ai_lb.prefix.predicted_tokens"), 0);
        assert_eq!(
            host.metric("ai_lb.prefix.shortfall"),
            0,
            "spilled {spilled}"
        );
    }
}

#[test]
fn only_an_emptied_pod_is_bumped_in_redis() {
    let (mut host, mut e) = redis_route(json!({}));
    let json = r#"{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":900,"prompt_tokens_details":{"cached_tokens":16}}}"#;
    let full = json.replace("\"cached_tokens\":16", "\"cached_tokens\":900");
    // Each answer of conversation `first` (its first user message) picked at depth 2 on
    // 10.0.0.2: the EVALs sent after it.
    let mut ctx = 20;
    let mut answer = |host: &mut MockHost, e: &mut Balancer, first: &str, json: &str| {
        ctx += 1;
        let t = send(host, e, ctx, &chat(None, None, &[first, "r"]));
        assert_eq!(
            host.body_writes, 0,
            "not streamed: the JSON answer has the usage"
        );
        picked(host, e, t, "10.0.0.2:80", 2);
        let calls = host.redis_calls.len();
        let (a, b) = json.split_at(50);
        assert_eq!(respond(host, e, ctx, "200", &[a, b]), json);
        (calls..host.redis_calls.len())
            .map(|i| host.query_args(i))
            .filter(|a| a[0] == "EVAL")
            .collect::<Vec<_>>()
    };
    // One conversation short again and again is eviction: nothing is forgotten (each request
    // recomputed its prompt on the pod, where its pick had pointed its keys).
    for _ in 0..4 {
        assert!(answer(&mut host, &mut e, "q", json).is_empty());
    }
    let per_q = host.metric("ai_lb.prefix.predicted_tokens") / 4;
    assert_eq!(host.metric("ai_lb.prefix.shortfall"), 4);
    assert_eq!(host.metric("ai_lb.prefix.generation_bumps"), 0);
    // Unrelated conversations with nothing cached, but one that held its blocks between.
    let n = crate::verify::flush::FLUSH_CONVERSATIONS;
    for held in ["h1", "h2"] {
        assert!(
            answer(&mut host, &mut e, held, &full).is_empty(),
            "as predicted"
        );
        let x0 = if held == "h1" { 1 } else { n };
        for x in x0..x0 + n - 1 {
            assert!(answer(&mut host, &mut e, &format!("x{x}"), json).is_empty());
        }
    }
    assert_eq!(host.metric("ai_lb.prefix.generation_bumps"), 0);
    // The next unrelated one: the pod was emptied. The bump re-writes this request's chain at
    // the new generation.
    let evals = answer(&mut host, &mut e, &format!("x{}", 2 * n - 1), json);
    assert_eq!(host.metric("ai_lb.prefix.generation_bumps"), 1);
    assert_eq!(evals.len(), 1);
    let args = &evals[0];
    assert!(args[1].contains("HINCRBY"), "{}", args[1]);
    assert_eq!(args[3], "ailb:{chat|outbound|8000||llm.static}:gen");
    assert!(args[4].contains(":px:"), "the chain re-written: {args:?}");
    assert!(args.iter().any(|a| a == "10.0.0.2:80"));
    // A mild one (at least half, but more than the last block short) only counts.
    let mild = format!("\"cached_tokens\":{}", per_q / 2 + 4);
    let json = json.replace("\"cached_tokens\":16", &mild);
    assert!(answer(&mut host, &mut e, "q", &json).is_empty());
    assert_eq!(host.metric("ai_lb.prefix.shortfall_mild"), 1);
    assert_eq!(host.metric("ai_lb.prefix.shortfall"), 4 + 2 * n as i64 - 1);
    assert_eq!(host.metric("ai_lb.prefix.generation_bumps"), 1);
}

#[test]
fn errors_garbage_and_missing_usage_verify_nothing() {
    let (mut host, mut e) = redis_route(json!({}));
    let body = chat(None, None, &["q"]);
    let t = send(&mut host, &mut e, 2, &body);
    picked(&mut host, &mut e, t, "10.0.0.2:80", 1);
    respond(
        &mut host,
        &mut e,
        2,
        "503",
        &[r#"{"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":0}}}"#],
    );
    assert_eq!(host.metric("ai_lb.prefix.verified"), 0);
    assert_eq!(
        host.metric("ai_lb.prefix.verify_no_usage"),
        0,
        "not a 2xx: not counted"
    );
    for (ctx, answer) in [(3, "{\"choices\":[]}"), (4, "\u{0}\u{ff}garbage"), (5, "")] {
        let t = send(&mut host, &mut e, ctx, &body);
        picked(&mut host, &mut e, t, "10.0.0.2:80", 1);
        respond(&mut host, &mut e, ctx, "200", &[answer]);
    }
    assert_eq!(host.metric("ai_lb.prefix.verify_no_usage"), 3);
    assert_eq!(host.metric("ai_lb.prefix.shortfall"), 0);
    assert_eq!(e.tracked().0, 0);
}

#[test]
fn verify_cached_tokens_false_reads_nothing() {
    let (mut host, mut e) = redis_route(json!({"verifyCachedTokens": false}));
    let body = chat(Some(true), None, &["q"]);
    let t = send(&mut host, &mut e, 2, &body);
    assert_eq!(host.body_writes, 0);
    picked(&mut host, &mut e, t, "10.0.0.2:80", 1);
    host.response_headers = vec![(":status".into(), "200".into())];
    assert!(
        !e.on_response_headers(&mut host, 2),
        "the body is not watched"
    );
}

/// Plain Envoy: a pod that evicts keeps its conversations; the generation lives in shared data,
/// and a bump (the pod emptied: unrelated conversations all back with nothing cached) makes the
/// pod's older entries name no endpoint, the bumping conversation recorded at the new generation.
#[test]
fn plain_envoy_only_an_emptied_pod_forgets_its_older_conversations() {
    let endpoints = ["10.0.0.1:8000", "10.0.0.2:8000"];
    let cfg = json!({"lb_policy": "prefix_cache", "lb_config": {
        "endpoints": endpoints, "debugHeader": "x-dbg"}});
    let config = PluginConfig::parse_for(cfg.to_string().as_bytes(), Build::Envoy).unwrap();
    let mut host = MockHost::new();
    let mut e = Balancer::configure(&mut host, config, 42, LogLevel::Trace);
    let mut ctx = 10;
    let mut turn = |host: &mut MockHost, e: &mut Balancer, turns: &[&str], cached: u64| {
        ctx += 1;
        host.body = chat(None, None, turns);
        host.request_headers = Vec::new();
        host.live_contexts.push(ctx);
        assert_eq!(e.on_request_headers(host, ctx, false), Verdict::Pause);
        let len = host.body.len();
        assert_eq!(e.on_request_body(host, ctx, len, true), Verdict::Continue);
        let answer = format!(
            r#"{{"usage":{{"prompt_tokens":900,"prompt_tokens_details":{{"cached_tokens":{cached}}}}}}}"#
        );
        respond(host, e, ctx, "200", &[&answer]);
        let debug = host
            .response_headers
            .iter()
            .find(|(k, _)| k == "x-dbg")
            .map(|(_, v)| v.clone())
            .unwrap();
        debug
    };
    let pod = |d: &str| d.split(';').next().unwrap().to_string();
    // Two conversations on the proxy, each turn answered as a warm engine would.
    let a1 = turn(&mut host, &mut e, &["a"], 0);
    let b1 = turn(&mut host, &mut e, &["b"], 0);
    assert_eq!(pod(&a1), pod(&b1), "{a1} / {b1}: hashing");
    let a2 = turn(&mut host, &mut e, &["a", "a2"], 600);
    assert!(a2.ends_with("prefix_hit"), "{a2}");
    // The pod evicted a: its next turns come back with nothing cached. Nothing is forgotten:
    // each recomputed a's prompt on the pod, where its pick recorded it.
    for t in 3..6 {
        let turns = ["a", "a2", "a3", "a4", "a5"];
        let d = turn(&mut host, &mut e, &turns[..t], 0);
        assert!(d.ends_with("prefix_hit"), "{d}");
    }
    assert_eq!(host.metric("ai_lb.prefix.shortfall"), 3);
    let b2 = turn(&mut host, &mut e, &["b", "b2"], 700);
    assert!(b2.ends_with("prefix_hit"), "{b2}");
    assert_eq!(host.metric("ai_lb.prefix.generation_bumps"), 0);
    // The pod was emptied: unrelated conversations on it come back with nothing cached.
    let n = crate::verify::flush::FLUSH_CONVERSATIONS;
    let mut others = Vec::new();
    for c in 0..20 * n {
        let name = format!("c{c}");
        if pod(&turn(&mut host, &mut e, &[&name], 0)) == pod(&b1) {
            others.push(name);
        }
        if others.len() == n {
            break;
        }
    }
    assert_eq!(others.len(), n, "conversations hashed to {}", pod(&b1));
    for (i, c) in others.iter().enumerate() {
        assert_eq!(host.metric("ai_lb.prefix.generation_bumps"), 0, "{i}");
        let t2 = turn(&mut host, &mut e, &[c, "2"], 0);
        assert!(t2.ends_with("prefix_hit"), "{t2}");
    }
    assert_eq!(host.metric("ai_lb.prefix.generation_bumps"), 1);
    // b's entry was written at the old generation: no longer a hit.
    let b3 = turn(&mut host, &mut e, &["b", "b2", "b3"], 0);
    assert!(b3.ends_with("prefix_miss"), "{b3}");
    // The bumping conversation's prompt was re-recorded at the new generation: still a hit.
    let last = &others[n - 1];
    let t3 = turn(&mut host, &mut e, &[last, "2", "3"], 800);
    assert!(t3.ends_with("prefix_hit"), "{t3}");
    assert_eq!(host.metric("ai_lb.prefix.generation_bumps"), 1);
}

#[test]
fn only_chat_and_completions_streams_are_asked_for_usage() {
    let long = "x".repeat(300);
    for (body, asked) in [
        (json!({"model": "m", "stream": true, "prompt": long}), true),
        (json!({"model": "m", "stream": true, "input": long}), false),
        (
            json!({"model": "m", "stream": true, "max_tokens": 5, "system": "s",
                "messages": [{"role": "user", "content": long}]}),
            false,
        ),
    ] {
        let (mut host, mut e) = redis_route(json!({}));
        let t = send(&mut host, &mut e, 2, body.to_string().as_bytes());
        picked(&mut host, &mut e, t, "10.0.0.2:80", 1);
        assert_eq!(host.body_writes, u32::from(asked), "{body}");
    }
}

/// The usage request goes with the choice: a request that falls back (Redis answers garbage)
/// reaches the cluster as the client sent it, since no holding would take the event out.
#[test]
fn a_request_that_falls_back_is_not_asked_for_usage() {
    let (mut host, mut e) = redis_route(json!({}));
    let body = chat(Some(true), None, &["q"]);
    let t = send(&mut host, &mut e, 2, &body);
    deliver(&mut host, &mut e, t, b"-ERR boom\r\n");
    assert_eq!(host.metric("ai_lb.fallback.redis_error"), 1);
    assert_eq!(host.body_writes, 0);
    assert_eq!(host.body, body);
}

/// A pod restart in the metrics Higress keeps in the host list (prefix_cache/restarts.rs): its
/// changed `process_start_time_seconds`, read at most once a second, bumps its generation
/// before the pick, whatever the engines answer.
#[test]
fn a_restart_in_the_host_lists_metrics_bumps_the_pods_generation() {
    let (mut host, mut e) = redis_route(json!({}));
    let list = |start: &str| {
        let page = format!(
            "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {start}\n"
        );
        let info = |m: &str| json!({"health_status": "Healthy", "metrics": m}).to_string();
        let (a, b) = (info(&page), info(""));
        crate::host::pairs::encode(&[("10.0.0.1:80", a.as_str()), ("10.0.0.2:80", b.as_str())])
    };
    let forgets = |host: &MockHost| {
        (0..host.redis_calls.len())
            .filter(|&i| host.query_args(i)[0] == "EVAL")
            .map(|i| host.query_args(i))
            .collect::<Vec<_>>()
    };
    host.hosts = list("1764200000");
    let body = chat(None, None, &["q"]);
    send(&mut host, &mut e, 2, &body);
    host.hosts = list("1764200500");
    send(&mut host, &mut e, 3, &body);
    assert!(
        forgets(&host).is_empty(),
        "first sight, then read again within a second"
    );
    host.now_ms += 1_000;
    send(&mut host, &mut e, 4, &body);
    let bumps = forgets(&host);
    assert_eq!(
        bumps.len(),
        1,
        "the changed start time, read a second later"
    );
    assert!(bumps[0][1].contains("HINCRBY"));
    assert_eq!(
        bumps[0][2], "1",
        "the generations hash alone: no chain to re-write"
    );
    assert_eq!(bumps[0][4], "10.0.0.1:80");
    assert_eq!(host.metric("ai_lb.prefix.generation_bumps"), 1);
    host.now_ms += 1_000;
    send(&mut host, &mut e, 5, &body);
    assert_eq!(forgets(&host).len(), 1, "unchanged since");
}

/// Anthropic Messages answers are verified (issue 47: every one counted `verify_no_usage`): a
/// JSON answer's `usage`, and a stream's `message_start` usage, long out of its tail by its end.
#[test]
fn anthropic_messages_answers_are_verified() {
    let body = json!({"model": "m", "max_tokens": 5, "system": "s".repeat(800),
        "messages": [{"role": "user", "content": "q".repeat(300)}]});
    let (mut host, mut e) = redis_route(json!({}));
    let t = send(&mut host, &mut e, 2, body.to_string().as_bytes());
    picked(&mut host, &mut e, t, "10.0.0.2:80", 1);
    let full = r#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":20,"cache_creation_input_tokens":0,"cache_read_input_tokens":256,"output_tokens":5}}"#;
    respond(&mut host, &mut e, 2, "200", &[full]);
    assert_eq!(host.metric("ai_lb.prefix.verified"), 1);
    assert_eq!(host.metric("ai_lb.prefix.cached_tokens"), 256);
    assert_eq!(host.metric("ai_lb.prefix.prompt_tokens"), 276);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let t = send(&mut host, &mut e, 3, streamed.to_string().as_bytes());
    assert_eq!(host.body_writes, 0, "its stream reports usage unasked");
    picked(&mut host, &mut e, t, "10.0.0.2:80", 1);
    let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_2\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":20,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":256,\"output_tokens\":1}}}\n\n";
    let delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"more\"}}\n\n";
    let end = "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":100}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let mut chunks = vec![start];
    chunks.extend(std::iter::repeat_n(delta, 100));
    chunks.push(end);
    let client = respond_with(&mut host, &mut e, 3, SSE, &chunks);
    assert_eq!(client, chunks.concat(), "passed as it is");
    assert_eq!(host.metric("ai_lb.prefix.verified"), 2);
    assert_eq!(host.metric("ai_lb.prefix.cached_tokens"), 512);
    assert_eq!(host.metric("ai_lb.prefix.verify_no_usage"), 0);
}
