//! Request body → canonical prefix blocks.
//!
//! # Shape detection (first match wins)
//! 1. `messages` present → OpenAI Chat Completions, or Anthropic Messages when a top-level
//!    `system` exists or any content block is Anthropic-only (`tool_use`, `tool_result`,
//!    `thinking`, `redacted_thinking`, `document`, `image` with `source`). Both dialects go
//!    through the same message mapping, so the label is informational only.
//! 2. `input` or `instructions` present → OpenAI Responses.
//! 3. `prompt` present → OpenAI Completions.
//! 4. otherwise [`CanonError::NoPrompt`].
//!
//! # Block order
//! `tools` (one block, if non-empty) → `system` (Anthropic) / `instructions` (Responses, as a
//! `system` message) → one block per message / input item / prompt. A block longer than
//! `chunk_bytes` is cut into fixed-size pieces, each its own block.
//!
//! # Block encoding
//! A block is `kind ‖ piece`, where `kind` is `T` (tools), `M` (message or input item),
//! `P` (completion prompt) for the first piece of an item and `+` for each continuation
//! piece. The pieces of an item concatenate to its *stream*, a sequence of fields
//! `tag ‖ esc(value) ‖ 00 00`, where `esc` doubles nothing but turns each `00` byte into
//! `00 FF`, so fields are self-delimiting and a stream of a longer text starts with the
//! stream of any text it extends (hence shared chunks for a shared long document).
//!
//! Field tags, in the order they are written for a message:
//! `r` role, `n` name, `i` tool_call_id / call_id, then for each content part `t` text or
//! `j` other part as canonical JSON (top-level `cache_control` dropped), Anthropic `tool_use`
//! as `c` name + `a` input, Anthropic `tool_result` as `R` tool_use_id [`e` if is_error]
//! ‖ its content parts ‖ `E`; then per tool call `c` function name + `a` arguments (the
//! arguments string re-encoded as canonical JSON when it parses, else verbatim), or `u`
//! canonical JSON of a non-function tool call without its `id`. Tools block: one `j` per
//! tool definition. Completion prompts: `t` text, or `k` token ids as u32 LE.
//! Tool call ids (`tool_calls[].id`, Anthropic `tool_use.id`, Responses `function_call.call_id`)
//! are not hashed; result-side ids (`tool_call_id`, `tool_use_id`, output `call_id`) are.

pub use super::block::CanonConfig;
use super::block::{
    escape_into, user_text, Out, StreamOptions, FIELD_END, KIND_MESSAGE, KIND_PROMPT,
};
use super::error::{wrong, CanonError};
use super::json::{KeySeed, List, ListSeed, J};
use super::message::{content, message, response_item, tools_block};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// Which API the body looked like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    ChatCompletions,
    Completions,
    Responses,
    AnthropicMessages,
}

/// The canonical blocks of one request, stored back to back in one buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canonical {
    /// `model` field ("" when absent); salts the key chain.
    pub model: String,
    pub api: Api,
    /// True when blocks past `max_blocks` were dropped.
    pub capped: bool,
    /// `"stream": true`: the first response bytes come at the first token, so they time the
    /// prefill (docs/redis-data-model.md §13).
    pub stream: bool,
    /// Its `stream_options`, so asking for usage needs no second parse (verify/inject.rs).
    pub stream_options: StreamOptions,
    buf: Vec<u8>,
    ends: Vec<usize>,
}

