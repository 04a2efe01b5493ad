//! OpenAI Responses API shapes (`POST /v1/responses`): the response object and its stream of
//! named events, as the official clients read them. Usage reports the cached prompt tokens in
//! `input_tokens_details.cached_tokens`.

use crate::wire::{named_sse, Ident, Usage};
use serde_json::{json, Value};

/// Events before the first delta take sequence numbers 0..OPENING.
const OPENING: u64 = 3;

fn usage_json(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt,
        "input_tokens_details": {"cached_tokens": u.cached},
        "output_tokens": u.completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt + u.completion,
    })
}

fn item_id(meta: Ident<'_>) -> String {
    format!("msg_{}", meta.id)
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

fn message_item(meta: Ident<'_>, text: Option<&str>) -> Value {
    let (status, content) = match text {
        Some(t) => ("completed", json!([text_part(t)])),
        None => ("in_progress", json!([])),
    };
    json!({
        "id": item_id(meta), "type": "message", "status": status, "role": "assistant",
        "content": content,
    })
}

/// The response object; `done` carries the answer and its usage.
fn response(meta: Ident<'_>, done: Option<(&str, Usage)>) -> Value {
    let (status, output, usage) = match done {
        Some((text, u)) => (
            "completed",
            json!([message_item(meta, Some(text))]),
            usage_json(u),
        ),
        None => ("in_progress", json!([]), Value::Null),
    };
    json!({
        "id": meta.id, "object": "response", "created_at": meta.created, "status": status,
        "model": meta.model, "output": output, "usage": usage, "error": null,
        "incomplete_details": null, "instructions": null, "metadata": {},
        "parallel_tool_calls": true, "temperature": 1.0, "tool_choice": "auto", "tools": [],
        "top_p": 1.0,
    })
}

/// The non-streamed answer.
pub fn full(meta: Ident<'_>, text: &str, usage: Usage) -> Value {
    response(meta, Some((text, usage)))
}

/// `response.created`, the message item and its text part, before the first delta.
pub fn open(meta: Ident<'_>) -> String {
    let events = [
        json!({"type": "response.created", "sequence_number": 0, "response": response(meta, None)}),
        json!({"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
               "item": message_item(meta, None)}),
        json!({"type": "response.content_part.added", "sequence_number": 2,
               "item_id": item_id(meta), "output_index": 0, "content_index": 0,
               "part": text_part("")}),
    ];
    events.into_iter().map(named_sse).collect()
}

/// Token `i` of the answer.
pub fn delta(meta: Ident<'_>, text: &str, i: u64) -> String {
    named_sse(json!({
        "type": "response.output_text.delta", "sequence_number": OPENING + i,
        "item_id": item_id(meta), "output_index": 0, "content_index": 0, "delta": text,
        "logprobs": [],
    }))
}

/// The done events and `response.completed` with the usage.
pub fn close(meta: Ident<'_>, text: &str, usage: Usage) -> String {
    let seq = OPENING + usage.completion;
    let id = item_id(meta);
    let events = [
        json!({"type": "response.output_text.done", "sequence_number": seq, "item_id": id,
               "output_index": 0, "content_index": 0, "text": text, "logprobs": []}),
        json!({"type": "response.content_part.done", "sequence_number": seq + 1,
               "item_id": id, "output_index": 0, "content_index": 0, "part": text_part(text)}),
        json!({"type": "response.output_item.done", "sequence_number": seq + 2,
               "output_index": 0, "item": message_item(meta, Some(text))}),
        json!({"type": "response.completed", "sequence_number": seq + 3,
               "response": response(meta, Some((text, usage)))}),
    ];
    events.into_iter().map(named_sse).collect()
}
