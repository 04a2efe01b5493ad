//! prefix_cache's engine-verified index: the call of prefix_forget.lua
//! (docs/redis-data-model.md §5 "Engine-verified keys", step 4).

use super::scripts::{call, Keys, Script, PREFIX_FORGET};

/// The least time between two generation bumps of one pod (prefix_forget.lua).
pub const FORGET_INTERVAL_MS: u64 = 5_000;

/// `EVAL` of prefix_forget.lua (docs/redis-data-model.md §5 "Engine-verified keys"). `pod_wide`
/// (the pod was emptied): `endpoint`'s generation bumped, at most once per
/// [`FORGET_INTERVAL_MS`], and `chain` re-written at the new one. Otherwise (one conversation
/// answered short): `chain`, that conversation's keys past what the engine had cached, stop
/// naming `endpoint`. Sent as EVAL (text, not SHA): a lost script needs no second round.
pub fn forget_call(
    keys: &Keys,
    chain: &[String],
    endpoint: &str,
    ttl_s: u64,
    now_ms: u64,
    pod_wide: bool,
) -> Vec<u8> {
    let mut all_keys: Vec<&str> = vec![&keys.gen];
    all_keys.extend(chain.iter().map(String::as_str));
    let (ttl, now, interval) = (
        ttl_s.to_string(),
        now_ms.to_string(),
        FORGET_INTERVAL_MS.to_string(),
    );
    let forget = Script {
        text: PREFIX_FORGET,
        sha: String::new(),
    };
    let mode: &[u8] = if pod_wide { b"pod" } else { b"keys" };
    let args: [&[u8]; 5] = [
        endpoint.as_bytes(),
        ttl.as_bytes(),
        now.as_bytes(),
        interval.as_bytes(),
        mode,
    ];
    call(&forget, false, &all_keys, &args)
}