impl Canonical {
    /// The blocks in order.
    pub fn blocks(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.ends.iter().scan(0usize, |start, &end| {
            let block = self.buf.get(*start..end);
            *start = end;
            block
        })
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The prompt's size up to each block: `[0]` is 0, `[n]` the bytes of its first `n`
    /// blocks (the engine-verified index predicts tokens from it, core/src/verify/mod.rs; the
    /// token gate estimates them from it, prefix/tokens.rs).
    pub fn prefix_bytes(&self) -> Vec<u64> {
        std::iter::once(0)
            .chain(self.ends.iter().map(|&e| e as u64))
            .collect()
    }

    /// Chain keys of these blocks, salted with [`Canonical::model`].
    pub fn chain_keys(&self) -> Vec<super::chain::PrefixKey> {
        super::chain::chain_keys(&self.model, self.blocks())
    }
}

/// Canonicalises an LLM request body into prefix blocks (see the module docs).
pub fn canonicalize(body: &[u8], cfg: &CanonConfig) -> Result<Canonical, CanonError> {
    if cfg.max_body_bytes != 0 && body.len() > cfg.max_body_bytes {
        return Err(CanonError::TooLarge {
            len: body.len(),
            max: cfg.max_body_bytes,
        });
    }
    let not_json = |e: serde_json::Error| CanonError::NotJson(e.to_string());
    let mut de = serde_json::Deserializer::from_slice(body);
    // Every message yields at least one block, so more than `max_blocks` are never needed.
    let top = TopSeed {
        limit: cfg.max_blocks,
    }
    .deserialize(&mut de)
    .map_err(not_json)?;
    de.end().map_err(not_json)?;
    if let Some(found) = top.not_object {
        return Err(CanonError::NotObject { found });
    }
    let model = match &top.model {
        None | Some(J::Null) => String::new(),
        Some(J::Str(s)) => s.as_ref().to_owned(),
        Some(other) => return Err(wrong("model", "a string", other)),
    };
    let mut out = Out::new(cfg);
    let api = if let Some(messages) = &top.messages {
        chat_or_anthropic(&mut out, &top, messages)?
    } else if top.input.is_some() || top.instructions.is_some() {
        responses(&mut out, &top)?
    } else if let Some(prompt) = &top.prompt {
        completions(&mut out, prompt)?;
        Api::Completions
    } else {
        return Err(CanonError::NoPrompt);
    };
    Ok(Canonical {
        model,
        api,
        capped: out.capped,
        stream: matches!(top.stream, Some(J::Bool(true))),
        stream_options: StreamOptions::of(top.stream_options.as_ref()),
        buf: out.buf,
        ends: out.ends,
    })
}

fn chat_or_anthropic(out: &mut Out, top: &Top, messages: &List) -> Result<Api, CanonError> {
    let (items, total) = list_items(messages, "messages")?;
    if total == 0 {
        return Err(CanonError::Empty { field: "messages" });
    }
    let mut anthropic = top.system.is_some();
    tools_block(out, top.tools.as_ref())?;
    if let Some(system) = top.system.as_ref().filter(|s| !matches!(s, J::Null)) {
        out.begin(KIND_MESSAGE);
        out.field(b'r', b"system");
        content(out, Some(system), &mut anthropic).map_err(|e| e.within("system"))?;
        out.end_block();
    }
    for (i, m) in items.iter().enumerate() {
        if out.full() {
            out.capped = true;
            break;
        }
        message(out, m, &mut anthropic).map_err(|e| e.within(&format!("messages[{i}]")))?;
    }
    out.capped |= total > items.len();
    Ok(if anthropic {
        Api::AnthropicMessages
    } else {
        Api::ChatCompletions
    })
}

fn responses(out: &mut Out, top: &Top) -> Result<Api, CanonError> {
    let instructions = top.instructions.as_ref().filter(|v| !matches!(v, J::Null));
    let input = top
        .input
        .as_ref()
        .filter(|v| !matches!(v, List::Other("null")));
    if instructions.is_none() && input.is_none() {
        return Err(CanonError::NoPrompt);
    }
    if let Some(List::Arr { total: 0, .. }) = input {
        return Err(CanonError::Empty { field: "input" });
    }
    tools_block(out, top.tools.as_ref())?;
    let mut anthropic = false;
    if let Some(ins) = instructions {
        let J::Str(text) = ins else {
            return Err(wrong("instructions", "a string", ins));
        };
        out.begin(KIND_MESSAGE);
        out.field(b'r', b"system");
        out.field(b't', text.as_bytes());
        out.end_block();
    }
    match input {
        None => {}
        Some(List::Str(text)) => user_text(out, text),
        Some(List::Arr { items, total }) => {
            for (i, item) in items.iter().enumerate() {
                if out.full() {
                    out.capped = true;
                    break;
                }
                response_item(out, item, &mut anthropic)
                    .map_err(|e| e.within(&format!("input[{i}]")))?;
            }
            out.capped |= *total > items.len();
        }
        Some(List::Other(found)) => {
            return Err(CanonError::WrongType {
                path: "input".into(),
                expected: "a string or an array",
                found,
            })
        }
    }
    Ok(Api::Responses)
}

fn completions(out: &mut Out, prompt: &J) -> Result<(), CanonError> {
    let items = match prompt {
        J::Str(text) => {
            prompt_text(out, text);
            return Ok(());
        }
        J::Arr(items) => items,
        other => return Err(wrong("prompt", "a string or an array", other)),
    };
    if items.is_empty() {
        return Err(CanonError::Empty { field: "prompt" });
    }
    if items.iter().all(|t| matches!(t, J::Num(_))) {
        return prompt_tokens(out, items).map_err(|e| e.within("prompt"));
    }
    for (i, item) in items.iter().enumerate() {
        if out.full() {
            out.capped = true;
            break;
        }
        match item {
            J::Str(text) => prompt_text(out, text),
            J::Arr(tokens) => {
                prompt_tokens(out, tokens).map_err(|e| e.within(&format!("prompt[{i}]")))?
            }
            other => {
                return Err(wrong(
                    &format!("prompt[{i}]"),
                    "a string or a token array",
                    other,
                ))
            }
        }
    }
    Ok(())
}

fn prompt_text(out: &mut Out, text: &str) {
    out.begin(KIND_PROMPT);
    out.field(b't', text.as_bytes());
    out.end_block();
}

fn prompt_tokens(out: &mut Out, tokens: &[J]) -> Result<(), CanonError> {
    out.begin(KIND_PROMPT);
    out.scratch.push(b'k');
    for (i, t) in tokens.iter().enumerate() {
        let id = match t {
            J::Num(n) => n.as_u64().and_then(|v| u32::try_from(v).ok()),
            _ => None,
        };
        let Some(id) = id else {
            return Err(wrong(&format!("[{i}]"), "a token id (0..2^32)", t));
        };
        escape_into(&mut out.scratch, &id.to_le_bytes());
    }
    out.scratch.extend_from_slice(&FIELD_END);
    out.end_block();
    Ok(())
}

fn list_items<'l, 'a>(list: &'l List<'a>, field: &str) -> Result<(&'l [J<'a>], usize), CanonError> {
    match list {
        List::Arr { items, total } => Ok((items, *total)),
        List::Str(_) => Err(CanonError::WrongType {
            path: field.to_owned(),
            expected: "an array",
            found: "string",
        }),
        List::Other(found) => Err(CanonError::WrongType {
            path: field.to_owned(),
            expected: "an array",
            found,
        }),
    }
}

