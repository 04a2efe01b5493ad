//! Anthropic Messages API shapes (`POST /v1/messages`): the message object and its stream of
//! named events, as the official clients read them. As Anthropic counts them, `input_tokens`
//! are the prompt tokens not read from the cache and `cache_read_input_tokens` the rest.

use crate::wire::{named_sse, Ident, Usage};
use serde_json::{json, Value};

fn usage_json(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt.saturating_sub(u.cached),
        "output_tokens": u.completion,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached,
    })
}

fn message(meta: Ident<'_>, content: Value, stop: Option<&str>, usage: Value) -> Value {
    json!({
        "id": meta.id, "type": "message", "role": "assistant", "model": meta.model,
        "content": content, "stop_reason": stop, "stop_sequence": null, "usage": usage,
    })
}

/// The non-streamed answer (the pod always stops at its token budget).
pub fn full(meta: Ident<'_>, text: &str, usage: Usage) -> Value {
    let content = json!([{"type": "text", "text": text}]);
    message(meta, content, Some("max_tokens"), usage_json(usage))
}

/// `message_start` (with the prompt's usage) and the text block's start.
pub fn open(meta: Ident<'_>, usage: Usage) -> String {
    let start = Usage {
        completion: 0,
        ..usage
    };
    let events = [
        json!({"type": "message_start",
               "message": message(meta, json!([]), None, usage_json(start))}),
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "text", "text": ""}}),
    ];
    events.into_iter().map(named_sse).collect()
}

/// One token of the answer.
pub fn delta(text: &str) -> String {
    named_sse(json!({
        "type": "content_block_delta", "index": 0,
        "delta": {"type": "text_delta", "text": text},
    }))
}

/// The block's end, the stop reason with the output usage, and `message_stop`.
pub fn close(usage: Usage) -> String {
    let events = [
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta",
               "delta": {"stop_reason": "max_tokens", "stop_sequence": null},
               "usage": {"output_tokens": usage.completion}}),
        json!({"type": "message_stop"}),
    ];
    events.into_iter().map(named_sse).collect()
}
