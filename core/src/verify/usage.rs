//! The usage an engine reports in a response: `usage.prompt_tokens` with
//! `usage.prompt_tokens_details.cached_tokens` (OpenAI Chat / Completions: vLLM with
//! `--enable-prompt-tokens-details`, SGLang), `usage.input_tokens` with
//! `usage.input_tokens_details.cached_tokens` (Responses API), or Anthropic Messages'
//! `usage.cache_read_input_tokens`, whose `input_tokens` counts only the prompt tokens neither
//! read from nor written to the cache: the prompt is `input_tokens + cache_read_input_tokens +
//! cache_creation_input_tokens` (the fields of `Usage` and `MessageDeltaUsage` in Anthropic's
//! SDKs, e.g. anthropic-sdk-python `src/anthropic/types/usage.py`). An OpenAI-style report is
//! the last object of a JSON body and sits in the last data event of a stream; an Anthropic
//! stream reports the prompt in its first event (`message_start`'s `message.usage`) and, from
//! newer servers, again in its last `message_delta` (cumulative). So a bounded tail of the body
//! is kept, and a bounded head ([`Tail`]), and scanned once at the end: no body is parsed whole
//! (docs/redis-data-model.md §5 "Engine-verified keys").

use crate::bytes::{rfind, rfind_any, skip_ws};

/// Bytes of a response's end kept for the scan: a usage object with its details is a few
/// hundred bytes; vLLM's and SGLang's last stream events stay well under this.
pub const TAIL_BYTES: usize = 4096;

/// Bytes of a response's start kept for the scan: an Anthropic stream's `message_start` event
/// (the message's id, model, empty content and usage) is a few hundred bytes.
pub const HEAD_BYTES: usize = 4096;

/// A token count above this is not an engine's answer (garbage or a test's probe): no
/// verification.
pub const MAX_TOKENS: u64 = 1 << 30;

/// The token counts an answer reported: what the machine puts in a request's outcome
/// (core/src/balancer/holding.rs). Each is None when the answer did not carry it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    /// The prompt's tokens, cached ones included.
    pub prompt: Option<u64>,
    /// Tokens generated (`completion_tokens`, or `output_tokens` of the Responses and
    /// Anthropic APIs).
    pub output: Option<u64>,
    /// Of the prompt, the tokens the engine found in its cache: only with the prompt of the
    /// same report ([`Tokens::cache_report`]).
    pub cached: Option<u64>,
}

impl Tokens {
    /// The prompt and its cached tokens, from one report: what a verification compares.
    pub fn cache_report(&self) -> Option<Usage> {
        Some(Usage {
            prompt_tokens: self.prompt?,
            cached_tokens: self.cached?,
        })
    }
}

/// The counts a verification compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

/// The last [`TAIL_BYTES`] of a response body, across its chunks, and its first
/// [`HEAD_BYTES`].
#[derive(Debug, Default)]
pub struct Tail {
    buf: Vec<u8>,
    head: Vec<u8>,
}

impl Tail {
    pub fn push(&mut self, chunk: &[u8]) {
        if self.head.len() < HEAD_BYTES {
            let take = chunk.len().min(HEAD_BYTES - self.head.len());
            self.head
                .extend_from_slice(chunk.get(..take).unwrap_or_default());
        }
        if chunk.len() >= TAIL_BYTES {
            self.buf.clear();
            self.buf
                .extend_from_slice(&chunk[chunk.len() - TAIL_BYTES..]);
            return;
        }
        // Compacted only when twice the tail is held: a streamed answer's many small chunks
        // would otherwise move the whole tail once each.
        if self.buf.len() + chunk.len() > 2 * TAIL_BYTES {
            let keep = TAIL_BYTES - chunk.len();
            self.buf.drain(..self.buf.len().saturating_sub(keep));
        }
        self.buf.extend_from_slice(chunk);
    }

    /// The body's last [`TAIL_BYTES`].
    fn tail(&self) -> &[u8] {
        let from = self.buf.len().saturating_sub(TAIL_BYTES);
        self.buf.get(from..).unwrap_or_default()
    }

    /// The body's first bytes (at most [`HEAD_BYTES`]).
    pub fn head(&self) -> &[u8] {
        &self.head
    }

    /// The usage of the body seen: its tail's last report, else its head's (an Anthropic
    /// stream whose last `message_delta` carries only the output's count).
    pub fn usage(&self) -> Option<Usage> {
        scan(self.tail()).or_else(|| scan(&self.head))
    }

    /// Every count the body reported: the prompt and its cached tokens as [`Tail::usage`]
    /// reads them (else the prompt alone, from a report without cache details), and the
    /// output's count, each from the tail's last report, else the head's.
    pub fn tokens(&self) -> Tokens {
        let last = |read: fn(&[u8]) -> Option<u64>| read(self.tail()).or_else(|| read(&self.head));
        let output = last(output_tokens);
        match self.usage() {
            Some(u) => Tokens {
                prompt: Some(u.prompt_tokens),
                output,
                cached: Some(u.cached_tokens),
            },
            None => Tokens {
                prompt: last(prompt_tokens),
                output,
                cached: None,
            },
        }
    }
}

/// The last prompt count in `tail`, of either OpenAI spelling (`prompt_tokens`,
/// `input_tokens`), for a report without cache details (an Anthropic report has them:
/// [`scan`] reads it).
fn prompt_tokens(tail: &[u8]) -> Option<u64> {
    last_count(tail, &[b"\"prompt_tokens\"", b"\"input_tokens\""])
}

