//! One streamed chat turn (`"stream": true` with `stream_options.include_usage`): the time to
//! the first SSE event carrying answer text (TTFT), the answer read from the deltas, and the
//! usage of the last event.

use crate::gateway::{open, parse_response};
use serde_json::Value;
use std::io::Read;
use std::time::{Duration, Instant};

/// A streamed answer, read whole.
pub struct Streamed {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// The de-chunked SSE body.
    pub body: String,
    /// The answer: every delta's `content`, in order.
    pub text: String,
    /// Time from sending to the first event whose delta has non-empty content.
    pub first_content: Option<Duration>,
    pub latency: Duration,
}

/// POSTs `body` (a chat request with `"stream": true`) to `base` + `path`.
pub fn post(
    base: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> anyhow::Result<Streamed> {
    let start = Instant::now();
    let mut s = open(base, "POST", path, headers, body)?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let mut first_content = None;
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if first_content.is_none() && deltas(&raw).iter().any(|d| !d.is_empty()) {
            first_content = Some(start.elapsed());
        }
    }
    let latency = start.elapsed();
    let (status, headers, body) = parse_response(&raw)?;
    let body = String::from_utf8_lossy(&body).into_owned();
    let text = events(&body).filter_map(|v| content(&v)).collect();
    Ok(Streamed {
        status,
        headers,
        body,
        text,
        first_content,
        latency,
    })
}

/// The delta contents of every complete event received so far in `raw` (a response read in
/// part: its head, then whole or partial chunks).
fn deltas(raw: &[u8]) -> Vec<String> {
    let Ok((_, _, body)) = parse_response(raw) else {
        return Vec::new();
    };
    let body = String::from_utf8_lossy(&body);
    // Only lines already ended: the last one may still be arriving.
    let complete = body.rfind('\n').map_or("", |i| &body[..i]);
    events(complete).filter_map(|v| content(&v)).collect()
}

/// The JSON of every `data:` line (`[DONE]` and anything unparsable skipped).
fn events(body: &str) -> impl Iterator<Item = Value> + '_ {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str(d.trim()).ok())
}

/// `choices[0].delta.content` when it is a string.
fn content(event: &Value) -> Option<String> {
    event
        .pointer("/choices/0/delta/content")
        .and_then(Value::as_str)
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_are_read_from_complete_events_only() {
        let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        let e1 = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":null}}]}\n\n";
        let e2 = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";
        let chunk = |s: &str| format!("{:x}\r\n{s}\r\n", s.len());
        let whole = format!("{head}{}{}", chunk(e1), chunk(e2));
        assert_eq!(deltas(whole.as_bytes()), vec!["hi".to_string()]);
        // The second event cut before its line ends: nothing yet.
        let cut = &whole[..whole.len() - 10];
        assert!(deltas(cut.as_bytes()).is_empty());
    }
}
