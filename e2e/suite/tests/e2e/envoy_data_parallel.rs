//! Data-parallel ranks in real Envoy 1.40 (plain-Envoy build; docs/plain-envoy.md): two fake
//! pods of four DP ranks each behind `endpoints`, `dataParallelSize: 4`. The override_host
//! header names pods, the rank rides in `X-data-parallel-rank`; conversations keep their rank
//! across two proxies that share nothing, and least request counts per rank.

use ailb_e2e::bed::Bed;
use ailb_e2e::envoy::Envoy;
use ailb_e2e::served::{send_chat, Served};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const RANKS: usize = 4;

fn bed() -> Bed {
    Bed::new(2, |c| {
        c.dp_ranks = RANKS;
        c.max_running = 32;
        c.decode_us_per_token = 1_000;
        c.prefill_us_per_token = 10;
    })
}

fn plugin(pods: &[String], policy: &str) -> Value {
    json!({"lb_policy": policy, "lb_config": {"endpoints": pods,
        "debugHeader": "x-ai-lb-debug", "dataParallelSize": RANKS}})
}

fn turn(c: usize, turns: usize) -> Value {
    let mut messages = vec![json!({"role": "system",
        "content": format!("Assistant {c}. {}", "Answer briefly. ".repeat(20))})];
    for t in 0..turns {
        messages.push(json!({"role": "user", "content": format!("c{c} question {t}")}));
        if t + 1 < turns {
            messages.push(json!({"role": "assistant", "content": format!("answer {t}")}));
        }
    }
    json!({"model": "m", "messages": messages, "max_tokens": 2})
}

#[test]
fn envoy_conversations_keep_their_rank_across_two_proxies() {
    let bed = bed();
    let pods = bed.pod_addrs();
    let envoys = [
        Envoy::start(&pods, &plugin(&pods, "prefix_cache")),
        Envoy::start(&pods, &plugin(&pods, "prefix_cache")),
    ];
    let mut homes = BTreeSet::new();
    let mut later_hits = 0;
    for c in 0..8 {
        let seen: Vec<Served> = (1..=4)
            .map(|t| send_chat(&envoys[t % 2].url, &turn(c, t), &[]))
            .collect();
        let first = &seen[0];
        for x in &seen {
            assert_eq!(
                (&x.pod, &x.rank),
                (&first.pod, &first.rank),
                "{c}: {seen:?}"
            );
            assert!(x.endpoint.ends_with(&format!("@{}", x.rank)), "{x:?}");
        }
        later_hits += seen[1..].iter().filter(|x| x.cached > 0).count();
        homes.insert((first.pod.clone(), first.rank.clone()));
    }
    assert_eq!(
        later_hits, 24,
        "every later turn found its prefix on its rank"
    );
    // The ring places new conversations by their hash over random ports: what must hold is
    // that ranks of one pod are told apart.
    assert!(
        super::data_parallel::two_ranks_of_one_pod(&homes),
        "8 conversations over 8 ranks: {homes:?}"
    );
}

#[test]
fn envoy_least_request_fills_every_rank_before_doubling_one() {
    let bed = bed();
    let pods = bed.pod_addrs();
    let envoy = Envoy::start(&pods, &plugin(&pods, "global_least_request"));
    let slow = json!({"model": "m", "messages": [{"role": "user", "content": "hold"}],
        "max_tokens": 400});
    let mut held = Vec::new();
    for _ in 0..8 {
        let (url, body) = (envoy.url.clone(), slow.clone());
        held.push(std::thread::spawn(move || send_chat(&url, &body, &[])));
        std::thread::sleep(Duration::from_millis(40));
    }
    let mut per_rank: BTreeMap<(String, String), usize> = BTreeMap::new();
    for h in held {
        let x = h.join().unwrap();
        *per_rank.entry((x.pod, x.rank)).or_default() += 1;
    }
    assert_eq!(per_rank.len(), 8, "one request on each rank: {per_rank:?}");
}
