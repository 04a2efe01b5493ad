//! The trace replay is faithful (docs/trace-bench.md): the first 60 rows of the Mooncake
//! synthetic trace, heavily time-compressed, through the plugin (Higress build, Redis, one
//! emulator gateway) to one engine-like pod.
//!
//! * Requests whose `hash_ids` share a leading run share exactly that many blocks of prompt
//!   bytes, and differ right after.
//! * The pod's `cached_tokens` (read from the last SSE chunk) match an offline simulation of an
//!   unbounded cache over the same prompts (the pod never evicts here): request by request for
//!   all but the few whose order two simultaneous arrivals may swap, and in total.

use ailb_bench::trace::infinite::infinite_cached;
use ailb_bench::trace::mooncake::{self, Row};
use ailb_bench::trace::replay::{replay, Options, Target};
use ailb_bench::trace::workload::Dialogue;
use ailb_e2e::bed::Bed;
use ailb_e2e::gateway::Gateway;
use serde_json::json;

const ROWS: usize = 60;
const TOKEN_SCALE: f64 = 0.25;
/// 17 s of trace in about 0.2 s.
const TIME_SCALE: f64 = 100.0;

fn rows() -> Vec<Row> {
    let path = ailb_e2e::repo_root().join("e2e/data/traces/mooncake-synthetic.jsonl");
    let mut rows = mooncake::read(&path).expect("the trace in e2e/data/traces");
    rows.truncate(ROWS);
    rows
}

fn common_prefix(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

#[test]
fn shared_hash_ids_are_shared_bytes_and_nothing_more() {
    let rows = rows();
    let w = mooncake::workload("slice", &rows, TOKEN_SCALE, 0);
    let texts: Vec<String> = w
        .conversations
        .iter()
        .map(|c| Dialogue::new(c).next_request().expect("one turn").canonical)
        .collect();
    let block_bytes = (512.0 * TOKEN_SCALE) as usize * 4;
    let mut shared_pairs = 0;
    for i in 0..rows.len() {
        for j in i + 1..rows.len() {
            let (a, b) = (&rows[i].hash_ids, &rows[j].hash_ids);
            let lead = a.iter().zip(b).take_while(|(x, y)| x == y).count();
            // "user\n" then the blocks: full shared blocks are shared bytes.
            let want = "user\n".len() + lead * block_bytes;
            let got = common_prefix(&texts[i], &texts[j]);
            let full_blocks = lead < a.len() && lead < b.len();
            if full_blocks {
                // Different next ids: the texts part within the next block (two generated
                // blocks agreeing on their first word is possible, on 64 bytes is not).
                assert!(
                    got >= want && got < want + 64,
                    "rows {i} and {j}: {lead} shared ids, {got} shared bytes, want {want}"
                );
            } else {
                assert!(got >= want.min(texts[i].len().min(texts[j].len()) - 1));
            }
            shared_pairs += usize::from(lead > 0);
        }
    }
    assert!(shared_pairs > 0, "the slice has shared prefixes to check");
}

#[test]
fn one_pod_reports_what_the_simulation_predicts() {
    let rows = rows();
    let w = mooncake::workload("slice", &rows, TOKEN_SCALE, 0);
    let bed = Bed::new(1, |c| {
        c.block_tokens = 4;
        c.kv_capacity_tokens = 1 << 24;
        c.cache_blocks = 1 << 22;
        c.prefill_tokens_per_s = 100_000.0 * TIME_SCALE;
        c.decode_us_per_token = 10;
        c.stream_interval = 16;
        c.max_output_tokens = 1 << 20;
    });
    let plugin = json!({"lb_policy": "prefix_cache", "lb_config": {
        "serviceFQDN": "redis.static", "servicePort": bed.redis.port, "timeout": 1000}});
    let gw = Gateway::start(&bed.spec("trace-test", Some(plugin))).expect("gateway");
    let records = bed.rt.block_on(replay(
        &w,
        &bed.pods,
        Target::Urls(vec![gw.url.clone()]),
        Options::new(TIME_SCALE),
    ));
    let want = infinite_cached(&w, 4);
    assert_eq!(records.len(), want.len());
    let mut same = 0;
    let (mut got_total, mut want_total) = (0, 0);
    for (r, (prompt, cached)) in records.iter().zip(&want) {
        assert_eq!(r.error, None, "request {}", r.index);
        assert_eq!(r.prompt_tokens, *prompt, "request {}", r.index);
        same += usize::from(r.cached_tokens == *cached);
        got_total += r.cached_tokens;
        want_total += cached;
    }
    assert!(want_total > 0, "the slice reuses prefixes");
    assert!(
        same + 3 >= records.len(),
        "{same} of {} as simulated",
        records.len()
    );
    let diff = got_total.abs_diff(want_total) as f64 / want_total as f64;
    assert!(
        diff < 0.02,
        "cached tokens {got_total} vs simulated {want_total}"
    );
    assert_eq!(gw.stat("ai_lb.prefix.routed") as usize, records.len());
}
