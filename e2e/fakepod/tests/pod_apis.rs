//! The Responses and Anthropic Messages APIs on a fake pod, in the request shapes the official
//! `openai` and `anthropic` clients send: answers, streams and usage as those clients read them,
//! cached prompt tokens included.

mod common;

use common::*;
use serde_json::{json, Value};

/// The named events of an SSE stream, as (event, data) pairs.
fn events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut name = String::new();
            let mut data = Value::Null;
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).unwrap();
                }
            }
            assert_eq!(
                data["type"],
                name.as_str(),
                "event name repeats its type: {e}"
            );
            (name, data)
        })
        .collect()
}

fn responses_body(system: &str, stream: bool) -> String {
    // openai-python `client.responses.create(model=..., instructions=..., input=[...])`.
    json!({
        "model": "fake-model", "instructions": system, "max_output_tokens": 3,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hello"}]}],
        "stream": stream,
    })
    .to_string()
}

fn messages_body(system: &str, stream: bool) -> String {
    // anthropic-python `client.messages.create(model=..., system=..., messages=[...])`.
    json!({
        "model": "fake-model", "max_tokens": 3, "system": system,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        "stream": stream,
    })
    .to_string()
}

#[tokio::test]
async fn responses_api_answers_and_streams_with_cached_tokens() {
    let p = pod("pod-r", |_| {}).await;
    let c = client();
    let url = format!("{}/v1/responses", p.url());
    let system = "abcd".repeat(400);
    let cold = send(&c, "POST", &url, &responses_body(&system, false), &[])
        .await
        .unwrap();
    assert_eq!(cold.status, 200);
    let v: Value = serde_json::from_str(&cold.text()).unwrap();
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    let text = v["output"][0]["content"][0]["text"].as_str().unwrap();
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
    assert!(!text.is_empty());
    assert_eq!(v["usage"]["output_tokens"], 3);
    assert_eq!(v["usage"]["input_tokens_details"]["cached_tokens"], 0);

    let warm = send(&c, "POST", &url, &responses_body(&system, true), &[])
        .await
        .unwrap();
    assert_eq!(warm.status, 200);
    let ev = events(&warm.text());
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"response.created"));
    assert_eq!(names.last(), Some(&"response.completed"));
    let deltas: String = ev
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, text, "the same prompt gets the same answer");
    let seqs: Vec<u64> = ev
        .iter()
        .map(|(_, d)| d["sequence_number"].as_u64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    let done = &ev.last().unwrap().1["response"];
    assert_eq!(done["output"][0]["content"][0]["text"], text);
    let cached = done["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= 384,
        "the system prompt's blocks were cached: {cached}"
    );
    assert!(!warm.text().contains("[DONE]"));
}

#[tokio::test]
async fn messages_api_answers_and_streams_with_cache_reads() {
    let p = pod("pod-m", |_| {}).await;
    let c = client();
    let url = format!("{}/v1/messages", p.url());
    let system = "abcd".repeat(400);
    let headers = [("anthropic-version", "2023-06-01"), ("x-api-key", "k")];
    let cold = send(&c, "POST", &url, &messages_body(&system, false), &headers)
        .await
        .unwrap();
    assert_eq!(cold.status, 200);
    let v: Value = serde_json::from_str(&cold.text()).unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["stop_reason"], "max_tokens");
    let text = v["content"][0]["text"].as_str().unwrap();
    assert_eq!(v["usage"]["output_tokens"], 3);
    assert_eq!(v["usage"]["cache_read_input_tokens"], 0);
    let prompt = v["usage"]["input_tokens"].as_u64().unwrap();

    let warm = send(&c, "POST", &url, &messages_body(&system, true), &headers)
        .await
        .unwrap();
    let ev = events(&warm.text());
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let deltas: String = ev
        .iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(deltas, text);
    let start = &ev[0].1["message"]["usage"];
    let read = start["cache_read_input_tokens"].as_u64().unwrap();
    assert!(read >= 384, "cache reads {read}");
    // Anthropic counts the uncached prompt tokens as input: the two add up to the prompt.
    assert_eq!(start["input_tokens"].as_u64().unwrap() + read, prompt);
    assert_eq!(ev[6].1["usage"]["output_tokens"], 3);
}

/// A continuation (`previous_response_id`) is answered over the stored history, whose KV its
/// pod holds; another pod does not know the response (vLLM keeps responses per server) unless
/// the pods share a store, and then prefills the whole history, uncached.
#[tokio::test]
async fn responses_continue_over_their_stored_history() {
    let shared = ailb_fakepod::ResponseStore::new();
    let own = pod("pod-own", |_| {}).await;
    let (a, b) = (
        pod("pod-sa", |c| c.responses = shared.clone()).await,
        pod("pod-sb", |c| c.responses = shared.clone()).await,
    );
    let c = client();
    let turn = |input: &str, previous: Option<&str>, stream: bool| {
        let mut body = json!({"model": "fake-model", "max_output_tokens": 3,
            "input": input.repeat(100), "stream": stream});
        if let Some(p) = previous {
            body["previous_response_id"] = json!(p);
        }
        body.to_string()
    };
    let post = |p: &ailb_fakepod::PodHandle| format!("{}/v1/responses", p.url());
    let first = send(&c, "POST", &post(&own), &turn("abcd", None, false), &[])
        .await
        .unwrap();
    let v: Value = serde_json::from_str(&first.text()).unwrap();
    let id = v["id"].as_str().unwrap().to_string();
    let next = send(
        &c,
        "POST",
        &post(&own),
        &turn("efgh", Some(&id), false),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(next.status, 200);
    let v: Value = serde_json::from_str(&next.text()).unwrap();
    let cached = v["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached >= 96, "the history's blocks were cached: {cached}");
    assert!(
        v["usage"]["input_tokens"].as_u64().unwrap() > 200,
        "over the history"
    );
    // The streamed continuation names itself in its first event, and is stored too.
    let streamed = send(&c, "POST", &post(&own), &turn("ijkl", Some(&id), true), &[])
        .await
        .unwrap();
    let ev = events(&streamed.text());
    let sid = ev[0].1["response"]["id"].as_str().unwrap().to_string();
    assert_eq!(ev[0].0, "response.created");
    let again = send(
        &c,
        "POST",
        &post(&own),
        &turn("mnop", Some(&sid), false),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(again.status, 200);
    // Unknown here, or unstored: 404, as vLLM answers it.
    for unknown in ["resp-nope", &id] {
        let r = send(&c, "POST", &post(&a), &turn("x", Some(unknown), false), &[])
            .await
            .unwrap();
        assert_eq!(r.status, 404, "{unknown}");
    }
    let unstored = json!({"model": "fake-model", "input": "q", "store": false}).to_string();
    let r = send(&c, "POST", &post(&own), &unstored, &[]).await.unwrap();
    let uid = serde_json::from_str::<Value>(&r.text()).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = send(&c, "POST", &post(&own), &turn("x", Some(&uid), false), &[])
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    // A shared store: any pod answers, but only the producer has the history cached.
    let first = send(&c, "POST", &post(&a), &turn("qrst", None, false), &[])
        .await
        .unwrap();
    let id = serde_json::from_str::<Value>(&first.text()).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut cached = Vec::new();
    for p in [&a, &b] {
        let r = send(&c, "POST", &post(p), &turn("uvwx", Some(&id), false), &[])
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        let v: Value = serde_json::from_str(&r.text()).unwrap();
        cached.push(
            v["usage"]["input_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        );
    }
    assert!(cached[0] >= 96 && cached[1] == 0, "{cached:?}");
}
