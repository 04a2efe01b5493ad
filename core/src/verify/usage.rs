//! The usage an engine reports at the end of a response: `usage.prompt_tokens` with
//! `usage.prompt_tokens_details.cached_tokens` (OpenAI Chat / Completions: vLLM with
//! `--enable-prompt-tokens-details`, SGLang) or `usage.input_tokens` with
//! `usage.input_tokens_details.cached_tokens` (Responses API). It is the last object of a JSON
//! body and sits in the last data event of a stream, so only a bounded tail of the body is kept
//! ([`Tail`]) and scanned once at the end: no body is parsed whole (docs/redis-data-model.md §5
//! "Engine-verified keys").

use crate::bytes::{rfind, skip_ws};

/// Bytes of a response's end kept for the scan: a usage object with its details is a few
/// hundred bytes; vLLM's and SGLang's last stream events stay well under this.
pub const TAIL_BYTES: usize = 4096;

/// A token count above this is not an engine's answer (garbage or a test's probe): no
/// verification.
pub const MAX_TOKENS: u64 = 1 << 30;

/// The counts a verification compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

/// The last [`TAIL_BYTES`] of a response body, across its chunks.
#[derive(Debug, Default)]
pub struct Tail {
    buf: Vec<u8>,
}

impl Tail {
    pub fn push(&mut self, chunk: &[u8]) {
        if chunk.len() >= TAIL_BYTES {
            self.buf.clear();
            self.buf
                .extend_from_slice(&chunk[chunk.len() - TAIL_BYTES..]);
            return;
        }
        let keep = TAIL_BYTES - chunk.len();
        if self.buf.len() > keep {
            self.buf.drain(..self.buf.len() - keep);
        }
        self.buf.extend_from_slice(chunk);
    }

    /// The usage of the body seen, if its tail reports one.
    pub fn usage(&self) -> Option<Usage> {
        scan(&self.buf)
    }
}

/// The last usage report in `tail`: the last `*_tokens_details` object of either spelling
/// gives `cached_tokens`, and the count beside it the prompt's size. None when absent,
/// malformed, implausible (cached above the prompt) or too large.
pub fn scan(tail: &[u8]) -> Option<Usage> {
    let spellings: [(&[u8], &[u8]); 2] = [
        (b"\"prompt_tokens_details\"", b"\"prompt_tokens\""),
        (b"\"input_tokens_details\"", b"\"input_tokens\""),
    ];
    let (at, prompt_key) = spellings
        .iter()
        .filter_map(|(details, prompt)| Some((rfind(tail, details)?, *prompt)))
        .max_by_key(|(at, _)| *at)?;
    let details = tail.get(at..)?;
    let end = details.iter().position(|&b| b == b'}')?;
    let cached = number_after(details.get(..end)?, b"\"cached_tokens\"")?;
    let prompt = number_after(tail, prompt_key)?;
    (cached <= prompt).then_some(Usage {
        prompt_tokens: prompt,
        cached_tokens: cached,
    })
}

/// The non-negative integer after the last `key:` in `hay`.
fn number_after(hay: &[u8], key: &[u8]) -> Option<u64> {
    let mut rest = hay.get(rfind(hay, key)? + key.len()..)?;
    rest = skip_ws(rest);
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
mod tests {
    use super::*;

    fn usage(p: u64, c: u64) -> Option<Usage> {
        Some(Usage {
            prompt_tokens: p,
            cached_tokens: c,
        })
    }

    #[test]
    fn reads_both_spellings_and_the_last_report() {
        let chat = br#"{"choices":[{"index":0}],"usage":{"prompt_tokens":120,"completion_tokens":5,"total_tokens":125,"prompt_tokens_details":{"cached_tokens":96}}}"#;
        assert_eq!(scan(chat), usage(120, 96));
        let responses = br#"{"usage":{"input_tokens":300,"input_tokens_details":{"cached_tokens":256},"output_tokens":9,"output_tokens_details":{"reasoning_tokens":0}}}"#;
        assert_eq!(scan(responses), usage(300, 256));
        let spaced = b"{\"usage\": {\"prompt_tokens\" : 7,\n \"prompt_tokens_details\": { \"cached_tokens\" :\t4 }}}";
        assert_eq!(scan(spaced), usage(7, 4));
        let two =
            br#"data: {"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":1}}}

data: {"usage":{"prompt_tokens":20,"prompt_tokens_details":{"cached_tokens":16}}}

data: [DONE]

"#;
        assert_eq!(scan(two), usage(20, 16), "the stream's last report");
    }

    #[test]
    fn absent_garbage_and_huge_values_verify_nothing() {
        for body in [
            &b""[..],
            br#"{"usage":{"prompt_tokens":12,"completion_tokens":3}}"#,
            br#"{"usage":{"prompt_tokens":12,"prompt_tokens_details":null}}"#,
            br#"{"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":"8"}}}"#,
            br#"{"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":-8}}}"#,
            br#"{"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":8.5}}}"#,
            br#"{"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":99}}}"#,
            br#"{"usage":{"prompt_tokens":99999999999999999999999,"prompt_tokens_details":{"cached_tokens":8}}}"#,
            br#"{"usage":{"prompt_tokens_details":{"cached_tokens":8}}}"#,
            br#"{"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens""#,
            b"\xff\xfe\"prompt_tokens_details\"\x00}",
        ] {
            assert_eq!(scan(body), None, "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn the_tail_keeps_the_end_across_chunks() {
        let mut t = Tail::default();
        t.push(&vec![b'x'; 10_000]);
        t.push(br#"{"usage":{"prompt_tokens":50,"#);
        t.push(br#""prompt_tokens_details":{"cached_tokens":32}}}"#);
        assert_eq!(t.usage(), usage(50, 32));
        assert!(t.buf.len() <= TAIL_BYTES);
        for _ in 0..100 {
            t.push(b"data: {\"choices\":[{\"delta\":{\"content\":\"more\"}}]}\n\n");
        }
        assert_eq!(t.usage(), None, "a report pushed out of the tail is gone");
        assert_eq!(t.buf.len(), TAIL_BYTES);
    }
}
