//! What every API's answer is made of: the response's identity, token usage and SSE events.
//! A leaf: `openai.rs` and the Responses / Messages modules all build on it.

use serde_json::{json, Value};

/// The identity fields every event of one response repeats.
#[derive(Debug, Clone, Copy)]
pub struct Ident<'a> {
    pub id: &'a str,
    pub created: u64,
    pub model: &'a str,
}

/// Token usage of a finished request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub prompt: u64,
    pub completion: u64,
    pub cached: u64,
    /// Time from the pod having the whole request to its first token leaving, and the part of
    /// it spent waiting for admission, in microseconds: not an OpenAI field (`fake_ttft_us`,
    /// `fake_queue_us` beside the others), so a time-compressed bench can read TTFT at the pod,
    /// without the client-side costs that compression would inflate (docs/trace-bench.md).
    pub timing: Option<(u64, u64)>,
}

impl Usage {
    /// OpenAI Chat / Completions `usage`.
    pub fn json(&self) -> Value {
        let mut v = json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        });
        if let (Some((ttft, queue)), Some(o)) = (self.timing, v.as_object_mut()) {
            o.insert("fake_ttft_us".into(), ttft.into());
            o.insert("fake_queue_us".into(), queue.into());
        }
        v
    }
}

/// One SSE event without a name (`data: {...}\n\n`).
pub fn sse(v: Value) -> String {
    format!("data: {v}\n\n")
}

/// One named SSE event (`event: <type>\ndata: {...}\n\n`), as the Responses and Messages
/// APIs send them: the name repeats the payload's `type`.
pub fn named_sse(v: Value) -> String {
    let name = v.get("type").and_then(Value::as_str).unwrap_or("message");
    format!("event: {name}\ndata: {v}\n\n")
}
