//! Long streamed chat requests held open through a gateway (issue 51's real-engine tests):
//! each is left once its first event came, so a test can look at the engines and the plugin's
//! counts while the requests run, then close them (a client abort) or read them to their end.

use crate::gateway::open;
use serde_json::json;
use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One streamed request in flight.
pub struct Held {
    /// `endpoint=` of the plugin's debug header: the engine the plugin chose.
    pub endpoint: String,
    /// Everything read so far (head and the first events).
    pub seen: String,
    stream: TcpStream,
}

/// A chat body that streams `max_tokens` tokens whatever the random model says
/// (`ignore_eos`): long enough to outlast the test's look at it.
pub fn long_body(tag: &str, max_tokens: u64) -> Vec<u8> {
    json!({"model": "tiny", "stream": true, "max_tokens": max_tokens, "ignore_eos": true,
        "messages": [{"role": "user", "content": format!("{tag}: tell me a long story")}]})
    .to_string()
    .into_bytes()
}

/// Sends [`long_body`] through `gateway` and reads until the first `data:` event: the engine
/// is generating. Err when the answer is not a 200 stream.
pub fn hold(gateway: &str, debug_header: &str, tag: &str, max_tokens: u64) -> anyhow::Result<Held> {
    let headers = [("content-type", "application/json")];
    let mut stream = open(
        gateway,
        "POST",
        "/v1/chat/completions",
        &headers,
        &long_body(tag, max_tokens),
    )?;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data:") {
        let n = stream.read(&mut buf)?;
        anyhow::ensure!(n > 0, "closed: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    let seen = String::from_utf8_lossy(&seen).into_owned();
    anyhow::ensure!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    let prefix = format!("{}:", debug_header.to_ascii_lowercase());
    let endpoint = seen
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix(&prefix)
                .map(str::to_string)
        })
        .and_then(|v| {
            v.split(';')
                .find_map(|p| p.trim().strip_prefix("endpoint=").map(str::to_string))
        })
        .unwrap_or_default();
    Ok(Held {
        endpoint,
        seen,
        stream,
    })
}

impl Held {
    /// Reads to the end of the response (the connection closes: `connection: close`) or
    /// until `limit` has passed: (whether it ended, whether `[DONE]` came, how long it took).
    pub fn finish(mut self, limit: Duration) -> (bool, bool, Duration) {
        let start = Instant::now();
        let _ = self
            .stream
            .set_read_timeout(Some(Duration::from_millis(100)));
        let mut all = std::mem::take(&mut self.seen).into_bytes();
        let mut buf = [0u8; 4096];
        let ended = loop {
            match self.stream.read(&mut buf) {
                Ok(0) => break true,
                Ok(n) => all.extend_from_slice(&buf[..n]),
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                // A reset: ended, too.
                Err(_) => break true,
            }
            if start.elapsed() > limit {
                break false;
            }
        };
        let done = String::from_utf8_lossy(&all).contains("[DONE]");
        (ended, done, start.elapsed())
    }
}
