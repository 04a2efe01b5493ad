//! The OpenAI Responses API and the Anthropic Messages API through the gateway, in the request
//! shapes the official `openai` and `anthropic` clients send (paths, headers, bodies), streamed
//! and not: prefix_cache keeps each conversation on the pod that holds its prefix, and the pod's
//! usage shows the cached tokens the client would see.

use ailb_e2e::bed::{wait_for_zero, Bed};
use ailb_e2e::gateway::{http, Gateway};
use serde_json::{json, Value};
use std::time::Duration;

const DEBUG: &str = "x-ai-lb-debug";

fn gateway(bed: &Bed) -> Gateway {
    let cfg = json!({"lb_policy": "prefix_cache", "lb_config": {
        "serviceFQDN": "redis.static", "servicePort": bed.redis.port, "timeout": 1000,
        "debugHeader": DEBUG}});
    bed.gateway(&bed.spec("apis", Some(cfg)))
}

/// One call: (pod, debug header, body).
fn call(
    gw: &Gateway,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (String, String, String) {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let (status, got, bytes) =
        http(&gw.url, "POST", path, &all, body.to_string().as_bytes()).unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    assert_eq!(status, 200, "{path}: {text}");
    let header = |name: &str| {
        got.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    (header("x-pod"), header(DEBUG), text)
}

/// The data of the stream's event named `name`.
fn event(stream: &str, name: &str) -> Value {
    let block = stream
        .split("\n\n")
        .find(|e| e.starts_with(&format!("event: {name}\n")))
        .unwrap_or_else(|| panic!("no {name} event in {stream}"));
    let data = block
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap();
    serde_json::from_str(data).unwrap()
}

fn system_prompt(n: usize) -> String {
    format!(
        "You are agent {n}. {}",
        "Follow the house rules. ".repeat(30)
    )
}

#[test]
fn responses_api_turns_stay_on_their_pod_and_report_cached_tokens() {
    let bed = Bed::new(4, |c| c.decode_us_per_token = 1_000);
    let gw = gateway(&bed);
    let headers = [("authorization", "Bearer k")];
    for conv in 0..3 {
        let instructions = system_prompt(conv);
        // openai-python: client.responses.create(model, instructions, input=str, max_output_tokens)
        let first = json!({"model": "fake-model", "instructions": instructions,
                           "input": "first question", "max_output_tokens": 2});
        let (home, debug, text) = call(&gw, "/v1/responses", &headers, &first);
        assert!(
            debug.starts_with("endpoint="),
            "the plugin routed it: {debug}"
        );
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["object"], "response");
        let answer = v["output"][0]["content"][0]["text"].as_str().unwrap();
        // The next turn, streamed, carries the history as input items.
        let next = json!({"model": "fake-model", "instructions": instructions, "stream": true,
            "max_output_tokens": 2, "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "first question"}]},
                {"role": "assistant", "content": [{"type": "output_text", "text": answer}]},
                {"role": "user", "content": [{"type": "input_text", "text": "second question"}]}]});
        let (pod, debug, stream) = call(&gw, "/v1/responses", &headers, &next);
        assert_eq!(pod, home, "conversation {conv} moved ({debug})");
        assert!(debug.contains("reason=prefix_hit"), "{debug}");
        let done = event(&stream, "response.completed");
        let cached = done["response"]["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(
            cached > 100,
            "the pod reused the first turn's prefix: {cached}"
        );
    }
    assert!(wait_for_zero(&bed, Duration::from_secs(5)).is_zero());
}

#[test]
fn messages_api_turns_stay_on_their_pod_and_report_cache_reads() {
    let bed = Bed::new(4, |c| c.decode_us_per_token = 1_000);
    let gw = gateway(&bed);
    let headers = [("x-api-key", "k"), ("anthropic-version", "2023-06-01")];
    for conv in 0..3 {
        let system = system_prompt(conv);
        // anthropic-python: client.messages.create(model, max_tokens, system, messages)
        let first = json!({"model": "fake-model", "max_tokens": 2, "system": system,
            "messages": [{"role": "user", "content": "first question"}]});
        let (home, debug, text) = call(&gw, "/v1/messages", &headers, &first);
        assert!(
            debug.starts_with("endpoint="),
            "the plugin routed it: {debug}"
        );
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["type"], "message");
        let answer = v["content"][0]["text"].as_str().unwrap();
        let next = json!({"model": "fake-model", "max_tokens": 2, "stream": true,
            "system": [{"type": "text", "text": system}],
            "messages": [
                {"role": "user", "content": "first question"},
                {"role": "assistant", "content": [{"type": "text", "text": answer}]},
                {"role": "user", "content": [{"type": "text", "text": "second question"}]}]});
        let (pod, debug, stream) = call(&gw, "/v1/messages", &headers, &next);
        assert_eq!(pod, home, "conversation {conv} moved ({debug})");
        assert!(debug.contains("reason=prefix_hit"), "{debug}");
        let start = event(&stream, "message_start");
        let read = start["message"]["usage"]["cache_read_input_tokens"]
            .as_u64()
            .unwrap();
        assert!(read > 100, "the pod reused the first turn's prefix: {read}");
        assert_eq!(event(&stream, "message_delta")["usage"]["output_tokens"], 2);
    }
    assert!(wait_for_zero(&bed, Duration::from_secs(5)).is_zero());
}
