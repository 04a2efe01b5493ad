//! Issue 39 item 4: a target metric broken down by a label, SGLang's KV pool gauges, and a
//! Prometheus 3 page with quoted names.

use super::*;

fn extra(name: &str) -> ExtraMetric {
    ExtraMetric {
        name: name.into(),
        aggregation: Aggregation::Sum,
    }
}

/// `vllm:num_requests_waiting_by_reason` splits each engine's queue by reason (vllm#38435):
/// the parts of one engine add up. Before, they were replicas of one value and max'ed, so a
/// pod with 3 + 4 queued read 4.
#[test]
fn a_target_metric_broken_down_by_a_label_sums_its_parts() {
    let page = "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 1\n\
                vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 7\n\
                vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 2\n\
                vllm:num_requests_waiting_by_reason{engine=\"0\",model_name=\"m\",reason=\"capacity\"} 3\n\
                vllm:num_requests_waiting_by_reason{engine=\"0\",model_name=\"m\",reason=\"preempted\"} 4\n\
                vllm:num_requests_waiting_by_reason{engine=\"1\",model_name=\"m\",reason=\"capacity\"} 2\n\
                vllm:num_requests_waiting_by_reason{engine=\"1\",model_name=\"m\",reason=\"preempted\"} 0\n";
    let x = extra("vllm:num_requests_waiting_by_reason");
    let m = scrape(page.as_bytes(), Some(&x)).0.unwrap();
    assert_eq!(m.extra, Some(9.0), "the sum of waiting over engines");
    assert_eq!(m.waiting, 9.0);
    // Replica labels (tensor-parallel ranks) of one part are still one value, max'ed.
    let tp = "sglang:num_running_reqs{dp_rank=\"0\",tp_rank=\"0\"} 1\n\
              q_by_priority{dp_rank=\"0\",priority=\"1\",tp_rank=\"0\"} 5\n\
              q_by_priority{dp_rank=\"0\",priority=\"1\",tp_rank=\"1\"} 5\n\
              q_by_priority{dp_rank=\"0\",priority=\"2\",tp_rank=\"0\"} 1\n";
    let m = scrape(tp.as_bytes(), Some(&extra("q_by_priority")))
        .0
        .unwrap();
    assert_eq!(m.extra, Some(6.0));
    assert_eq!(
        crate::model_metrics::read::breakdown_label("a_by_reason"),
        Some("reason")
    );
    assert_eq!(crate::model_metrics::read::breakdown_label("a_by_"), None);
    assert_eq!(
        crate::model_metrics::read::breakdown_label("vllm:num_requests_waiting"),
        None
    );
}

/// SGLang's current releases export the KV pool's page size and page count as gauges (one
/// series per scheduler, `sgl-project/sglang` `python/sglang/srt/observability/metrics_collector.py`).
#[test]
fn sglang_page_gauges_give_block_size_and_count() {
    let l = |rank: u32, tp: u32| format!("dp_rank=\"{rank}\",model_name=\"q\",tp_rank=\"{tp}\"");
    let mut page = String::new();
    for (name, v) in [
        ("sglang:num_running_reqs", 2),
        ("sglang:num_queue_reqs", 0),
        ("sglang:page_size", 16),
        ("sglang:num_pages", 62500),
    ] {
        for (rank, tp) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            page.push_str(&format!("{name}{{{}}} {v}\n", l(rank, tp)));
        }
    }
    let m = scrape(page.as_bytes(), None).0.unwrap();
    assert_eq!(m.block_size, Some(16));
    assert_eq!(
        m.num_gpu_blocks,
        Some(125_000),
        "per data-parallel rank, not per TP rank"
    );
}

/// A Prometheus 3 page with quoted names (`{"name",labels} value`): before, its first byte `{`
/// made it read as trtllm-serve's JSON and the pod never had metrics.
#[test]
fn a_prometheus_3_page_with_quoted_names_is_read() {
    let page = "# HELP \"vllm:num_requests_waiting\" Waiting.\n\
                # TYPE \"vllm:num_requests_waiting\" gauge\n\
                {\"vllm:num_requests_waiting\",engine=\"0\",model_name=\"x\"} 3\n\
                {\"vllm:num_requests_running\",engine=\"0\",model_name=\"x\"} 1\n\
                {\"vllm:kv_cache_usage_perc\",engine=\"0\",model_name=\"x\"} 0.25\n";
    for body in [page, page.split_once("gauge\n").unwrap().1] {
        assert!(!looks_like_json(body.as_bytes()), "{body}");
        let out = scrape_page(body.as_bytes(), 1 << 20, None);
        let m = out.result.unwrap();
        assert_eq!((m.waiting, m.running, m.kv_usage), (3.0, 1.0, Some(0.25)));
        assert_eq!(out.stats.malformed, 0);
    }
    for json in ["{}", "{ }", "{\"a\":1}", " {\"a\\\"\" : []}", "[1]"] {
        assert!(looks_like_json(json.as_bytes()), "{json}");
    }
}
