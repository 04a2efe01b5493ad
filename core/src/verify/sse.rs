//! Removing the usage-only event from a Chat / Completions stream whose usage the plugin asked
//! for (`stream_options.include_usage`, [`super::inject`]): the client gets the stream it asked
//! for. That event is `data: {…"choices":[],…"usage":{…}}` (OpenAI's format, vLLM's and
//! SGLang's). Events end with a blank line; one may be split across body chunks, so an
//! incomplete trailing event is held back and released with the next chunk or at the end.

use crate::bytes::{find, skip_ws};

/// An event that does not end within this many bytes is not the small usage event: what is
/// held is released as it is, so a stream that is not SSE is never held whole.
pub const MAX_HELD_BYTES: usize = 64 * 1024;

/// The filter's state across one response's chunks.
#[derive(Debug, Default)]
pub struct UsageFilter {
    held: Vec<u8>,
    /// Usage-only events removed.
    pub removed: u32,
}

impl UsageFilter {
    /// The bytes to forward in place of `chunk` (the last one when `end`); None: forward
    /// `chunk` as it is (the common case: no usage in it, nothing held).
    pub fn filter(&mut self, chunk: &[u8], end: bool) -> Option<Vec<u8>> {
        let ends_clean = chunk.ends_with(b"\n\n") || chunk.ends_with(b"\r\n\r\n");
        if self.held.is_empty() && (ends_clean || end) && !contains(chunk, b"\"usage\"") {
            return None;
        }
        self.held.extend_from_slice(chunk);
        let mut out = Vec::with_capacity(self.held.len());
        let mut start = 0;
        while let Some(len) = self.held.get(start..).and_then(event_len) {
            let event = self.held.get(start..start + len).unwrap_or_default();
            forward(event, &mut out, &mut self.removed);
            start += len;
        }
        let rest = self.held.get(start..).unwrap_or_default().to_vec();
        self.held.clear();
        if end || rest.len() > MAX_HELD_BYTES {
            forward(&rest, &mut out, &mut self.removed);
        } else {
            self.held = rest;
        }
        Some(out)
    }
}

/// Appends `event` to `out` unless it is the usage-only one.
fn forward(event: &[u8], out: &mut Vec<u8>, removed: &mut u32) {
    if is_usage_only(event) {
        *removed += 1;
    } else {
        out.extend_from_slice(event);
    }
}

/// The length of the first complete event of `s` (its blank line included).
fn event_len(s: &[u8]) -> Option<usize> {
    let lf = find(s, b"\n\n").map(|i| i + 2);
    let crlf = find(s, b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A data event with an empty `choices` and a `usage`: nothing for the client but the usage.
pub fn is_usage_only(event: &[u8]) -> bool {
    let s = skip_ws(event);
    if !s.starts_with(b"data:") || !contains(s, b"\"usage\"") {
        return false;
    }
    let Some(at) = find(s, b"\"choices\"") else {
        return false;
    };
    let rest = skip_ws(s.get(at + b"\"choices\"".len()..).unwrap_or_default());
    let Some(rest) = rest.strip_prefix(b":") else {
        return false;
    };
    let Some(rest) = skip_ws(rest).strip_prefix(b"[") else {
        return false;
    };
    skip_ws(rest).starts_with(b"]")
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    find(hay, needle).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
    const USAGE: &str = "data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    /// `stream` cut at every position in `cuts`, filtered; what the client receives.
    fn through(stream: &str, cuts: &[usize]) -> (String, u32) {
        let mut f = UsageFilter::default();
        let mut out = Vec::new();
        let mut from = 0;
        let mut bounds: Vec<usize> = cuts.to_vec();
        bounds.push(stream.len());
        for (i, &to) in bounds.iter().enumerate() {
            let chunk = &stream.as_bytes()[from..to];
            let end = i + 1 == bounds.len();
            match f.filter(chunk, end) {
                Some(v) => out.extend(v),
                None => out.extend_from_slice(chunk),
            }
            from = to;
        }
        (String::from_utf8(out).unwrap(), f.removed)
    }

    #[test]
    fn the_usage_event_goes_at_every_split() {
        let stream = format!("{TOKEN}{TOKEN}{USAGE}{DONE}");
        let want = format!("{TOKEN}{TOKEN}{DONE}");
        assert_eq!(through(&stream, &[]), (want.clone(), 1));
        for a in 0..stream.len() {
            assert_eq!(through(&stream, &[a]), (want.clone(), 1), "cut at {a}");
        }
        let cuts: Vec<usize> = (1..stream.len()).collect();
        assert_eq!(through(&stream, &cuts), (want, 1), "byte by byte");
    }

    #[test]
    fn other_streams_pass_untouched() {
        let crlf = "data: {\"choices\":[{\"delta\":{}}]}\r\n\r\ndata: [DONE]\r\n\r\n";
        assert_eq!(through(crlf, &[10]), (crlf.to_string(), 0));
        let last_with_choices =
            "data: {\"choices\":[{\"delta\":{}}],\"usage\":{\"prompt_tokens\":3}}\n\n";
        assert_eq!(
            through(last_with_choices, &[7]),
            (last_with_choices.into(), 0)
        );
        let no_blank_line = format!("{TOKEN}data: [DONE]");
        assert_eq!(
            through(&no_blank_line, &[5, 70]),
            (no_blank_line.clone(), 0)
        );
        let json = "{\"choices\":[],\"usage\":{}}";
        assert_eq!(through(json, &[3]), (json.to_string(), 0), "not an event");
        let spaced = "data: {\"choices\" : [ ] , \"usage\": {}}\n\n";
        assert_eq!(through(spaced, &[]), (String::new(), 1));
    }

    #[test]
    fn a_huge_event_is_not_held() {
        let mut f = UsageFilter::default();
        let big = vec![b'a'; MAX_HELD_BYTES + 1];
        assert_eq!(f.filter(b"data: \"usage\"", false), Some(Vec::new()));
        assert_eq!(f.filter(&big, false).map(|v| v.len()), Some(big.len() + 13));
        assert!(f.held.is_empty());
    }
}
