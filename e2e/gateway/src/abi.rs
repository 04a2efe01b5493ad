//! Proxy-Wasm ABI constants and wire encodings shared by the host-call implementations.
//! Values follow proxy-wasm 0.2.1 (crate proxy-wasm 0.2.5) plus the Higress extensions
//! (docs/higress-abi.md §1, §3).

/// `WasmResult` status codes returned by every host call.
pub mod status {
    pub const OK: i32 = 0;
    pub const NOT_FOUND: i32 = 1;
    pub const BAD_ARGUMENT: i32 = 2;
    pub const INVALID_MEMORY_ACCESS: i32 = 6;
    pub const EMPTY: i32 = 7;
    pub const CAS_MISMATCH: i32 = 8;
    pub const INTERNAL_FAILURE: i32 = 10;
    pub const BROKEN_CONNECTION: i32 = 11;
    pub const UNIMPLEMENTED: i32 = 12;
}

/// Buffer types of `proxy_get_buffer_bytes`; 9 is the Higress Redis reply.
pub mod buffer {
    pub const HTTP_REQUEST_BODY: i32 = 0;
    pub const HTTP_RESPONSE_BODY: i32 = 1;
    pub const HTTP_CALL_RESPONSE_BODY: i32 = 4;
    pub const VM_CONFIGURATION: i32 = 6;
    pub const PLUGIN_CONFIGURATION: i32 = 7;
    pub const REDIS_CALL_RESPONSE: i32 = 9;
    pub const MAX: i32 = 9;
}

/// Header map types.
pub mod map {
    pub const REQUEST_HEADERS: i32 = 0;
    pub const REQUEST_TRAILERS: i32 = 1;
    pub const RESPONSE_HEADERS: i32 = 2;
    pub const RESPONSE_TRAILERS: i32 = 3;
    pub const HTTP_CALL_RESPONSE_HEADERS: i32 = 6;
    pub const HTTP_CALL_RESPONSE_TRAILERS: i32 = 7;
}

/// Stream types of `proxy_continue_stream` / `proxy_close_stream`.
pub mod stream_type {
    pub const HTTP_REQUEST: i32 = 0;
    pub const HTTP_RESPONSE: i32 = 1;
}

/// The ABI version a module declares; decides how a request-headers return of 1 is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbiVersion {
    V0_1_0,
    V0_2_0,
    V0_2_1,
    V0_2_100,
}

impl AbiVersion {
    /// Higress (proxy-wasm-cpp-host bytecode_util) takes the FIRST matching export in
    /// export-section order, so a module exporting both 0_2_1 and 0_2_100 is whichever
    /// comes first. `exports` must be in section order.
    pub fn detect<'a>(exports: impl IntoIterator<Item = &'a str>) -> Option<AbiVersion> {
        exports.into_iter().find_map(|name| match name {
            "proxy_abi_version_0_1_0" => Some(AbiVersion::V0_1_0),
            "proxy_abi_version_0_2_0" => Some(AbiVersion::V0_2_0),
            "proxy_abi_version_0_2_1" => Some(AbiVersion::V0_2_1),
            "proxy_abi_version_0_2_100" => Some(AbiVersion::V0_2_100),
            _ => None,
        })
    }
}

/// How the host treats the stream after a headers callback returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderStatus {
    Continue,
    /// Headers held; body still delivered to this filter (0_2_100 `StopIteration`).
    StopIteration,
    /// Headers held and no data delivered to this filter until it resumes; data buffered.
    StopAll,
    /// Continue and treat the stream as ended (rare; we just continue).
    ContinueAndEndStream,
}

/// Request-headers return value → filter status (cpp-host `convertVmCallResultToFilterHeadersStatus`).
/// Under 0_2_1 (abi_02 conversion) 1 becomes StopAllIterationAndWatermark; under 0_2_100
/// (abi_03) 1 is StopIteration. Anything above 4 is StopAll in both.
pub fn request_header_status(abi: AbiVersion, ret: u32) -> HeaderStatus {
    match (abi, ret) {
        (_, 0) => HeaderStatus::Continue,
        (AbiVersion::V0_2_100, 1) => HeaderStatus::StopIteration,
        (_, 1) => HeaderStatus::StopAll,
        (_, 2) => HeaderStatus::ContinueAndEndStream,
        _ => HeaderStatus::StopAll,
    }
}

/// Response headers always use the abi_02 conversion (Higress only changed the request side).
pub fn response_header_status(ret: u32) -> HeaderStatus {
    request_header_status(AbiVersion::V0_2_1, ret)
}

/// Encode a proxy-wasm "pairs" map: u32 count, count×(u32 key_len, u32 val_len), then each
/// key and value followed by a NUL.
pub fn encode_pairs<K: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> Vec<u8> {
    let mut size = 4;
    for (k, v) in pairs {
        size += 8 + k.as_ref().len() + v.as_ref().len() + 2;
    }
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.as_ref().len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.as_ref().len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_ref());
        out.push(0);
        out.extend_from_slice(v.as_ref());
        out.push(0);
    }
    out
}

/// Decode a pairs map; `None` on any framing error (the caller answers BadArgument).
pub fn decode_pairs(data: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    if data.is_empty() {
        return Some(Vec::new());
    }
    let rd = |at: usize| -> Option<usize> {
        let b = data.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let n = rd(0)?;
    let mut sizes = Vec::with_capacity(n.min(1024));
    for i in 0..n {
        sizes.push((rd(4 + i * 8)?, rd(8 + i * 8)?));
    }
    let mut pos = 4 + n * 8;
    let mut out = Vec::with_capacity(sizes.len());
    for (kl, vl) in sizes {
        let k = data.get(pos..pos + kl)?.to_vec();
        pos += kl + 1;
        let v = data.get(pos..pos + vl)?.to_vec();
        pos += vl + 1;
        out.push((k, v));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_abi_export_wins() {
        let e = [
            "memory",
            "proxy_abi_version_0_2_1",
            "proxy_abi_version_0_2_100",
        ];
        assert_eq!(AbiVersion::detect(e), Some(AbiVersion::V0_2_1));
        let e = ["proxy_abi_version_0_2_100", "proxy_abi_version_0_2_1"];
        assert_eq!(AbiVersion::detect(e), Some(AbiVersion::V0_2_100));
        assert_eq!(AbiVersion::detect(["_start"]), None);
    }

    #[test]
    fn header_status_conversion() {
        use HeaderStatus::*;
        assert_eq!(request_header_status(AbiVersion::V0_2_1, 1), StopAll);
        assert_eq!(
            request_header_status(AbiVersion::V0_2_100, 1),
            StopIteration
        );
        assert_eq!(request_header_status(AbiVersion::V0_2_100, 7), StopAll);
        assert_eq!(response_header_status(1), StopAll);
        assert_eq!(request_header_status(AbiVersion::V0_2_100, 0), Continue);
    }

    #[test]
    fn pairs_round_trip() {
        let p = vec![
            ("a".as_bytes().to_vec(), b"1".to_vec()),
            (b"bb".to_vec(), b"".to_vec()),
        ];
        let enc = encode_pairs(&p);
        assert_eq!(&enc[..4], &2u32.to_le_bytes());
        assert_eq!(decode_pairs(&enc).unwrap(), p);
        assert!(decode_pairs(&enc[..enc.len() - 3]).is_none());
    }
}
