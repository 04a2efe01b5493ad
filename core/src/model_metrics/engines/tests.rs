use super::*;

fn map(text: &str) -> Result<EndpointMetrics, MapError> {
    scrape(text.as_bytes(), None).0
}

fn approx(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// vLLM V1 with two data-parallel engines (labels sorted as prometheus_client does).
const VLLM_V1_DP: &str = r#"# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:num_requests_running{engine="1",model_name="llama"} 5.0
vllm:num_requests_waiting{engine="0",model_name="llama"} 2.0
vllm:num_requests_waiting{engine="1",model_name="llama"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.6
vllm:gpu_cache_usage_perc{engine="0",model_name="llama"} 0.99
vllm:prefix_cache_queries_total{engine="0",model_name="llama"} 1000.0
vllm:prefix_cache_queries_created{engine="0",model_name="llama"} 1.75e+09
vllm:prefix_cache_hits_total{engine="0",model_name="llama"} 250.0
vllm:prefix_cache_hits_created{engine="0",model_name="llama"} 1.75e+09
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="33676"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="33676"} 1.0
"#;

#[test]
fn vllm_v1_data_parallel_sums_queues_and_averages_kv() {
    let m = map(VLLM_V1_DP).unwrap();
    assert_eq!(m.engine, ModelServer::Vllm);
    assert_eq!(m.waiting, 9.0);
    assert_eq!(m.running, 8.0);
    assert_eq!(m.dp_groups, 2);
    assert!(
        approx(m.kv_usage.unwrap(), 0.4),
        "new name wins over deprecated"
    );
    assert!(approx(m.prefix_hit_rate.unwrap(), 0.25), "_created ignored");
    assert_eq!(m.prefix_cache_counters, Some((250.0, 1000.0)));
    assert_eq!((m.block_size, m.num_gpu_blocks), (Some(16), Some(33676)));
    assert_eq!(m.lora, None, "no LoRA family: None, endpoint still usable");
}

#[test]
fn vllm_multi_model_and_replica_labels() {
    let text = r#"vllm:num_requests_waiting{model_name="a"} 1
vllm:num_requests_waiting{model_name="b"} 2
vllm:num_requests_running{model_name="a",tp_rank="0"} 4
vllm:num_requests_running{model_name="a",tp_rank="1"} 4
vllm:num_requests_running{model_name="b"} 0
"#;
    let m = map(text).unwrap();
    assert_eq!(m.waiting, 3.0, "model_name series summed");
    assert_eq!(m.running, 4.0, "replicas max'ed");
    assert_eq!(m.kv_usage, None);
}

/// NaN, ±Inf and out-of-range values are unknown, never 0: before, a NaN or negative
/// series was skipped, so `running{b} NaN` made the pod look like it ran 4, and a page whose
/// only queue series was NaN looked idle.
#[test]
fn nan_inf_and_out_of_range_make_the_value_unknown_never_0() {
    let page = |waiting: &str, running: &str, kv: &str| {
        format!(
            "vllm:num_requests_waiting{{engine=\"0\",model_name=\"m\"}} 2.0\n\
             vllm:num_requests_waiting{{engine=\"1\",model_name=\"m\"}} {waiting}\n\
             vllm:num_requests_running{{engine=\"0\",model_name=\"m\"}} {running}\n\
             vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} {kv}\n"
        )
    };
    let ok = scrape_page(page("1.0", "3.0", "0.5").as_bytes(), 1 << 20, None);
    let m = ok.result.unwrap();
    assert_eq!((m.waiting, m.running, m.kv_usage), (3.0, 3.0, Some(0.5)));
    assert!(ok.unknown.is_empty());
    let cases = [
        (
            page("NaN", "3.0", "0.5"),
            "vllm:num_requests_waiting",
            Unknown::NotFinite,
        ),
        (
            page("+Inf", "3.0", "0.5"),
            "vllm:num_requests_waiting",
            Unknown::NotFinite,
        ),
        (
            page("-1.0", "3.0", "0.5"),
            "vllm:num_requests_waiting",
            Unknown::OutOfRange,
        ),
        (
            page("1.0", "-Inf", "0.5"),
            "vllm:num_requests_running",
            Unknown::NotFinite,
        ),
        (
            page("1.0", "3e12", "0.5"),
            "vllm:num_requests_running",
            Unknown::OutOfRange,
        ),
        (
            page("1.0", "3.0", "NaN"),
            "vllm:kv_cache_usage_perc",
            Unknown::NotFinite,
        ),
        (
            page("1.0", "3.0", "1.7"),
            "vllm:kv_cache_usage_perc",
            Unknown::OutOfRange,
        ),
        (
            page("1.0", "3.0", "-0.2"),
            "vllm:kv_cache_usage_perc",
            Unknown::OutOfRange,
        ),
    ];
    for (text, metric, why) in cases {
        let out = scrape_page(text.as_bytes(), 1 << 20, None);
        assert_eq!(
            out.result,
            Err(MapError::LoadUnknown(ModelServer::Vllm)),
            "{text}"
        );
        assert_eq!(
            out.unknown,
            vec![UnknownValue {
                metric: metric.into(),
                why
            }],
            "{text}"
        );
    }
    // Optional signals become None, the pod stays a candidate.
    let text = format!(
        "{}vllm:gpu_prefix_cache_hit_rate{{model_name=\"m\"}} NaN\n\
         vllm:prefix_cache_hits_total{{model_name=\"m\"}} -4\n\
         vllm:prefix_cache_queries_total{{model_name=\"m\"}} 10\n\
         custom{{model_name=\"m\"}} Inf\n",
        page("1.0", "3.0", "0.5")
    );
    let x = ExtraMetric {
        name: "custom".into(),
        aggregation: Aggregation::Sum,
    };
    let out = scrape_page(text.as_bytes(), 1 << 20, Some(&x));
    let m = out.result.unwrap();
    assert_eq!(
        (m.prefix_hit_rate, m.prefix_cache_counters, m.extra),
        (None, None, None)
    );
    let mut why: Vec<(&str, Unknown)> = out
        .unknown
        .iter()
        .map(|u| (u.metric.as_str(), u.why))
        .collect();
    why.sort_unstable_by_key(|(m, _)| *m);
    assert_eq!(
        why,
        vec![
            ("custom", Unknown::NotFinite),
            ("vllm:gpu_prefix_cache_hit_rate", Unknown::NotFinite),
            ("vllm:prefix_cache_hits_total", Unknown::OutOfRange),
        ]
    );
}

#[test]
fn vllm_old_kv_name_and_lora_latest_series() {
    let text = r#"vllm:num_requests_waiting{model_name="m"} 0
vllm:gpu_cache_usage_perc{model_name="m"} 1.0000001
vllm:gpu_prefix_cache_hit_rate{model_name="m"} -1.0
vllm:lora_requests_info{max_lora="4",running_lora_adapters="a, b,",waiting_lora_adapters="c"} 20
vllm:lora_requests_info{max_lora="4",running_lora_adapters="old",waiting_lora_adapters=""} 10
"#;
    let m = map(text).unwrap();
    assert_eq!(m.kv_usage, Some(1.0), "a rounding overshoot is clamped");
    assert_eq!(m.prefix_hit_rate, None, "-1 = no queries yet");
    let l = m.lora.unwrap();
    assert_eq!(l.running, vec!["a", "b"]);
    assert_eq!(l.waiting, vec!["c"]);
    assert_eq!(l.max_lora, 4);
    assert!(l.has_free_slot() && l.is_running("b") && !l.is_running("c") && l.is_waiting("c"));
    // A series whose time is NaN may be the newest: which one is cannot be told, so the LoRA
    // state is unknown, not the newest of the others (before, NaN series were skipped).
    let nan = format!(
        "{text}vllm:lora_requests_info{{max_lora=\"4\",running_lora_adapters=\"nan\",waiting_lora_adapters=\"\"}} NaN\n"
    );
    let out = scrape_page(nan.as_bytes(), 1 << 20, None);
    assert_eq!(out.result.unwrap().lora, None);
    assert_eq!(
        out.unknown,
        vec![UnknownValue {
            metric: "vllm:lora_requests_info".into(),
            why: Unknown::NotFinite
        }]
    );
}

/// Found by `tests/fuzz` (prom_cut): on a cut page the preferred KV name may lie past the
/// cut; falling back to the deprecated name read another value than the whole page would.
#[test]
fn a_preferred_name_past_the_cut_is_unknown_not_its_fallback() {
    let page = "vllm:engine_sleep_state{engine=\"0\",model_name=\"m\",sleep_state=\"awake\"} 1\n\
                vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.1\n\
                vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0\n\
                vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2.0\n\
                noise_bucket{le=\"1.0\"} 3\n\
                vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.9\n";
    let whole = scrape_page(page.as_bytes(), usize::MAX, None)
        .result
        .unwrap();
    assert_eq!(whole.kv_usage, Some(0.9));
    let cut = page.find("vllm:kv_cache").unwrap();
    let out = scrape_page(&page.as_bytes()[..cut], cut, None);
    assert_eq!(out.result, Err(MapError::LoadUnknown(ModelServer::Vllm)));
    assert_eq!(
        out.unknown,
        vec![UnknownValue {
            metric: "vllm:kv_cache_usage_perc".into(),
            why: Unknown::Cut
        }]
    );
    // A NaN preferred name on a whole page still yields to the fallback.
    let nan = page.replace("} 0.9", "} NaN");
    assert_eq!(map(&nan).unwrap().kv_usage, Some(0.1));
}

/// A cut through the histograms after the gauges: the pod reads as on the whole page, and
/// the optional families the page lacks (V0's hit-rate gauge, LoRA) are not reported as
/// unknown: every cut page would report them.
#[test]
fn a_cut_after_the_load_families_reads_whole_and_reports_nothing() {
    let page = format!(
        "{}vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} 0.5\n\
         h_bucket{{le=\"1\"}} 1\nh_bucket{{le=\"2\"}} 22",
        sleep_page(["1.0", "0.0", "0.0"])
    );
    let out = scrape_page(page.as_bytes(), page.len(), None);
    assert_eq!(out.stats.truncated, Some(prom::Truncation::InputBytes));
    let m = out.result.unwrap();
    assert_eq!((m.waiting, m.running, m.kv_usage), (0.0, 0.0, Some(0.5)));
    assert_eq!(out.unknown, vec![]);
}

/// vLLM V1 as `vllm/v1/metrics/loggers.py` emits it: one series per engine and state.
fn sleep_page(engine1: [&str; 3]) -> String {
    let mut t = String::from(
        "# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.\n\
         # TYPE vllm:engine_sleep_state gauge\n",
    );
    for (engine, vals) in [("0", ["1.0", "0.0", "0.0"]), ("1", engine1)] {
        for (state, v) in ["awake", "weights_offloaded", "discard_all"]
            .iter()
            .zip(vals)
        {
            t.push_str(&format!(
                "vllm:engine_sleep_state{{engine=\"{engine}\",model_name=\"m\",sleep_state=\"{state}\"}} {v}\n"
            ));
        }
    }
    t.push_str(
        "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0.0\n\
         vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 0.0\n\
         vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 0.0\n\
         vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 0.0\n",
    );
    t
}

/// A sleeping vLLM engine reports an empty queue: read as idle it would draw every request.
#[test]
fn vllm_asleep_is_not_a_candidate() {
    let m = map(&sleep_page(["1.0", "0.0", "0.0"])).unwrap();
    assert_eq!((m.waiting, m.running), (0.0, 0.0));
    for level in [
        ["0.0", "1.0", "0.0"],
        ["0.0", "0.0", "1.0"],
        ["0.0", "0.0", "0.0"],
    ] {
        assert_eq!(
            map(&sleep_page(level)),
            Err(MapError::Asleep(ModelServer::Vllm)),
            "{level:?}"
        );
    }
    let out = scrape_page(sleep_page(["NaN", "0.0", "0.0"]).as_bytes(), 1 << 20, None);
    assert_eq!(out.result, Err(MapError::LoadUnknown(ModelServer::Vllm)));
    assert_eq!(out.unknown[0].metric, "vllm:engine_sleep_state");
    // vLLM before the metric: no family on a whole page = awake.
    assert!(map(VLLM_V1_DP).is_ok());
}

/// SGLang prefill/decode disaggregation: requests in the bootstrap, in-flight transfer,
/// pre-allocation and transfer queues hold no batch slot yet; they are waiting work.
#[test]
fn sglang_disaggregation_queues_count_as_waiting() {
    let labels = |rank: u32, mode: &str| {
        format!("dp_rank=\"{rank}\",engine_type=\"{mode}\",model_name=\"q\",pp_rank=\"0\",tp_rank=\"0\"")
    };
    let mut decode = String::new();
    for (name, vals) in [
        ("sglang:num_running_reqs", [8, 8]),
        ("sglang:num_queue_reqs", [0, 1]),
        ("sglang:num_prefill_bootstrap_queue_reqs", [0, 0]),
        ("sglang:num_prefill_inflight_queue_reqs", [0, 0]),
        ("sglang:num_decode_prealloc_queue_reqs", [3, 2]),
        ("sglang:num_decode_transfer_queue_reqs", [2, 0]),
        ("sglang:token_usage", [0, 0]),
    ] {
        decode.push_str(&format!("# TYPE {name} gauge\n"));
        for (rank, v) in vals.iter().enumerate() {
            decode.push_str(&format!(
                "{name}{{{}}} {v}.0\n",
                labels(rank as u32, "decode")
            ));
        }
    }
    let m = map(&decode).unwrap();
    assert_eq!((m.waiting, m.running, m.dp_groups), (8.0, 16.0, 2));

    // A prefill pod of a release that still named the bootstrap queue `…prealloc…`.
    let l = labels(0, "prefill");
    let prefill = format!(
        "sglang:num_running_reqs{{{l}}} 1.0\nsglang:num_queue_reqs{{{l}}} 2.0\n\
         sglang:num_prefill_prealloc_queue_reqs{{{l}}} 4.0\n\
         sglang:num_prefill_inflight_queue_reqs{{{l}}} 3.0\n\
         sglang:num_decode_prealloc_queue_reqs{{{l}}} 0.0\n\
         sglang:num_decode_transfer_queue_reqs{{{l}}} 0.0\n"
    );
    assert_eq!(map(&prefill).unwrap().waiting, 9.0);
    // A NaN queue is unknown work, not none.
    let bad = prefill.replace("} 3.0", "} NaN");
    assert_eq!(map(&bad), Err(MapError::LoadUnknown(ModelServer::Sglang)));
}

/// trtllm-serve answers `/metrics` with JSON iteration statistics (shaped after its
/// documentation; `[]` before the first iteration); its Prometheus text is at
/// `/prometheus/metrics`.
#[test]
fn trtllm_serve_json_metrics_are_refused_as_not_prometheus() {
    let json = r#"[{"cpuMemUsage":0,"gpuMemUsage":76665782272,"inflightBatchingStats":{"avgNumDecodedTokensPerIter":0,"microBatchId":0,"numContextRequests":1,"numCtxTokens":5,"numGenRequests":0,"numPausedRequests":0,"numScheduledRequests":1},"iter":154,"iterLatencyMS":7.0,"kvCacheStats":{"allocNewBlocks":3126,"allocTotalBlocks":3126,"cacheHitRate":0.0013,"freeNumBlocks":101253,"maxNumBlocks":101256,"missedBlocks":3121,"reusedBlocks":4,"tokensPerBlock":32,"usedNumBlocks":3},"maxNumActiveRequests":2048,"newActiveRequestsQueueLatencyMS":0.0,"numActiveRequests":1,"numCompletedRequests":0,"numQueuedRequests":0}]"#;
    for body in [json, "[]", " \n{\"detail\":\"Not Found\"}", "\u{feff}[]"] {
        let out = scrape_page(body.as_bytes(), 1 << 20, None);
        assert_eq!(out.result, Err(MapError::NotPrometheus), "{body}");
    }
    assert!(!looks_like_json(b"trtllm_num_requests_waiting 1\n"));
    assert!(!looks_like_json(b"# HELP x\n{"));
    assert!(!looks_like_json(b""));
}

#[test]
fn sglang() {
    let text = r#"# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="q",pp_rank="0",tp_rank="0"} 6.0
sglang:num_running_reqs{dp_rank="1",engine_type="unified",model_name="q",pp_rank="0",tp_rank="0"} 2.0
sglang:num_queue_reqs{dp_rank="0",engine_type="unified",model_name="q",pp_rank="0",tp_rank="0"} 1.0
sglang:num_queue_reqs{dp_rank="1",engine_type="unified",model_name="q",pp_rank="0",tp_rank="0"} 0.0
sglang:token_usage{dp_rank="0",engine_type="unified",model_name="q",pp_rank="0",tp_rank="0"} 0.28
sglang:token_usage{dp_rank="1",engine_type="unified",model_name="q",pp_rank="0",tp_rank="0"} 0.12
sglang:cache_hit_rate{dp_rank="0",model_name="q"} 0.5
sglang:cache_config_info{num_pages="1000",page_size="1"} 1.0
sglang:gen_throughput{model_name="q"} 88.0
"#;
    let m = map(text).unwrap();
    assert_eq!(m.engine, ModelServer::Sglang);
    assert_eq!((m.waiting, m.running, m.dp_groups), (1.0, 8.0, 2));
    assert!(approx(m.kv_usage.unwrap(), 0.2));
    assert_eq!(m.prefix_hit_rate, Some(0.5));
    assert_eq!((m.block_size, m.num_gpu_blocks), (Some(1), Some(1000)));
}

#[test]
fn triton_trt_llm_with_and_without_fraction() {
    let base = r#"nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 3
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 512
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 4
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 2
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 1000
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 250
"#;
    let m = map(base).unwrap();
    assert_eq!(m.engine, ModelServer::TritonTrtLlm);
    assert_eq!((m.waiting, m.running), (2.0, 3.0));
    assert_eq!(m.kv_usage, Some(0.25), "used/max fallback");
    assert_eq!((m.block_size, m.num_gpu_blocks), (Some(64), Some(1000)));
    let with_fraction = format!(
        "{base}nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type=\"fraction\",model=\"tensorrt_llm\",version=\"1\"}} 0.5\n"
    );
    assert_eq!(map(&with_fraction).unwrap().kv_usage, Some(0.5));
    // Pre-2025-04 builds: no `waiting`, no `scheduled`.
    let old = "nv_trt_llm_request_metrics{model=\"tensorrt_llm\",request_type=\"active\",version=\"1\"} 4\n";
    let m = map(old).unwrap();
    assert_eq!((m.waiting, m.running, m.kv_usage), (0.0, 4.0, None));
}

#[test]
fn trtllm_serve_and_tgi() {
    let text = "trtllm_num_requests_waiting 5\ntrtllm_num_requests_running 9\n\
                trtllm_kv_cache_utilization 0.75\ntrtllm_kv_cache_tokens_per_block 32\n\
                trtllm_kv_cache_max_blocks 4096\n";
    let m = map(text).unwrap();
    assert_eq!(m.engine, ModelServer::TrtllmServe);
    assert_eq!((m.waiting, m.running, m.kv_usage), (5.0, 9.0, Some(0.75)));
    assert_eq!((m.block_size, m.num_gpu_blocks), (Some(32), Some(4096)));

    let m =
        map("# TYPE tgi_queue_size gauge\ntgi_queue_size 3\ntgi_batch_current_size 12\n").unwrap();
    assert_eq!(
        (m.engine, m.waiting, m.running, m.kv_usage),
        (ModelServer::Tgi, 3.0, 12.0, None)
    );
}

#[test]
fn unknown_and_load_less_pages() {
    assert_eq!(map(""), Err(MapError::UnknownEngine));
    assert_eq!(
        map("process_cpu_seconds_total 12\nfoo 1\n"),
        Err(MapError::UnknownEngine)
    );
    assert_eq!(
        map("vllm:cache_config_info{block_size=\"16\"} 1\n"),
        Err(MapError::NoLoadMetrics(ModelServer::Vllm))
    );
}

#[test]
fn extra_metric_for_least_most() {
    let x = |name: &str, aggregation| ExtraMetric {
        name: name.to_owned(),
        aggregation,
    };
    let (m, _) = scrape(
        VLLM_V1_DP.as_bytes(),
        Some(&x("vllm:num_requests_waiting", Aggregation::Sum)),
    );
    let m = m.unwrap();
    assert_eq!(m.extra, Some(9.0));
    assert!(m.extra_counts_requests);
    let (m, _) = scrape(
        VLLM_V1_DP.as_bytes(),
        Some(&x("vllm:kv_cache_usage_perc", Aggregation::Max)),
    );
    let m = m.unwrap();
    assert_eq!(m.extra, Some(0.6));
    assert!(!m.extra_counts_requests);
    let text = format!("{VLLM_V1_DP}custom_load{{pod=\"a\"}} 2\ncustom_load{{pod=\"a\"}} 4\n");
    let (m, _) = scrape(text.as_bytes(), Some(&x("custom_load", Aggregation::Mean)));
    assert_eq!(m.unwrap().extra, Some(4.0), "same group → max");
    let (m, _) = scrape(VLLM_V1_DP.as_bytes(), Some(&x("absent", Aggregation::Sum)));
    assert_eq!(m.unwrap().extra, None);
}

#[test]
fn wanted_filter_is_exact() {
    assert!(is_wanted("vllm:num_requests_waiting", None));
    assert!(is_wanted("vllm:lora_requests_info", None));
    assert!(is_wanted("vllm:prefix_cache_hits_total", None));
    assert!(!is_wanted("vllm:prefix_cache_hits_created", None));
    assert!(!is_wanted("vllm:e2e_request_latency_seconds_bucket", None));
    assert!(!is_wanted("my_metric", None));
    assert!(is_wanted("my_metric", Some("my_metric")));
}
