//! Data-parallel ranks in real Envoy 1.40 (plain-Envoy build; docs/plain-envoy.md): two fake
//! pods of four DP ranks each behind `endpoints`, `dataParallelSize: 4`. The override_host
//! header names pods, the rank rides in `X-data-parallel-rank`; conversations keep their rank
//! across two proxies that share nothing, and least request counts per rank.

use ailb_e2e::data_parallel::{
    bed, conversations_on_ranks, held_per_rank, two_ranks_of_one_pod, RANKS,
};
use ailb_e2e::envoy::Envoy;
use ailb_fakepod::EngineKind;
use serde_json::{json, Value};

fn plugin(pods: &[String], policy: &str) -> Value {
    json!({"lb_policy": policy, "lb_config": {"endpoints": pods,
        "debugHeader": "x-ai-lb-debug", "dataParallelSize": RANKS}})
}

#[test]
fn envoy_conversations_keep_their_rank_across_two_proxies() {
    let bed = bed(EngineKind::VllmV1);
    let pods = bed.pod_addrs();
    let envoys = [
        Envoy::start(&pods, &plugin(&pods, "prefix_cache")),
        Envoy::start(&pods, &plugin(&pods, "prefix_cache")),
    ];
    let (later_hits, homes) = conversations_on_ranks(&[&envoys[0].url, &envoys[1].url], &pods);
    assert_eq!(
        later_hits, 24,
        "every later turn found its prefix on its rank"
    );
    assert!(
        two_ranks_of_one_pod(&homes),
        "8 conversations over 8 ranks: {homes:?}"
    );
}

#[test]
fn envoy_least_request_fills_every_rank_before_doubling_one() {
    let bed = bed(EngineKind::VllmV1);
    let pods = bed.pod_addrs();
    let envoy = Envoy::start(&pods, &plugin(&pods, "global_least_request"));
    let per_rank = held_per_rank(&[&envoy.url], &pods);
    assert_eq!(per_rank.len(), 8, "one request on each rank: {per_rank:?}");
}
