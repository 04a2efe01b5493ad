//! cluster_metrics AdaptiveScore's global in-flight count in Redis: the keys, the two script
//! calls and the acquire reply (docs/redis-data-model.md §8, Higress's semantics in
//! docs/higress-cluster-policies.md §3.6). The count lives in Higress's own hash, so Go and
//! Rust gateways of one fleet see the same numbers; our leases beside it heal a crashed
//! gateway's counts.

use super::resp::Value;
use super::scripts::{call, decode, lease_member, ReplyError, Scripts};

/// The hash Higress counts in and the lease set beside it, in one Redis Cluster slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InflightKeys {
    /// `<global_inflight_key_prefix>:<route_name>:AdaptiveScore`, exactly as Go names it.
    pub counts: String,
    pub leases: String,
}

impl InflightKeys {
    pub fn new(prefix: &str, route: &str) -> InflightKeys {
        let counts = format!("{prefix}:{route}:AdaptiveScore");
        // The lease set must hash to the counts' slot. Go's name has no hash tag of its own
        // unless the prefix or route brings one: then reuse it by appending; otherwise make the
        // whole name the tag (a key with no tag hashes as its whole name).
        let leases = if has_hash_tag(&counts) {
            format!("{counts}:leases")
        } else {
            format!("{{{counts}}}:leases")
        };
        InflightKeys { counts, leases }
    }
}

/// Redis Cluster's rule: a `{` followed later by a `}` with at least one byte between.
fn has_hash_tag(key: &str) -> bool {
    key.find('{')
        .and_then(|open| key[open + 1..].find('}'))
        .is_some_and(|len| len > 0)
}

/// One global in-flight acquire (see service_acquire.lua for the order).
#[derive(Debug, Clone)]
pub struct ServiceAcquireArgs<'a> {
    pub now_ms: u64,
    pub lease_ttl_ms: u64,
    pub key_ttl_s: u64,
    pub request_id: &'a str,
    pub random: u32,
    pub reclaim: u32,
    /// Candidate services and their local scores.
    pub candidates: &'a [(String, f64)],
}

pub fn acquire_call(
    scripts: &Scripts,
    by_sha: bool,
    keys: &InflightKeys,
    a: &ServiceAcquireArgs,
) -> Vec<u8> {
    let mut text = vec![
        a.now_ms.to_string(),
        a.lease_ttl_ms.to_string(),
        a.key_ttl_s.to_string(),
        a.request_id.to_string(),
        a.random.to_string(),
        a.reclaim.to_string(),
    ];
    for (service, score) in a.candidates {
        text.push(service.clone());
        text.push(score_arg(*score));
    }
    let args: Vec<&[u8]> = text.iter().map(|s| s.as_bytes()).collect();
    call(
        &scripts.service_acquire,
        by_sha,
        &[&keys.counts, &keys.leases],
        &args,
    )
}

/// A score as Lua's `tonumber` reads it: Rust's shortest round-trip form. NaN and infinities
/// (which `tonumber` does not read) become the largest finite value, as Go scores a service it
/// knows nothing about.
fn score_arg(score: f64) -> String {
    if score.is_finite() {
        format!("{score:?}")
    } else {
        format!("{:?}", f64::MAX)
    }
}

/// The lease member an acquire wrote for `service`.
pub fn member(request_id: &str, service: &str) -> String {
    lease_member(request_id, service, 1, None)
}

pub fn release_call(
    scripts: &Scripts,
    by_sha: bool,
    keys: &InflightKeys,
    members: &[String],
) -> Vec<u8> {
    let args: Vec<&[u8]> = members.iter().map(|m| m.as_bytes()).collect();
    call(
        &scripts.service_release,
        by_sha,
        &[&keys.counts, &keys.leases],
        &args,
    )
}

/// What a global in-flight acquire answered: the chosen service, or None (no candidates).
pub fn parse_acquire(raw: &[u8]) -> Result<Option<String>, ReplyError> {
    let value = decode(raw)?;
    let Value::Array(Some(items)) = &value else {
        return Err(ReplyError::Malformed(format!(
            "expected an array, got {value:?}"
        )));
    };
    match (
        items.first().and_then(Value::as_str),
        items.get(1).and_then(Value::as_str),
    ) {
        (Some("OK"), Some(service)) => Ok(Some(service.to_string())),
        (Some("EMPTY"), _) => Ok(None),
        _ => Err(ReplyError::Malformed(format!(
            "unexpected service acquire reply {items:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::resp;

    #[test]
    fn keys_follow_higress_and_share_a_slot() {
        let k = InflightKeys::new("higress:adaptive_score_inflight", "default/chat");
        assert_eq!(
            k.counts,
            "higress:adaptive_score_inflight:default/chat:AdaptiveScore"
        );
        assert_eq!(
            k.leases,
            "{higress:adaptive_score_inflight:default/chat:AdaptiveScore}:leases"
        );
        // A tag already in the name decides the slot for both keys.
        let t = InflightKeys::new("p:{x}", "r");
        assert_eq!(t.leases, "p:{x}:r:AdaptiveScore:leases");
        // `{}` is no tag: the whole name is.
        let e = InflightKeys::new("p{}", "r");
        assert_eq!(e.leases, "{p{}:r:AdaptiveScore}:leases");
    }

    #[test]
    fn acquire_call_layout() {
        let s = Scripts::new();
        let k = InflightKeys::new("p", "r");
        let cands = vec![("a".to_string(), 1.5), ("b".to_string(), f64::NAN)];
        let args = ServiceAcquireArgs {
            now_ms: 7,
            lease_ttl_ms: 8,
            key_ttl_s: 9,
            request_id: "rid",
            random: 3,
            reclaim: 4,
            candidates: &cands,
        };
        let q = acquire_call(&s, true, &k, &args);
        let Value::Array(Some(items)) = resp::decode_exact(&q).unwrap() else {
            panic!("not an array")
        };
        let words: Vec<&str> = items.iter().map(|v| v.as_str().unwrap()).collect();
        assert_eq!(words[0], "EVALSHA");
        assert_eq!(words[1], s.service_acquire.sha);
        assert_eq!(
            &words[2..],
            [
                "2",
                "p:r:AdaptiveScore",
                "{p:r:AdaptiveScore}:leases",
                "7",
                "8",
                "9",
                "rid",
                "3",
                "4",
                "a",
                "1.5",
                "b",
                "1.7976931348623157e308"
            ]
        );
    }

    #[test]
    fn acquire_replies() {
        assert_eq!(
            parse_acquire(b"*4\r\n$2\r\nOK\r\n$5\r\nllm-a\r\n:3\r\n$3\r\n1.5\r\n"),
            Ok(Some("llm-a".to_string()))
        );
        assert_eq!(parse_acquire(b"*1\r\n$5\r\nEMPTY\r\n"), Ok(None));
        assert_eq!(
            parse_acquire(b"-NOSCRIPT No matching script\r\n"),
            Err(ReplyError::NoScript)
        );
        assert!(matches!(
            parse_acquire(b":1\r\n"),
            Err(ReplyError::Malformed(_))
        ));
        assert!(matches!(
            parse_acquire(b"*1\r\n$2\r\nOK\r\n"),
            Err(ReplyError::Malformed(_))
        ));
    }
}
