//! Where one chat answer was served, as the answer says it: the fake pod's `x-pod` and
//! `x-fake-rank` headers, the plugin's debug header's `endpoint=`, and the cached prompt
//! tokens its usage reports (the data-parallel tests in both builds).

use crate::gateway::http;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Served {
    pub pod: String,
    /// The DP rank that served (empty from a pod without ranks).
    pub rank: String,
    /// The debug header's `endpoint=` (`x-ai-lb-debug`).
    pub endpoint: String,
    pub cached: u64,
}

/// POSTs `body` to `url`'s `/v1/chat/completions` with `extra` headers; asserts a 200.
pub fn send_chat(url: &str, body: &Value, extra: &[(&str, &str)]) -> Served {
    let mut headers = vec![("content-type", "application/json")];
    headers.extend_from_slice(extra);
    let path = "/v1/chat/completions";
    let (status, hs, text) = http(url, "POST", path, &headers, body.to_string().as_bytes())
        .unwrap_or_else(|e| panic!("{url}{path}: {e}"));
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&text));
    let h = |n: &str| {
        hs.iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let endpoint = h("x-ai-lb-debug")
        .split("; ")
        .find_map(|f| f.strip_prefix("endpoint=").map(String::from))
        .unwrap_or_default();
    let v: Value = serde_json::from_slice(&text).unwrap_or_default();
    Served {
        pod: h("x-pod"),
        rank: h("x-fake-rank"),
        endpoint,
        cached: v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
    }
}
