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

use super::json::{write_canonical, List, ListSeed, J};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// Block kind bytes (first byte of every block).
pub const KIND_TOOLS: u8 = b'T';
pub const KIND_MESSAGE: u8 = b'M';
pub const KIND_PROMPT: u8 = b'P';
pub const KIND_CONTINUATION: u8 = b'+';

const FIELD_END: [u8; 2] = [0, 0];
const ESCAPED_ZERO: [u8; 2] = [0, 0xff];
/// Keys never hashed in opaque parts/tools: Anthropic moves its cache breakpoint every turn.
const SKIP_PART_KEYS: &[&str] = &["cache_control"];

/// Canonicalisation limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonConfig {
    /// Cut block streams longer than this into pieces of this many bytes; 0 = never cut.
    pub chunk_bytes: usize,
    /// Keep at most this many blocks (the first ones); more sets [`Canonical::capped`].
    pub max_blocks: usize,
    /// Reject bodies longer than this; 0 = no limit.
    pub max_body_bytes: usize,
}

impl Default for CanonConfig {
    fn default() -> Self {
        Self {
            chunk_bytes: 4096,
            max_blocks: 256,
            max_body_bytes: 8 * 1024 * 1024,
        }
    }
}

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

    /// Chain keys of these blocks, salted with [`Canonical::model`].
    pub fn chain_keys(&self) -> Vec<super::PrefixKey> {
        super::chain_keys(&self.model, self.blocks())
    }
}

/// Why a body could not be canonicalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CanonError {
    TooLarge {
        len: usize,
        max: usize,
    },
    /// Syntax error, invalid UTF-8, nesting over 128, trailing data (serde_json's message).
    NotJson(String),
    NotObject {
        found: &'static str,
    },
    NoPrompt,
    /// `field` is an empty array.
    Empty {
        field: &'static str,
    },
    WrongType {
        path: String,
        expected: &'static str,
        found: &'static str,
    },
    MissingField {
        path: String,
    },
}

impl fmt::Display for CanonError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            CanonError::TooLarge { len, max } => {
                write!(
                    f,
                    "request body of {len} bytes exceeds the limit of {max} bytes"
                )
            }
            CanonError::NotJson(e) => write!(f, "request body is not valid JSON: {e}"),
            CanonError::NotObject { found } => {
                write!(f, "request body must be a JSON object, found {found}")
            }
            CanonError::NoPrompt => f.write_str(
                "request body has no prompt field (messages, input, instructions or prompt)",
            ),
            CanonError::Empty { field } => write!(f, "`{field}` must not be empty"),
            CanonError::WrongType {
                path,
                expected,
                found,
            } => {
                write!(f, "`{path}` must be {expected}, found {found}")
            }
            CanonError::MissingField { path } => write!(f, "`{path}` is missing"),
        }
    }
}

impl std::error::Error for CanonError {}

impl CanonError {
    /// Prefixes the path of a field error with the enclosing location.
    fn within(self, outer: &str) -> Self {
        let join = |path: String| match path.as_bytes().first() {
            None => outer.to_owned(),
            Some(b'[') => format!("{outer}{path}"),
            Some(_) => format!("{outer}.{path}"),
        };
        match self {
            CanonError::WrongType {
                path,
                expected,
                found,
            } => CanonError::WrongType {
                path: join(path),
                expected,
                found,
            },
            CanonError::MissingField { path } => CanonError::MissingField { path: join(path) },
            other => other,
        }
    }
}

