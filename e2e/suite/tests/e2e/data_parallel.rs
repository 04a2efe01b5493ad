//! Data-parallel ranks as endpoints (issue 49; docs/configuration.md `dataParallelSize`): the
//! built plugin in two emulator gateways, one real redis-server, two fake pods of four DP ranks
//! each (every rank its own queue and prefix cache, the rank read from `X-data-parallel-rank`
//! as vLLM reads it; the pod names the rank that served in `x-fake-rank`).

use ailb_e2e::bed::{wait_for_zero, Bed};
use ailb_e2e::data_parallel::{
    bed, conversation, conversations_on_ranks, held_per_rank, send_chat as send,
    two_ranks_of_one_pod, Served, RANKS,
};
use ailb_e2e::gateway::Gateway;
use ailb_fakepod::EngineKind;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;

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

/// Each conversation keeps one (pod, rank) across both gateways, its later turns hit that
/// rank's cache, the debug header names the rank the pod says served, and the conversations
/// spread over the ranks; nothing is left counted.
#[test]
fn conversations_keep_their_rank_across_gateways() {
    let bed = bed(EngineKind::VllmV1);
    let (a, b) = gateways(&bed, "prefix_cache", json!({"dataParallelSize": RANKS}));
    let (later_hits, homes) = conversations_on_ranks(&[&a.url, &b.url], &bed.pod_addrs());
    assert_eq!(
        later_hits, 24,
        "every later turn found its prefix on its rank"
    );
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
    let per_rank = held_per_rank(&[&a.url, &b.url], &bed.pod_addrs());
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
    // Ties go at random over 4 ranks: all 8 on one has odds under 1e-4; with the client's
    // header obeyed every one would be rank 3.
    assert!(
        ranks.len() >= 2,
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
