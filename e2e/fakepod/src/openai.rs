//! Request parsing and response shapes: OpenAI Chat and legacy Completions here, the
//! Responses API in `responses_api.rs`, Anthropic Messages in `messages_api.rs`.

use crate::tokenize::{canonical_prompt, ApiKind};
use crate::wire::Ident;
pub use crate::wire::{named_sse, sse, Usage};
use ailb_core::hash::{fnv1a, FNV_OFFSET};
use serde_json::{json, Value};

/// The parts of a generation request the fake engine uses.
#[derive(Debug, Clone)]
pub struct GenRequest {
    pub kind: ApiKind,
    /// `model` from the body (echoed back; may name a LoRA adapter).
    pub model: Option<String>,
    pub stream: bool,
    /// `stream_options.include_usage`: send a final usage chunk (Chat and Completions; the
    /// Responses and Messages streams always end with their usage).
    pub include_usage: bool,
    /// Requested output tokens, before the pod's cap.
    pub max_tokens: Option<u64>,
    pub prompt: String,
    /// Responses: the stored response this one continues (its history comes first).
    pub previous_response_id: Option<String>,
    /// Responses: the answer is stored for a later `previous_response_id` (`store`, default on).
    pub store: bool,
}

/// Parses a body; `Err` carries the message for a 400.
pub fn parse_request(kind: ApiKind, bytes: &[u8]) -> Result<GenRequest, String> {
    let body: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("invalid JSON body: {e}"))?;
    if !body.is_object() {
        return Err("request body must be a JSON object".into());
    }
    let prompt = canonical_prompt(kind, &body)?;
    let max_tokens = ["max_completion_tokens", "max_tokens", "max_output_tokens"]
        .iter()
        .find_map(|k| body.get(*k).and_then(Value::as_u64));
    Ok(GenRequest {
        kind,
        model: body.get("model").and_then(Value::as_str).map(String::from),
        stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
        include_usage: body
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        max_tokens,
        prompt,
        previous_response_id: (kind == ApiKind::Responses)
            .then(|| body.get("previous_response_id").and_then(Value::as_str))
            .flatten()
            .map(String::from),
        store: kind == ApiKind::Responses
            && body.get("store").and_then(Value::as_bool).unwrap_or(true),
    })
}

/// OpenAI-style error body.
pub fn error_body(status: u16, message: &str) -> String {
    let kind = match status {
        400 | 422 => "invalid_request_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        _ => "server_error",
    };
    json!({"error": {"message": message, "type": kind, "param": null, "code": status}}).to_string()
}

// Four-byte pieces, so generated text re-tokenizes to about one token per piece.
const WORDS: [&str; 16] = [
    " the", " cat", " sat", " on", " a", " mat", " and", " dog", " ran", " far", " to", " see",
    " sky", " sun", " big", " red",
];

/// Text of output token `i` (deterministic in the prompt, independent of the pod).
pub fn token_text(seed: u64, i: u64) -> &'static str {
    let h = seed
        .wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .rotate_left(17);
    WORDS[(h % WORDS.len() as u64) as usize]
}

/// The whole answer a pod gives to `prompt` (canonical prompt text) with `out_tokens` tokens:
/// deterministic, so a client can put the real answer in a conversation's history (as
/// GenAI-Perf does) while every setup still sees the same request sequence.
pub fn answer_text(prompt: &str, out_tokens: u64) -> String {
    let seed = fnv1a(FNV_OFFSET, prompt.as_bytes());
    (0..out_tokens).map(|i| token_text(seed, i)).collect()
}

/// The text whose KV a pod holds after answering: the prompt, then (chat) the assistant turn
/// as the next request renders it, so that request's prefix runs through the answer.
pub fn after_answer(kind: ApiKind, prompt: &str, answer: &str) -> String {
    match kind {
        ApiKind::Completions => format!("{prompt}{answer}"),
        ApiKind::Chat | ApiKind::Responses | ApiKind::Messages => {
            format!("{prompt}assistant\n{answer}\n")
        }
    }
}