fn wrong(path: &str, expected: &'static str, found: &J) -> CanonError {
    CanonError::WrongType {
        path: path.to_owned(),
        expected,
        found: found.kind(),
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

fn response_item(out: &mut Out, item: &J, anthropic: &mut bool) -> Result<(), CanonError> {
    let typ = match item {
        J::Str(text) => {
            user_text(out, text);
            return Ok(());
        }
        J::Obj(_) => item.get("type").and_then(J::as_str),
        other => return Err(wrong("", "an object or a string", other)),
    };
    match typ {
        None | Some("message") => message(out, item, anthropic),
        Some("function_call") => {
            out.begin(KIND_MESSAGE);
            out.field(b'r', b"assistant");
            out.field(b'c', req_str(item, "name")?.as_bytes());
            arguments(out, item.get("arguments"));
            out.end_block();
            Ok(())
        }
        Some("function_call_output") => {
            out.begin(KIND_MESSAGE);
            out.field(b'r', b"tool");
            out.field(b'i', req_str(item, "call_id")?.as_bytes());
            content(out, item.get("output"), anthropic).map_err(|e| e.within("output"))?;
            out.end_block();
            Ok(())
        }
        Some(_) => {
            out.begin(KIND_MESSAGE);
            out.field_json(b'j', item, SKIP_PART_KEYS);
            out.end_block();
            Ok(())
        }
    }
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

fn user_text(out: &mut Out, text: &str) {
    out.begin(KIND_MESSAGE);
    out.field(b'r', b"user");
    out.field(b't', text.as_bytes());
    out.end_block();
}

fn tools_block(out: &mut Out, tools: Option<&J>) -> Result<(), CanonError> {
    let tools = match tools {
        None | Some(J::Null) => return Ok(()),
        Some(J::Arr(tools)) if tools.is_empty() => return Ok(()),
        Some(J::Arr(tools)) => tools,
        Some(other) => return Err(wrong("tools", "an array", other)),
    };
    out.begin(KIND_TOOLS);
    for (i, tool) in tools.iter().enumerate() {
        if !matches!(tool, J::Obj(_)) {
            return Err(wrong(&format!("tools[{i}]"), "an object", tool));
        }
        out.field_json(b'j', tool, SKIP_PART_KEYS);
    }
    out.end_block();
    Ok(())
}

/// One chat / Anthropic message or Responses message item → one block (or its pieces).
fn message(out: &mut Out, m: &J, anthropic: &mut bool) -> Result<(), CanonError> {
    if !matches!(m, J::Obj(_)) {
        return Err(wrong("", "an object", m));
    }
    let role = req_str(m, "role")?;
    out.begin(KIND_MESSAGE);
    out.field(b'r', role.as_bytes());
    for (key, tag) in [("name", b'n'), ("tool_call_id", b'i')] {
        match m.get_present(key) {
            None => {}
            Some(J::Str(s)) => out.field(tag, s.as_bytes()),
            Some(other) => return Err(wrong(key, "a string", other)),
        }
    }
    content(out, m.get("content"), anthropic).map_err(|e| e.within("content"))?;
    match m.get_present("tool_calls") {
        None => {}
        Some(J::Arr(calls)) => {
            for (i, call) in calls.iter().enumerate() {
                tool_call(out, call).map_err(|e| e.within(&format!("tool_calls[{i}]")))?;
            }
        }
        Some(other) => return Err(wrong("tool_calls", "an array", other)),
    }
    // Legacy (pre-tools) assistant `function_call`.
    if let Some(f) = m.get_present("function_call") {
        function(out, f).map_err(|e| e.within("function_call"))?;
    }
    out.end_block();
    Ok(())
}

fn tool_call(out: &mut Out, call: &J) -> Result<(), CanonError> {
    if !matches!(call, J::Obj(_)) {
        return Err(wrong("", "an object", call));
    }
    match call.get_present("function") {
        Some(f) => function(out, f).map_err(|e| e.within("function")),
        None => {
            out.field_json(b'u', call, &["id"]);
            Ok(())
        }
    }
}

fn function(out: &mut Out, f: &J) -> Result<(), CanonError> {
    if !matches!(f, J::Obj(_)) {
        return Err(wrong("", "an object", f));
    }
    out.field(b'c', req_str(f, "name")?.as_bytes());
    arguments(out, f.get("arguments"));
    Ok(())
}

/// Tool-call arguments: a JSON string is re-encoded canonically when it parses (so key order
/// and whitespace inside it do not matter), else hashed verbatim; a JSON value is encoded
/// canonically. Canonical JSON and unparsable text never coincide, so this stays injective.
fn arguments(out: &mut Out, args: Option<&J>) {
    match args {
        None | Some(J::Null) => out.field(b'a', b""),
        Some(J::Str(s)) => match serde_json::from_str::<J>(s) {
            Ok(parsed) => out.field_json(b'a', &parsed, &[]),
            Err(_) => out.field(b'a', s.as_bytes()),
        },
        Some(value) => out.field_json(b'a', value, &[]),
    }
}

/// `content`: absent/null → nothing, string → one text part, array → its parts.
fn content(out: &mut Out, c: Option<&J>, anthropic: &mut bool) -> Result<(), CanonError> {
    match c {
        None | Some(J::Null) => Ok(()),
        Some(J::Str(s)) => {
            out.field(b't', s.as_bytes());
            Ok(())
        }
        Some(J::Arr(parts)) => {
            for (i, p) in parts.iter().enumerate() {
                part(out, p, anthropic).map_err(|e| e.within(&format!("[{i}]")))?;
            }
            Ok(())
        }
        Some(other) => Err(wrong("", "a string, an array or null", other)),
    }
}

fn part(out: &mut Out, p: &J, anthropic: &mut bool) -> Result<(), CanonError> {
    let typ = match p {
        J::Str(s) => {
            out.field(b't', s.as_bytes());
            return Ok(());
        }
        J::Obj(_) => p.get("type").and_then(J::as_str),
        other => return Err(wrong("", "an object or a string", other)),
    };
    match typ {
        Some("text" | "input_text" | "output_text") => {
            out.field(b't', req_str(p, "text")?.as_bytes());
        }
        Some("tool_use") => {
            *anthropic = true;
            out.field(b'c', req_str(p, "name")?.as_bytes());
            match p.get("input") {
                None => out.field(b'a', b"{}"),
                Some(input) => out.field_json(b'a', input, &[]),
            }
        }
        Some("tool_result") => {
            *anthropic = true;
            match p.get_present("tool_use_id") {
                None => out.field(b'R', b""),
                Some(J::Str(id)) => out.field(b'R', id.as_bytes()),
                Some(other) => return Err(wrong("tool_use_id", "a string", other)),
            }
            if matches!(p.get("is_error"), Some(J::Bool(true))) {
                out.field(b'e', b"");
            }
            content(out, p.get("content"), anthropic).map_err(|e| e.within("content"))?;
            out.field(b'E', b"");
        }
        Some(t) => {
            if matches!(t, "thinking" | "redacted_thinking" | "document")
                || (t == "image" && p.get("source").is_some())
            {
                *anthropic = true;
            }
            out.field_json(b'j', p, SKIP_PART_KEYS);
        }
        None => out.field_json(b'j', p, SKIP_PART_KEYS),
    }
    Ok(())
}

fn req_str<'j>(v: &'j J, key: &str) -> Result<&'j str, CanonError> {
    match v.get(key) {
        Some(J::Str(s)) => Ok(s.as_ref()),
        None => Err(CanonError::MissingField {
            path: key.to_owned(),
        }),
        Some(other) => Err(wrong(key, "a string", other)),
    }
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

/// Appends `bytes` with each 0x00 written as `00 FF`.
fn escape_into(dst: &mut Vec<u8>, bytes: &[u8]) {
    // Fast path: `contains` on bytes is memchr-accelerated; NULs in prompts are rare.
    if !bytes.contains(&0) {
        dst.extend_from_slice(bytes);
        return;
    }
    for (i, run) in bytes.split(|&b| b == 0).enumerate() {
        if i > 0 {
            dst.extend_from_slice(&ESCAPED_ZERO);
        }
        dst.extend_from_slice(run);
    }
}

/// Block writer: fields go to `scratch`; `end_block` cuts it into blocks in `buf`.
struct Out {
    buf: Vec<u8>,
    ends: Vec<usize>,
    scratch: Vec<u8>,
    kind: u8,
    chunk: usize,
    max_blocks: usize,
    capped: bool,
}

impl Out {
    fn new(cfg: &CanonConfig) -> Self {
        Self {
            buf: Vec::new(),
            ends: Vec::new(),
            scratch: Vec::new(),
            kind: KIND_MESSAGE,
            chunk: cfg.chunk_bytes,
            max_blocks: cfg.max_blocks,
            capped: false,
        }
    }

    fn full(&self) -> bool {
        self.ends.len() >= self.max_blocks
    }

    fn begin(&mut self, kind: u8) {
        self.kind = kind;
        self.scratch.clear();
    }

    fn field(&mut self, tag: u8, value: &[u8]) {
        self.scratch.push(tag);
        escape_into(&mut self.scratch, value);
        self.scratch.extend_from_slice(&FIELD_END);
    }

    /// Canonical JSON contains no 0x00, so it needs no escaping.
    fn field_json(&mut self, tag: u8, value: &J, skip_top: &[&str]) {
        self.scratch.push(tag);
        write_canonical(&mut self.scratch, value, skip_top);
        self.scratch.extend_from_slice(&FIELD_END);
    }

    fn end_block(&mut self) {
        let Out {
            buf,
            ends,
            scratch,
            kind,
            chunk,
            max_blocks,
            capped,
        } = self;
        let piece_len = if *chunk == 0 || scratch.len() <= *chunk {
            // One piece; `max(1)` because `chunks(0)` would panic (scratch is never empty).
            scratch.len().max(1)
        } else {
            *chunk
        };
        for (i, piece) in scratch.chunks(piece_len).enumerate() {
            if ends.len() >= *max_blocks {
                *capped = true;
                return;
            }
            buf.push(if i == 0 { *kind } else { KIND_CONTINUATION });
            buf.extend_from_slice(piece);
            ends.push(buf.len());
        }
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
        while let Some(key) = map.next_key_seed(super::json::KeySeed)? {
            match key.as_ref() {
                "model" => top.model = Some(map.next_value()?),
                "messages" => top.messages = Some(map.next_value_seed(list())?),
                "input" => top.input = Some(map.next_value_seed(list())?),
                "prompt" => top.prompt = Some(map.next_value()?),
                "instructions" => top.instructions = Some(map.next_value()?),
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
