//! llama.cpp's dialect (docs/model-server-metrics.md §1.5): real pages captured from
//! `llama-server --metrics` (`testdata/llamacpp-*`, tools/llama/capture-metrics.py), damaged and
//! partial pages, and how the scheduler treats a pod without a KV reading.

use super::engines::{self, EndpointMetrics, MapError, ModelServer, Unknown};
use super::scheduler::{select, Candidate, Decision, MetricPolicy, RequestInfo, SchedulerConfig};
use super::SplitMix64;

/// Two slots busy, two requests deferred (4 long requests at once on `-np 2`).
const BUSY: &str = include_str!("testdata/llamacpp-pypi11434-busy.txt");
/// The same server after those requests finished.
const IDLE: &str = include_str!("testdata/llamacpp-pypi11434-idle.txt");

fn map(text: &str) -> Result<EndpointMetrics, MapError> {
    engines::scrape(text.as_bytes(), None).0
}

/// The value of the page's one `name` series, read by a plain line scan (not the parser).
fn page_value(text: &str, name: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("{name} not on the page"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn real_pages_map_deferred_to_waiting_and_processing_to_running() {
    for (page, waiting, running) in [(BUSY, 2.0, 2.0), (IDLE, 0.0, 0.0)] {
        let m = map(page).unwrap();
        assert_eq!(m.engine, ModelServer::LlamaCpp);
        assert_eq!(m.waiting, page_value(page, "llamacpp:requests_deferred"));
        assert_eq!(m.running, page_value(page, "llamacpp:requests_processing"));
        assert_eq!((m.waiting, m.running), (waiting, running));
        assert_eq!(m.kv_usage, None, "llama.cpp exports no KV-use gauge");
        assert_eq!((m.prefix_hit_rate, m.prefix_cache_counters), (None, None));
        assert_eq!(
            (m.block_size, m.num_gpu_blocks, m.dp_groups),
            (None, None, 1)
        );
        assert_eq!(m.lora, None);
    }
}

#[test]
fn detected_by_either_load_gauge_alone() {
    let m = map("llamacpp:requests_deferred 3\n").unwrap();
    assert_eq!(
        (m.engine, m.waiting, m.running),
        (ModelServer::LlamaCpp, 3.0, 0.0)
    );
    let m =
        map("# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n").unwrap();
    assert_eq!(
        (m.engine, m.waiting, m.running),
        (ModelServer::LlamaCpp, 0.0, 1.0)
    );
    // Only counters the mapping does not read: no engine, as for any unknown page.
    assert_eq!(
        map("llamacpp:prompt_tokens_total 5\nllamacpp:n_decode_total 9\n"),
        Err(MapError::UnknownEngine)
    );
}

#[test]
fn garbage_values_make_the_pod_unknown_never_idle() {
    for bad in ["NaN", "+Inf", "-1", "1e12"] {
        for name in ["llamacpp:requests_deferred", "llamacpp:requests_processing"] {
            let page = BUSY.replace(&format!("{name} 2"), &format!("{name} {bad}"));
            assert_ne!(page, BUSY);
            let s = engines::scrape(page.as_bytes(), None);
            assert_eq!(
                s.0,
                Err(MapError::LoadUnknown(ModelServer::LlamaCpp)),
                "{name} {bad}"
            );
        }
    }
    let page = BUSY.replace(
        "llamacpp:requests_deferred 2",
        "llamacpp:requests_deferred{ 2",
    );
    assert_eq!(
        map(&page),
        Err(MapError::LoadUnknown(ModelServer::LlamaCpp))
    );
    for junk in [
        "",
        "\0\0\0",
        "llamacpp:requests_deferred\n",
        "<html>502</html>",
    ] {
        assert!(map(junk).is_err(), "{junk:?}");
    }
}

#[test]
fn a_page_cut_before_or_inside_the_gauges_is_unknown() {
    let at = BUSY.find("llamacpp:requests_deferred 2").unwrap();
    // Cut inside the deferred line: processing is whole (so the engine is known), deferred not.
    let s = engines::scrape_page(&BUSY.as_bytes()[..at + 5], at + 5, None);
    assert_eq!(s.result, Err(MapError::LoadUnknown(ModelServer::LlamaCpp)));
    assert!(
        s.unknown.iter().any(|u| u.why == Unknown::Cut),
        "{:?}",
        s.unknown
    );
    // Cut among the counters, before both gauges: no engine can be told.
    let s = engines::scrape_page(&BUSY.as_bytes()[..at / 2], at / 2, None);
    assert_eq!(s.result, Err(MapError::UnknownEngine));
    let s = engines::scrape_page(BUSY.as_bytes(), BUSY.len() + 1, None);
    assert_eq!(s.result, map(BUSY));
}

fn pods(pages: &[&str]) -> Vec<Candidate> {
    pages
        .iter()
        .enumerate()
        .map(|(i, p)| Candidate {
            addr: format!("10.0.0.{i}:8080"),
            metrics: map(p).ok(),
            in_flight_since_scrape: 0,
        })
        .collect()
}

fn decide(c: &[Candidate], sheddable: bool, cfg: &SchedulerConfig) -> Decision {
    let req = RequestInfo {
        model: "m",
        lora_adapter: None,
        sheddable,
    };
    let mut r = SplitMix64(51);
    select(c, &req, cfg, None, &mut || r.next_u64())
}

/// No KV reading is "no KV signal": the pod is neither saturated (it is shed only by its
/// queue) nor preferred as an empty cache; the queue decides.
#[test]
fn missing_kv_is_neither_saturated_nor_empty() {
    let mut cfg = SchedulerConfig::default();
    let c = pods(&[BUSY, IDLE]);
    for policy in [MetricPolicy::Default, MetricPolicy::Weighted] {
        cfg.policy = policy;
        for sheddable in [false, true] {
            let d = decide(&c, sheddable, &cfg);
            assert_eq!(
                d,
                Decision::Pick {
                    index: 1,
                    rate_limited: false
                },
                "{policy:?}"
            );
        }
    }
    cfg.policy = MetricPolicy::Default;
    cfg.queue_threshold_critical = 1.0;
    assert_eq!(
        decide(&pods(&[BUSY]), true, &cfg),
        Decision::Shed,
        "a deep queue sheds"
    );
    assert!(matches!(
        decide(&pods(&[IDLE]), true, &cfg),
        Decision::Pick { .. }
    ));
    // Next to a vLLM pod with a nearly full cache and the same empty queue, the llama.cpp pod
    // counts as the fullest known cache, not as an empty one.
    let vllm =
        "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0.7\n";
    let idle_vllm =
        "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0.1\n";
    let c = pods(&[IDLE, vllm, idle_vllm]);
    assert_eq!(
        decide(&c, false, &cfg),
        Decision::Pick {
            index: 2,
            rate_limited: false
        }
    );
    // Nor is it left out: with only the fuller vLLM pod beside it, both are picked.
    let c = pods(&[IDLE, vllm]);
    let mut seen = [false; 2];
    for seed in 0..64u64 {
        let mut r = SplitMix64(seed);
        let req = RequestInfo {
            model: "m",
            lora_adapter: None,
            sheddable: false,
        };
        if let Decision::Pick { index, .. } = select(&c, &req, &cfg, None, &mut || r.next_u64()) {
            seen[index] = true;
        }
    }
    assert_eq!(seen, [true, true]);
}
