//! Data-parallel ranks as endpoints (issue 49; docs/disaggregated-serving.md §5): a pod that
//! runs N DP ranks behind one port holds N caches and N queues, so each (pod, rank) is an
//! endpoint of its own, named `ip:port@rank` (sgl-router's dp-aware naming, `host:port@rank`).
//! Every policy then counts, leases, keys prefixes and binds sessions per rank with no change
//! and no extra Redis round trip; only the publish step turns a rank endpoint back into its
//! pod's address plus the rank, sent the way the engine reads it.

/// `ip:port@rank` → (`ip:port`, Some(rank)); any other name → (itself, None).
pub fn split(endpoint: &str) -> (&str, Option<u16>) {
    match endpoint.rsplit_once('@') {
        Some((pod, rank)) if !pod.is_empty() => match rank.parse::<u16>() {
            Ok(r) => (pod, Some(r)),
            Err(_) => (endpoint, None),
        },
        _ => (endpoint, None),
    }
}

/// The pod of an endpoint name: itself, or a rank endpoint's `ip:port`.
pub fn pod(endpoint: &str) -> &str {
    split(endpoint).0
}

/// `pods`, each as its `size` rank endpoints in rank order; `size` ≤ 1: the pods themselves,
/// as they are (every host-list read of a route without ranks goes through here).
pub fn expand(pods: Vec<String>, size: u16) -> Vec<String> {
    if size <= 1 {
        return pods;
    }
    let mut out = Vec::with_capacity(pods.len() * size as usize);
    for p in &pods {
        for r in 0..size {
            out.push(format!("{p}@{r}"));
        }
    }
    out
}

/// `served` (an `ip:port` the host reports) as the endpoint it stands for when `chosen` was a
/// rank endpoint: the host's retry sent the same request, rank header and all, to `served`.
pub fn same_rank(served: &str, chosen: &str) -> String {
    match split(chosen).1 {
        Some(r) => format!("{served}@{r}"),
        None => served.to_string(),
    }
}

/// SGLang's body field for the rank (`routed_dp_rank`).
pub const RANK_FIELD: &str = "routed_dp_rank";

/// The JSON object `body` with `"routed_dp_rank": rank` appended as its last member; None when
/// `body` is not an object (the rank then goes by header only). Appended, not parsed and
/// rewritten: the prompt's bytes stay as sent, and a client's own `routed_dp_rank` earlier in
/// the object loses, as Python's `json` keeps a repeated key's last value.
pub fn with_rank_field(body: &[u8], rank: u16) -> Option<Vec<u8>> {
    let start = body.iter().position(|b| !b.is_ascii_whitespace())?;
    let end = body.iter().rposition(|b| !b.is_ascii_whitespace())?;
    if body[start] != b'{' || body[end] != b'}' || end == start {
        return None;
    }
    let empty = body[start + 1..end].iter().all(|b| b.is_ascii_whitespace());
    let mut out = Vec::with_capacity(body.len() + 24);
    out.extend_from_slice(&body[..end]);
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(format!("\"{RANK_FIELD}\":{rank}}}").as_bytes());
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_endpoint_splits_into_its_pod_and_rank_and_other_names_stay_whole() {
        assert_eq!(split("10.0.0.1:8000@3"), ("10.0.0.1:8000", Some(3)));
        assert_eq!(split("[::1]:8000@0"), ("[::1]:8000", Some(0)));
        assert_eq!(split("10.0.0.1:8000"), ("10.0.0.1:8000", None));
        assert_eq!(split("10.0.0.1:8000@x"), ("10.0.0.1:8000@x", None));
        assert_eq!(split("@3"), ("@3", None));
        assert_eq!(split("outbound|80||svc"), ("outbound|80||svc", None));
        assert_eq!(pod("10.0.0.1:8000@70000"), "10.0.0.1:8000@70000");
    }

    #[test]
    fn pods_expand_to_their_ranks_in_order_and_size_one_is_the_pods() {
        let pods = vec!["a:1".to_string(), "b:1".to_string()];
        assert_eq!(expand(pods.clone(), 1), pods);
        assert_eq!(expand(pods.clone(), 0), pods);
        assert_eq!(
            expand(pods.clone(), 2),
            vec!["a:1@0", "a:1@1", "b:1@0", "b:1@1"]
        );
        for e in expand(pods.clone(), 12) {
            assert!(pods.contains(&pod(&e).to_string()), "{e}");
        }
    }

    #[test]
    fn the_served_pod_takes_the_chosen_rank() {
        assert_eq!(same_rank("b:1", "a:1@2"), "b:1@2");
        assert_eq!(same_rank("b:1", "a:1"), "b:1");
    }

    #[test]
    fn the_rank_field_is_the_objects_last_member_and_only_objects_take_it() {
        let out = with_rank_field(br#"{"model":"m","routed_dp_rank":7,"prompt":"x"} "#, 2);
        assert_eq!(
            out.as_deref(),
            Some(&br#"{"model":"m","routed_dp_rank":7,"prompt":"x","routed_dp_rank":2}"#[..])
        );
        // What a Python server reads: the last of a repeated key.
        let v: serde_json::Value =
            serde_json::from_slice(&out.unwrap_or_default()).unwrap_or_default();
        assert_eq!(v["routed_dp_rank"], 2);
        assert_eq!(
            with_rank_field(b" { } ", 1).as_deref(),
            Some(&br#" { "routed_dp_rank":1}"#[..])
        );
        assert_eq!(with_rank_field(b"[1,2]", 1), None);
        assert_eq!(with_rank_field(b"{", 1), None);
        assert_eq!(with_rank_field(b"", 1), None);
        assert_eq!(with_rank_field(b"  ", 1), None);
    }
}
