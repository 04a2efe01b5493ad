//! TensorRT-LLM's opaque state (docs/disaggregated-serving.md §2), which travels
//! base64-encoded (`encoded_opaque_state`); its request and answer shapes are in request.rs
//! and prefill.rs. The real opaque state is the
//! engine's own cache-transceiver state; the fake's is a small JSON naming the prefill rank
//! and its blocks.

use super::fabric::Key;
use serde_json::{json, Value};

/// The opaque state naming the prefill rank (`engine_id`, host, port) and its block ids.
pub fn encode_state(engine_id: &str, host: &str, port: u16, block_ids: &[u64]) -> String {
    let state = json!({"engine_id": engine_id, "host": host, "port": port, "blocks": block_ids});
    b64_encode(state.to_string().as_bytes())
}

pub fn decode_state(s: &str) -> Option<(String, String, u16)> {
    let v: Value = serde_json::from_slice(&b64_decode(s)?).ok()?;
    Some((
        v.get("engine_id")?.as_str()?.to_string(),
        v.get("host")?.as_str()?.to_string(),
        u16::try_from(v.get("port")?.as_u64()?).ok()?,
    ))
}

/// The key a context answer's transfer is offered under.
pub fn key(engine_id: &str, ctx_request_id: u64) -> Key {
    (engine_id.to_string(), ctx_request_id.to_string())
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (Python's `base64.b64encode`, which TensorRT-LLM uses).
pub fn b64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Standard base64 with padding; `None` on anything else.
pub fn b64_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.as_bytes();
    if !s.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    for chunk in s.chunks(4) {
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 {
            return None;
        }
        let mut n = 0u32;
        for &c in &chunk[..4 - pad] {
            n = (n << 6) | B64.iter().position(|&x| x == c)? as u32;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_as_python_writes_it() {
        assert_eq!(b64_encode(b"ab"), "YWI=");
        assert_eq!(b64_encode(b"abc"), "YWJj");
        assert_eq!(b64_encode(b"a"), "YQ==");
        for s in ["", "a", "ab", "abc", "{\"engine_id\":\"p\"}"] {
            assert_eq!(b64_decode(&b64_encode(s.as_bytes())).unwrap(), s.as_bytes());
        }
        assert!(b64_decode("YQ=").is_none());
        assert!(b64_decode("Y!==").is_none());
        let st = encode_state("p", "127.0.0.1", 80, &[1, 2]);
        assert_eq!(
            decode_state(&st).unwrap(),
            ("p".into(), "127.0.0.1".into(), 80)
        );
    }
}