/// The top-level fields we use; everything else is skipped unparsed.
#[derive(Default)]
struct Top<'a> {
    model: Option<J<'a>>,
    messages: Option<List<'a>>,
    input: Option<List<'a>>,
    prompt: Option<J<'a>>,
    instructions: Option<J<'a>>,
    system: Option<J<'a>>,
    tools: Option<J<'a>>,
    stream: Option<J<'a>>,
    stream_options: Option<J<'a>>,
    not_object: Option<&'static str>,
}

struct TopSeed {
    limit: usize,
}

impl<'de> DeserializeSeed<'de> for TopSeed {
    type Value = Top<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Top<'de>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TopSeed {
    type Value = Top<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top<'de>, A::Error> {
        let mut top = Top::default();
        let list = || ListSeed { limit: self.limit };
        while let Some(key) = map.next_key_seed(KeySeed)? {
            match key.as_ref() {
                "model" => top.model = Some(map.next_value()?),
                "messages" => top.messages = Some(map.next_value_seed(list())?),
                "input" => top.input = Some(map.next_value_seed(list())?),
                "prompt" => top.prompt = Some(map.next_value()?),
                "instructions" => top.instructions = Some(map.next_value()?),
                "stream" => top.stream = Some(map.next_value()?),
                "stream_options" => top.stream_options = Some(map.next_value()?),
                "system" => top.system = Some(map.next_value()?),
                "tools" => top.tools = Some(map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(top)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Top<'de>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Top {
            not_object: Some("array"),
            ..Top::default()
        })
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Top<'de>, E> {
        Ok(Top {
            not_object: Some("string"),
            ..Top::default()
        })
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Top<'de>, E> {
        Ok(Top {
            not_object: Some("boolean"),
            ..Top::default()
        })
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Top<'de>, E> {
        Ok(Top {
            not_object: Some("number"),
            ..Top::default()
        })
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Top<'de>, E> {
        Ok(Top {
            not_object: Some("number"),
            ..Top::default()
        })
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Top<'de>, E> {
        Ok(Top {
            not_object: Some("number"),
            ..Top::default()
        })
    }
    fn visit_unit<E: de::Error>(self) -> Result<Top<'de>, E> {
        Ok(Top {
            not_object: Some("null"),
            ..Top::default()
        })
    }
}
