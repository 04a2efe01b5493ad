//! The data-parallel tests' bed, shared by both builds' tests (tests/e2e/data_parallel.rs in
//! the emulator, tests/e2e/envoy_data_parallel.rs in real Envoy): two fake pods of [`RANKS`]
//! ranks each, conversations sent through them, and where each answer was served as the
//! answer says it (the fake pod's `x-pod` and `x-fake-rank` headers, the plugin's debug
//! header's `endpoint=`, the cached prompt tokens its usage reports).

use crate::bed::Bed;
use crate::gateway::http;
use ailb_fakepod::EngineKind;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// DP ranks per fake pod.
pub const RANKS: usize = 4;

/// Two pods of `engine`'s dialect, [`RANKS`] ranks each.
pub fn bed(engine: EngineKind) -> Bed {
    Bed::new(2, |c| {
        c.engine = engine;
        c.dp_ranks = RANKS;
        c.max_running = 32;
        c.decode_us_per_token = 1_000;
        c.prefill_us_per_token = 10;
    })
}

/// Conversation `s` at its turn `turns` (1: the first): a system prompt, the earlier
/// exchanges, the next question.
pub fn conversation(s: usize, turns: usize) -> Value {
    let mut messages = vec![json!({"role": "system",
        "content": format!("You are assistant number {s}. {}", "Be concise. ".repeat(20))})];
    for t in 0..turns {
        messages.push(json!({"role": "user",
            "content": format!("conversation {s} question {t}: {}", "tell me more ".repeat(10))}));
        if t + 1 < turns {
            messages.push(json!({"role": "assistant", "content": format!("answer {t}")}));
        }
    }
    json!({"model": "fake-model", "messages": messages, "max_tokens": 2})
}

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

/// Conversations 0..8, turns 1 to 4 each through `urls` alternately, to pods `pod_addrs`
/// (`pod-<i>` at index i). Asserts that each keeps one (pod, rank) and that the debug header
/// names that rank of that pod (`ip:port@rank`); returns how many later turns found their
/// prefix cached, and the conversations' (pod, rank) homes.
pub fn conversations_on_ranks(
    urls: &[&str],
    pod_addrs: &[String],
) -> (usize, BTreeSet<(String, String)>) {
    let mut homes = BTreeSet::new();
    let mut later_hits = 0;
    for c in 0..8 {
        let seen: Vec<Served> = (1..=4)
            .map(|t| send_chat(urls[t % urls.len()], &conversation(c, t), &[]))
            .collect();
        let first = &seen[0];
        for x in &seen {
            let at = (&x.pod, &x.rank);
            assert_eq!(at, (&first.pod, &first.rank), "{c}: {seen:?}");
            let i: usize = x.pod.trim_start_matches("pod-").parse().unwrap();
            assert_eq!(x.endpoint, format!("{}@{}", pod_addrs[i], x.rank), "{x:?}");
        }
        later_hits += seen[1..].iter().filter(|x| x.cached > 0).count();
        homes.insert((first.pod.clone(), first.rank.clone()));
    }
    (later_hits, homes)
}

/// Whether some pod hosts two different ranks among `homes` (pod, rank): the ranks of one
/// pod are told apart. Sequential conversations on an idle fleet land where ties break (at
/// random, or by a ring over random ports): all 8 homes on one rank per pod has odds of about
/// 1e-5.
pub fn two_ranks_of_one_pod(homes: &BTreeSet<(String, String)>) -> bool {
    homes
        .iter()
        .any(|(p, r)| homes.iter().any(|(q, t)| p == q && r != t))
}

/// 8 long requests through `urls` alternately, one every 40 ms so that each pick sees the ones
/// before it counted, to pods `pod_addrs`; how many each (pod, rank) served. Asserts that the
/// plugin named each rank that served (a pod's own balancer spreads its ranks too).
pub fn held_per_rank(urls: &[&str], pod_addrs: &[String]) -> BTreeMap<(String, String), usize> {
    let slow = json!({"model": "m", "messages": [{"role": "user", "content": "hold"}],
        "max_tokens": 400});
    let mut held = Vec::new();
    for i in 0..8 {
        let (url, body) = (urls[i % urls.len()].to_string(), slow.clone());
        held.push(std::thread::spawn(move || send_chat(&url, &body, &[])));
        std::thread::sleep(Duration::from_millis(40));
    }
    let mut per_rank = BTreeMap::new();
    for h in held {
        let x = h.join().unwrap();
        let i: usize = x.pod.trim_start_matches("pod-").parse().unwrap();
        assert_eq!(x.endpoint, format!("{}@{}", pod_addrs[i], x.rank), "{x:?}");
        *per_rank.entry((x.pod, x.rank)).or_default() += 1;
    }
    per_rank
}