/// The last output count in `tail`: `completion_tokens` (Chat, Completions) or
/// `output_tokens` (Responses, Anthropic; cumulative in Anthropic's last `message_delta`).
fn output_tokens(tail: &[u8]) -> Option<u64> {
    last_count(tail, &[b"\"completion_tokens\"", b"\"output_tokens\""])
}

/// The count after whichever of `keys` comes last in `tail`.
fn last_count(tail: &[u8], keys: &[&[u8]]) -> Option<u64> {
    let (at, j) = rfind_any(tail, keys)?;
    value(tail.get(at + keys.get(j)?.len()..)?)
}

const ANTHROPIC_CACHED: &[u8] = b"\"cache_read_input_tokens\"";

/// The last usage report in `tail`: the last `*_tokens_details` object of either OpenAI
/// spelling gives `cached_tokens`, and the count beside it the prompt's size; or the last
/// Anthropic usage object with a `cache_read_input_tokens` count ([`anthropic`]), whichever
/// comes last. None when absent, malformed, implausible (cached above the prompt) or too large.
pub fn scan(tail: &[u8]) -> Option<Usage> {
    let spellings: [(&[u8], &[u8]); 3] = [
        (b"\"prompt_tokens_details\"", b"\"prompt_tokens\""),
        (b"\"input_tokens_details\"", b"\"input_tokens\""),
        (ANTHROPIC_CACHED, b""),
    ];
    let (at, j) = rfind_any(tail, &spellings.map(|(details, _)| details))?;
    let prompt_key = spellings.get(j)?.1;
    if prompt_key.is_empty() {
        return anthropic(tail, at);
    }
    let details = tail.get(at..)?;
    let end = details.iter().position(|&b| b == b'}')?;
    let cached = number_after(details.get(..end)?, b"\"cached_tokens\"")?;
    let prompt = number_after(tail, prompt_key)?;
    (cached <= prompt).then_some(Usage {
        prompt_tokens: prompt,
        cached_tokens: cached,
    })
}

/// The Anthropic usage object holding the `cache_read_input_tokens` key at `at`: the object
/// opened after the last `"usage"` key before it. Its `input_tokens` (required) excludes the
/// cached tokens and those written to the cache; `cache_creation_input_tokens` may be absent or
/// null (none written).
fn anthropic(tail: &[u8], at: usize) -> Option<Usage> {
    let key = rfind(tail.get(..at)?, b"\"usage\"")?;
    let rest = skip_ws(tail.get(key + b"\"usage\"".len()..)?);
    let open = skip_ws(rest.strip_prefix(b":")?);
    let object = object(open)?;
    let start = tail.len() - open.len();
    if at < start || at >= start + object.len() {
        return None; // the key belongs to another object than this usage
    }
    let cached = member(object, ANTHROPIC_CACHED)?;
    let uncached = member(object, b"\"input_tokens\"")?;
    let written = member(object, b"\"cache_creation_input_tokens\"").unwrap_or(0);
    let prompt = uncached.checked_add(cached)?.checked_add(written)?;
    (prompt <= MAX_TOKENS).then_some(Usage {
        prompt_tokens: prompt,
        cached_tokens: cached,
    })
}

/// The JSON object `s` starts with, up to its closing brace; None when it does not start with
/// one or is cut.
fn object(s: &[u8]) -> Option<&[u8]> {
    if s.first() != Some(&b'{') {
        return None;
    }
    let end = walk(s, |_, _| false)?;
    s.get(..=end)
}

/// The integer member `key` (quoted) of `object` itself, not of an object nested in it (a beta
/// server's per-iteration usages repeat the names).
fn member(object: &[u8], key: &[u8]) -> Option<u64> {
    let mut found = None;
    walk(object, |depth, at| {
        let is_key = depth == 1 && object.get(at..at + key.len()) == Some(key);
        if is_key {
            found = object.get(at + key.len()..).and_then(value);
        }
        is_key
    });
    found
}

/// Walks the JSON value starting `s` (an object or array), calling `at_string(depth, i)` at
/// each string's opening quote outside other strings (depth 1: a member of the outer value)
/// until it returns true; the index of the closing bracket of the outer value, if reached.
fn walk(s: &[u8], mut at_string: impl FnMut(usize, usize) -> bool) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, &b) in s.iter().enumerate() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => {
                if at_string(depth, i) {
                    return None;
                }
                in_string = true;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// The non-negative integer after the last `key:` in `hay`.
fn number_after(hay: &[u8], key: &[u8]) -> Option<u64> {
    value(hay.get(rfind(hay, key)? + key.len()..)?)
}

/// The non-negative integer of `: <digits>` at the start of `rest`.
fn value(rest: &[u8]) -> Option<u64> {
    let mut rest = skip_ws(rest);
    rest = skip_ws(rest.strip_prefix(b":")?);
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    // Ten digits already exceed MAX_TOKENS: longer runs are not parsed.
    if digits == 0 || digits > 10 || rest.get(digits).is_some_and(|&b| b == b'.') {
        return None;
    }
    let n = rest
        .get(..digits)?
        .iter()
        .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
    (n <= MAX_TOKENS).then_some(n)
}

#[cfg(test)]
mod tests;
