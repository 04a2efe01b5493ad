//! Data-parallel ranks as endpoints (issue 49; docs/configuration.md `dataParallelSize`): the
//! built plugin in two emulator gateways, one real redis-server, two fake pods of four DP ranks
//! each (every rank its own queue and prefix cache, the rank read from `X-data-parallel-rank`
//! as vLLM reads it; the pod names the rank that served in `x-fake-rank`).

use ailb_e2e::bed::{wait_for_zero, Bed};
use ailb_e2e::gateway::Gateway;
use ailb_e2e::served::{send_chat as send, Served};
use ailb_fakepod::EngineKind;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const RANKS: usize = 4;

fn bed(engine: EngineKind) -> Bed {
    Bed::new(2, |c| {
        c.engine = engine;
        c.dp_ranks = RANKS;
        c.max_running = 32;
        c.decode_us_per_token = 1_000;
        c.prefill_us_per_token = 10;
    })
}

fn config(port: u16, policy: &str, extra: Value) -> Value {
    let mut lb = json!({"serviceFQDN": "redis.static", "servicePort": port, "timeout": 1000,
        "debugHeader": "x-ai-lb-debug"});
    if let (Some(lb), Some(extra)) = (lb.as_object_mut(), extra.as_object()) {
        lb.extend(extra.clone());
    }
    json!({"lb_policy": policy, "lb_config": lb})
}

fn gateways(bed: &Bed, policy: &str, extra: Value) -> (Gateway, Gateway) {
    let cfg = config(bed.redis.port, policy, extra);
    (
        bed.gateway(&bed.spec("dp-a", Some(cfg.clone()))),
        bed.gateway(&bed.spec("dp-b", Some(cfg))),
    )
}

/// Whether some pod hosts two different ranks among `homes` (pod, rank).
pub fn two_ranks_of_one_pod(homes: &BTreeSet<(String, String)>) -> bool {
    homes
        .iter()
        .any(|(p, r)| homes.iter().any(|(q, t)| p == q && r != t))
}

