//! The proxy-wasm "pairs" encoding, used for header maps and by Higress's
//! `proxy_get_upstream_hosts`: u32 LE count, then count × (u32 LE key len, u32 LE value len),
//! then each key and value followed by a NUL byte.

/// Why a pairs buffer could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairsError(pub &'static str);

impl std::fmt::Display for PairsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed pairs buffer: {}", self.0)
    }
}

/// A borrowed (key, value) pair.
pub type Pair<'a> = (&'a [u8], &'a [u8]);

/// Decodes a pairs buffer into borrowed (key, value) byte slices.
pub fn decode(buf: &[u8]) -> Result<Vec<Pair<'_>>, PairsError> {
    if buf.is_empty() {
        return Ok(Vec::new());
    }
    let count = read_u32(buf, 0).ok_or(PairsError("no count"))? as usize;
    let sizes_end = count
        .checked_mul(8)
        .and_then(|n| n.checked_add(4))
        .filter(|&end| end <= buf.len())
        .ok_or(PairsError("count larger than the buffer"))?;
    let mut pairs = Vec::with_capacity(count);
    let mut data = sizes_end;
    for i in 0..count {
        let key_len = read_u32(buf, 4 + i * 8).ok_or(PairsError("size table"))? as usize;
        let value_len = read_u32(buf, 8 + i * 8).ok_or(PairsError("size table"))? as usize;
        let key = take(buf, &mut data, key_len)?;
        let value = take(buf, &mut data, value_len)?;
        pairs.push((key, value));
    }
    Ok(pairs)
}

/// Encodes (key, value) pairs; used for local-response headers.
pub fn encode(pairs: &[(&str, &str)]) -> Vec<u8> {
    let payload: usize = pairs.iter().map(|(k, v)| k.len() + v.len() + 10).sum();
    let mut out = Vec::with_capacity(4 + payload);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

fn read_u32(buf: &[u8], at: usize) -> Option<u32> {
    let bytes = buf.get(at..at + 4)?;
    Some(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

/// Takes `len` bytes plus the NUL that must follow them.
fn take<'a>(buf: &'a [u8], pos: &mut usize, len: usize) -> Result<&'a [u8], PairsError> {
    let end = pos.checked_add(len).ok_or(PairsError("length overflow"))?;
    let bytes = buf.get(*pos..end).ok_or(PairsError("truncated data"))?;
    if buf.get(end) != Some(&0) {
        return Err(PairsError("missing NUL terminator"));
    }
    *pos = end + 1;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let pairs = [("10.0.0.1:80", "{\"health_status\":\"Healthy\"}"), ("", "")];
        let buf = encode(&pairs);
        let got = decode(&buf).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[0],
            (&b"10.0.0.1:80"[..], &b"{\"health_status\":\"Healthy\"}"[..])
        );
        assert_eq!(got[1], (&b""[..], &b""[..]));
        assert_eq!(decode(&[]).unwrap(), vec![]);
    }

    #[test]
    fn rejects_malformed_buffers() {
        let good = encode(&[("a", "b")]);
        assert!(decode(&good[..3]).is_err());
        assert!(decode(&good[..good.len() - 1]).is_err());
        let mut no_nul = good.clone();
        let last = no_nul.len() - 1;
        no_nul[last] = b'x';
        assert!(decode(&no_nul).is_err());
        assert!(decode(&[0xff, 0xff, 0xff, 0x7f]).is_err());
        // Fuzz-style: every prefix and every single-byte corruption is an error or a decode, never a panic.
        for cut in 0..good.len() {
            let _ = decode(&good[..cut]);
            for b in [0u8, 1, 0x7f, 0xff] {
                let mut m = good.clone();
                m[cut] = b;
                let _ = decode(&m);
            }
        }
    }
}