/// Identity fields shared by every chunk of one response.
#[derive(Debug, Clone)]
pub struct RespMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub kind: ApiKind,
}

impl RespMeta {
    fn ident(&self) -> Ident<'_> {
        Ident {
            id: &self.id,
            created: self.created,
            model: &self.model,
        }
    }

    /// Events a stream sends before its first token (none for Chat and Completions).
    pub fn open(&self, usage: Usage) -> String {
        match self.kind {
            ApiKind::Chat | ApiKind::Completions => String::new(),
            ApiKind::Responses => crate::responses_api::open(self.ident()),
            ApiKind::Messages => crate::messages_api::open(self.ident(), usage),
        }
    }

    /// Streamed token `i` as one SSE event; `finish` on the last one.
    pub fn chunk(&self, text: &str, i: u64, finish: Option<&str>) -> String {
        let choice = match self.kind {
            ApiKind::Chat => {
                let delta = if i == 0 {
                    json!({"role": "assistant", "content": text})
                } else {
                    json!({"content": text})
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
            ApiKind::Completions => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
            }
            ApiKind::Responses => return crate::responses_api::delta(self.ident(), text, i),
            ApiKind::Messages => return crate::messages_api::delta(text),
        };
        sse(json!({
            "id": self.id, "object": self.chunk_object(), "created": self.created,
            "model": self.model, "choices": [choice],
        }))
    }

    /// Events after the last token: Chat and Completions send the usage-only chunk when
    /// `include_usage` asked for it, then `[DONE]`; Responses and Messages close their stream
    /// with the whole answer's usage.
    pub fn close(&self, text: &str, usage: Usage, include_usage: bool) -> String {
        match self.kind {
            ApiKind::Chat | ApiKind::Completions => {
                let mut out = String::new();
                if include_usage {
                    out.push_str(&sse(json!({
                        "id": self.id, "object": self.chunk_object(), "created": self.created,
                        "model": self.model, "choices": [], "usage": usage.json(),
                    })));
                }
                out.push_str(DONE);
                out
            }
            ApiKind::Responses => crate::responses_api::close(self.ident(), text, usage),
            ApiKind::Messages => crate::messages_api::close(usage),
        }
    }

    fn chunk_object(&self) -> &'static str {
        match self.kind {
            ApiKind::Completions => "text_completion",
            _ => "chat.completion.chunk",
        }
    }

    /// Complete non-streaming response.
    pub fn full(&self, text: &str, usage: Usage) -> String {
        let (object, choice) = match self.kind {
            ApiKind::Chat => (
                "chat.completion",
                json!({"index": 0, "message": {"role": "assistant", "content": text},
                       "logprobs": null, "finish_reason": "length"}),
            ),
            ApiKind::Completions => (
                "text_completion",
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length"}),
            ),
            ApiKind::Responses => {
                return crate::responses_api::full(self.ident(), text, usage).to_string()
            }
            ApiKind::Messages => {
                return crate::messages_api::full(self.ident(), text, usage).to_string()
            }
        };
        json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": [choice], "usage": usage.json(),
        })
        .to_string()
    }
}

/// The stream terminator.
pub const DONE: &str = "data: [DONE]\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_chat_and_limits() {
        let r = parse_request(
            ApiKind::Chat,
            br#"{"model":"m","stream":true,"max_completion_tokens":5,"max_tokens":9,
                "stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#,
        )
        .unwrap();
        assert!(r.stream && r.include_usage);
        assert_eq!(r.max_tokens, Some(5));
        assert_eq!(r.prompt, "user\nhi\n");
        assert!(parse_request(ApiKind::Chat, b"{not json").is_err());
        assert!(parse_request(ApiKind::Completions, b"[1]").is_err());
        let e: Value = serde_json::from_str(&error_body(400, "bad")).unwrap();
        assert_eq!(e["error"]["type"], "invalid_request_error");
    }
}