fn conversation(s: usize, turns: usize) -> Value {
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

/// Each conversation keeps one (pod, rank) across both gateways, its later turns hit that
/// rank's cache, the debug header names the rank the pod says served, and the conversations
/// spread over the ranks; nothing is left counted.
#[test]
fn conversations_keep_their_rank_across_gateways() {
    let bed = bed(EngineKind::VllmV1);
    let addrs = bed.pod_addrs();
    let (a, b) = gateways(&bed, "prefix_cache", json!({"dataParallelSize": RANKS}));
    let mut homes = BTreeSet::new();
    let mut later_hits = 0;
    for s in 0..8 {
        let mut seen = Vec::new();
        for t in 1..=4 {
            let gw = if t % 2 == 0 { &a } else { &b };
            seen.push(send(&gw.url, &conversation(s, t), &[]));
        }
        let first = &seen[0];
        for x in &seen {
            assert_eq!(
                (&x.pod, &x.rank),
                (&first.pod, &first.rank),
                "{s}: {seen:?}"
            );
            let pod_addr = &addrs[x.pod.trim_start_matches("pod-").parse::<usize>().unwrap()];
            assert_eq!(x.endpoint, format!("{pod_addr}@{}", x.rank), "{x:?}");
        }
        later_hits += seen[1..].iter().filter(|x| x.cached > 0).count();
        homes.insert((first.pod.clone(), first.rank.clone()));
    }
    assert_eq!(
        later_hits, 24,
        "every later turn found its prefix on its rank"
    );
    // Sequential conversations on an idle fleet break ties at random: what must hold is that
    // ranks of one pod are told apart (all 8 homes on one rank per pod: odds about 1e-5).
    assert!(
        two_ranks_of_one_pod(&homes),
        "8 conversations over 8 ranks: {homes:?}"
    );
    assert!(wait_for_zero(&bed, Duration::from_secs(5)).is_zero());
}

/// global_least_request counts per rank: requests held in flight at once take the ranks one
/// by one (a rank-blind pick would count two pods and leave the ranks to each pod).
#[test]
fn least_request_fills_every_rank_before_doubling_one() {
    let bed = bed(EngineKind::VllmV1);
    let (a, b) = gateways(
        &bed,
        "global_least_request",
        json!({"dataParallelSize": RANKS}),
    );
    let urls = [a.url.clone(), b.url.clone()];
    let slow = json!({"model": "m", "messages": [{"role": "user", "content": "hold"}],
        "max_tokens": 400});
    let mut held = Vec::new();
    for i in 0..8 {
        let url = urls[i % 2].clone();
        let body = slow.clone();
        held.push(std::thread::spawn(move || send(&url, &body, &[])));
        // One pick at a time: each sees the ones before it counted.
        std::thread::sleep(Duration::from_millis(40));
    }
    let served: Vec<Served> = held.into_iter().map(|h| h.join().unwrap()).collect();
    let mut per_rank: BTreeMap<(String, String), usize> = BTreeMap::new();
    for s in &served {
        *per_rank.entry((s.pod.clone(), s.rank.clone())).or_default() += 1;
    }
    assert_eq!(per_rank.len(), 8, "one request on each rank: {per_rank:?}");
    assert!(wait_for_zero(&bed, Duration::from_secs(5)).is_zero());
}

/// The rank is the plugin's: a client's rank header is replaced; SGLang's body field goes
/// along under `dataParallelRank: body`, with a valid body the pod serves.
#[test]
fn the_rank_is_the_plugins_in_header_and_body() {
    let bed = bed(EngineKind::Sglang);
    let (a, _b) = gateways(
        &bed,
        "prefix_cache",
        json!({"dataParallelSize": RANKS, "dataParallelRank": "body"}),
    );
    let mut ranks = BTreeSet::new();
    for s in 0..8 {
        let x = send(
            &a.url,
            &conversation(100 + s, 1),
            &[("X-Data-Parallel-Rank", "3")],
        );
        assert!(x.endpoint.ends_with(&format!("@{}", x.rank)), "{x:?}");
        ranks.insert(x.rank);
    }
    assert!(
        ranks.len() >= 3,
        "not the client's rank 3 each time: {ranks:?}"
    );
    assert!(wait_for_zero(&bed, Duration::from_secs(5)).is_zero());
}

/// Without `dataParallelSize` the plugin names pods only and leaves the rank to the pod
/// (and to a client that sends one).
#[test]
fn without_the_key_ranks_are_the_pods_business() {
    let bed = bed(EngineKind::VllmV1);
    let (a, _b) = gateways(&bed, "prefix_cache", json!({}));
    let x = send(
        &a.url,
        &conversation(0, 1),
        &[("X-Data-Parallel-Rank", "2")],
    );
    assert_eq!(x.rank, "2", "the client's header passed through");
    assert!(!x.endpoint.contains('@'), "{x:?}");
    assert!(wait_for_zero(&bed, Duration::from_secs(5)).is_zero());
}

/// A pod marked unhealthy takes all its ranks out: its conversations move to the other pod's
/// ranks, spread over them, and each keeps its new rank from then on.
#[test]
fn an_unhealthy_pod_takes_its_ranks_out_and_its_conversations_settle_on_the_others() {
    let bed = bed(EngineKind::VllmV1);
    let (a, b) = gateways(&bed, "prefix_cache", json!({"dataParallelSize": RANKS}));
    let mut first_home = Vec::new();
    for s in 0..8 {
        first_home.push(send(&a.url, &conversation(200 + s, 1), &[]));
    }
    let gone = bed.mark_unhealthy("pod-0", &[&a, &b]);
    let mut ranks = BTreeSet::new();
    for (s, home) in first_home.iter().enumerate() {
        let seen: Vec<Served> = (2..=4)
            .map(|t| send([&a.url, &b.url][t % 2], &conversation(200 + s, t), &[]))
            .collect();
        for x in &seen {
            assert_eq!(x.pod, "pod-1", "{home:?} then {seen:?}");
            assert!(!x.endpoint.starts_with(&gone), "{x:?}");
            assert_eq!((&x.pod, &x.rank), (&seen[0].pod, &seen[0].rank), "{seen:?}");
        }
        ranks.insert(seen[0].rank.clone());
    }
    // Ties go at random: all 8 on one of 4 ranks has odds under 1e-4.
    assert!(ranks.len() >= 2, "spread over pod-1's ranks: {ranks:?}");
    assert!(wait_for_zero(&bed, Duration::from_secs(5)).is_zero());
}
