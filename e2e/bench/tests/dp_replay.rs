//! The replay's data-parallel endpoints (`ailb-bench dp`): a router whose endpoints are ranks
//! sends each request to the rank's pod with `X-data-parallel-rank`, and that rank serves it;
//! `Bed::reset_pods` empties every rank, not only the first.

use ailb_bench::trace::mooncake;
use ailb_bench::trace::replay::{replay, Dispatch, Options, Router, Target};
use ailb_e2e::bed::Bed;
use std::sync::Arc;

const PODS: usize = 2;
const RANKS: usize = 4;

/// Request `i` to endpoint `i % 8`: rank `i % 4` of pod `(i % 8) / 4`.
struct EveryRank;

impl Router for EveryRank {
    fn pick(&self, d: &Dispatch<'_>) -> usize {
        d.index % (PODS * RANKS)
    }

    fn ranks_per_pod(&self) -> usize {
        RANKS
    }
}

#[test]
fn a_rank_endpoint_is_served_by_that_rank() {
    let path = ailb_e2e::repo_root().join("e2e/data/traces/mooncake-synthetic.jsonl");
    let mut rows = mooncake::read(&path).expect("the trace in e2e/data/traces");
    rows.truncate(24);
    let w = mooncake::workload("slice", &rows, 0.25, 0);
    let bed = Bed::new(PODS, |c| {
        c.dp_ranks = RANKS;
        c.block_tokens = 4;
        c.decode_us_per_token = 10;
        c.max_output_tokens = 1 << 20;
    });
    let records = bed.rt.block_on(replay(
        &w,
        &bed.pods,
        Target::Router(Arc::new(EveryRank)),
        Options::new(100.0),
    ));
    assert_eq!(records.len(), rows.len());
    for r in &records {
        assert_eq!(r.error, None, "request {}", r.index);
        let endpoint = r.index % (PODS * RANKS);
        assert_eq!(
            (r.pod, r.rank),
            (Some(endpoint / RANKS), Some(endpoint % RANKS)),
            "request {}",
            r.index
        );
    }
    let served = |bed: &Bed| -> Vec<u64> {
        bed.pods
            .iter()
            .flat_map(|p| p.state().ranks)
            .map(|k| k.requests_total + k.cache_blocks_used as u64)
            .collect()
    };
    assert!(served(&bed).iter().all(|&n| n > 0), "{:?}", served(&bed));
    bed.reset_pods();
    assert!(served(&bed).iter().all(|&n| n == 0), "{:?}", served(&bed));
}
