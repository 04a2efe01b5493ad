//! Malformed lines (issue 39 items 1 and 2): a family the scheduler reads with a line that does
//! not parse is unknown for the pod, as NaN is, never the rest of it. Before, the bad line was
//! dropped without a word and the family read as partial or absent: each case below read
//! idler than the page says (or, for LoRA, the previous series).

use super::*;
use crate::model_metrics::prom::{self, MAX_LABEL_VALUE_LEN};

/// A vLLM V1 page of two data-parallel engines, with every family the scheduler reads; `lines`
/// replaces the line holding its first element with its second.
fn vllm(edit: Option<(&str, &str)>) -> String {
    let page = "# HELP vllm:num_requests_running Running.\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n\
         vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 4.0\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0\n\
         vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 40.0\n\
         vllm:engine_sleep_state{engine=\"0\",model_name=\"m\",sleep_state=\"awake\"} 1.0\n\
         vllm:engine_sleep_state{engine=\"1\",model_name=\"m\",sleep_state=\"awake\"} 1.0\n\
         vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"old\",waiting_lora_adapters=\"\"} 1.0e9\n\
         vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"a,b\",waiting_lora_adapters=\"b\"} 2.0e9\n\
         # TYPE h histogram\n\
         h_bucket{le=\"1.0\"} 3\n\
         h_bucket{le=\"+Inf\"} 4\n\
         vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.9\n\
         vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.95\n\
         custom_load{engine=\"0\"} 5\n"
        .to_string();
    match edit {
        Some((from, to)) => {
            assert!(page.contains(from), "{from}");
            page.replacen(from, to, 1)
        }
        None => page,
    }
}

fn custom() -> ExtraMetric {
    ExtraMetric {
        name: "custom_load".into(),
        aggregation: Aggregation::Sum,
    }
}

fn read(text: &str) -> Scrape {
    scrape_page(text.as_bytes(), 1 << 20, Some(&custom()))
}

fn notes(out: &Scrape) -> Vec<(&str, Unknown)> {
    let mut n: Vec<(&str, Unknown)> = out
        .unknown
        .iter()
        .map(|u| (u.metric.as_str(), u.why))
        .collect();
    n.sort_unstable_by_key(|(m, _)| *m);
    n
}

#[test]
fn the_whole_page_reads_every_family() {
    let out = read(&vllm(None));
    let m = out.result.unwrap();
    assert_eq!((m.waiting, m.running), (42.0, 7.0));
    assert_eq!(m.extra, Some(5.0));
    assert_eq!(m.lora.unwrap().running, vec!["a", "b"]);
    assert!(out.unknown.is_empty());
}

/// Each load family with one malformed line: the pod is unknown, never read from the rest.
#[test]
fn a_malformed_line_of_a_load_family_makes_the_pod_unknown() {
    let long = "x".repeat(MAX_LABEL_VALUE_LEN + 1);
    let over_limit =
        format!("vllm:num_requests_waiting{{engine=\"1\",model_name=\"{long}\"}} 40.0");
    let cases: Vec<(String, String, &str)> = vec![
        // One bad data-parallel rank: before, the sum was 2, not 42.
        (
            "vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 40.0".into(),
            over_limit,
            "vllm:num_requests_waiting",
        ),
        (
            "vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 40.0".into(),
            "vllm:num_requests_waiting{engine=\"1\",model_name=\"m} 40.0".into(),
            "vllm:num_requests_waiting",
        ),
        (
            "vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 4.0".into(),
            "vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 4.0 garbage".into(),
            "vllm:num_requests_running",
        ),
        // One bad KV rank: before, the mean was 0.9 of the good rank.
        (
            "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.95".into(),
            "vllm:kv_cache_usage_perc{engine=\"1\" model_name=\"m\"} 0.95".into(),
            "vllm:kv_cache_usage_perc",
        ),
        // A sleeping engine whose line is damaged: before, it read awake.
        (
            "vllm:engine_sleep_state{engine=\"1\",model_name=\"m\",sleep_state=\"awake\"} 1.0"
                .into(),
            "vllm:engine_sleep_state{engine=\"1\",model_name=\"m\",sleep_state=\"awake} 0.0".into(),
            "vllm:engine_sleep_state",
        ),
    ];
    for (from, to, metric) in cases {
        let out = read(&vllm(Some((&from, &to))));
        assert_eq!(
            out.result,
            Err(MapError::LoadUnknown(ModelServer::Vllm)),
            "{to}"
        );
        assert!(
            out.unknown
                .iter()
                .any(|u| u.metric == metric && u.why == Unknown::Malformed),
            "{to}: {:?}",
            out.unknown
        );
        assert_eq!(out.stats.malformed, 1);
    }
}

/// A family's only line malformed: before, a missing `num_requests_waiting` read 0 (that pod
/// then won every pick with 40 queued) and a missing KV line passed the saturation check.
#[test]
fn a_bad_sole_line_is_unknown_not_absent() {
    let sole = "vllm:num_requests_running{model_name=\"m\"} 3.0\n\
                vllm:num_requests_waiting{model_name=\"m\"} 40.0\n\
                vllm:kv_cache_usage_perc{model_name=\"m\"} 0.99\n";
    let m = read(sole).result.unwrap();
    assert_eq!((m.waiting, m.kv_usage), (40.0, Some(0.99)));
    for (from, to) in [
        (
            "waiting{model_name=\"m\"} 40.0",
            "waiting{model_name=\"m\"} 4O.0",
        ),
        (
            "perc{model_name=\"m\"} 0.99",
            "perc{model_name=\"m\"} 0.99 1 2",
        ),
    ] {
        let out = read(&sole.replacen(from, to, 1));
        assert_eq!(
            out.result,
            Err(MapError::LoadUnknown(ModelServer::Vllm)),
            "{to}"
        );
    }
}

/// A line whose own name is damaged may be any family's: the families on either side of it
/// read as unknown, and so does a family the page lacks (it may have been that line).
#[test]
fn a_line_with_a_damaged_name_taints_its_neighbours_and_absent_families() {
    let cases = [
        // Inside the waiting family: its engine-1 line may be this one.
        (
            "vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 40.0",
            "\u{1}vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 40.0",
        ),
        // A name damaged in its middle: read before as `vllm:num_req`, another metric.
        (
            "vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 40.0",
            "vllm:num_req?ests_waiting{engine=\"1\",model_name=\"m\"} 40.0",
        ),
    ];
    for (from, to) in cases {
        let out = read(&vllm(Some((from, to))));
        assert_eq!(
            out.result,
            Err(MapError::LoadUnknown(ModelServer::Vllm)),
            "{to}"
        );
        assert!(out
            .unknown
            .iter()
            .any(|u| u.metric == "vllm:num_requests_waiting" && u.why == Unknown::Malformed));
    }
    // The sole waiting line, name damaged, between two histograms: no family around it is
    // read, but waiting is absent, which the damaged line may have been. Before: 0 waiting.
    let page = "vllm:num_requests_running{model_name=\"m\"} 3.0\n\
                h_bucket{le=\"1.0\"} 3\n\
                vllm:num_requests_wai\n\
                ting{model_name=\"m\"} 40.0\n\
                g_bucket{le=\"1.0\"} 3\n";
    let out = read(page);
    assert_eq!(out.result, Err(MapError::LoadUnknown(ModelServer::Vllm)));
    // Every load family the page lacks is unknown (KV too: `None` would pass the saturation
    // check); optional ones are not reported (every damaged page would report them).
    assert_eq!(
        notes(&out),
        vec![
            ("vllm:engine_sleep_state", Unknown::Malformed),
            ("vllm:gpu_cache_usage_perc", Unknown::Malformed),
            ("vllm:kv_cache_usage_perc", Unknown::Malformed),
            ("vllm:num_requests_waiting", Unknown::Malformed)
        ]
    );
}

/// Optional families: the pod stays a candidate, the value is unknown (`None`) and said so.
#[test]
fn a_malformed_line_of_an_optional_family_makes_it_unknown() {
    // target_metric: its one series damaged, the scheduler's `least` must not see it at all.
    let out = read(&vllm(Some((
        "custom_load{engine=\"0\"} 5",
        "custom_load{engine=0} 5",
    ))));
    let m = out.result.clone().unwrap();
    assert_eq!(m.extra, None);
    assert_eq!(notes(&out), vec![("custom_load", Unknown::Malformed)]);
}

/// Item 2: the newest LoRA series malformed (or over the family's label limit) leaves LoRA
/// unknown; before, the previous series (`old`, a slot free) was taken for the pod's state.
#[test]
fn lora_is_never_the_previous_series() {
    let newest = "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"a,b\",waiting_lora_adapters=\"b\"} 2.0e9";
    let over = "z".repeat(prom::MAX_LIST_LABEL_VALUE_LEN + 1);
    for bad in [
        newest.replace("waiting_lora_adapters=\"b\"", "waiting_lora_adapters=\"b"),
        newest.replace(
            "running_lora_adapters=\"a,b\"",
            &format!("running_lora_adapters=\"{over}\""),
        ),
    ] {
        let out = read(&vllm(Some((newest, &bad))));
        let m = out.result.clone().unwrap();
        assert_eq!(m.lora, None, "not `old`");
        assert_eq!(
            notes(&out),
            vec![("vllm:lora_requests_info", Unknown::Malformed)]
        );
    }
}

/// vLLM lists every adapter with a running or waiting request in both labels: 1,000 adapters
/// of 38-byte names are 39 KB per label, over the 16 KiB other labels get. Before, that line
/// was dropped and the older series read.
#[test]
fn a_thousand_adapters_in_both_labels_are_read() {
    let names: Vec<String> = (0..1000)
        .map(|i| format!("org-name/finetune-adapter-{i:04}-v1-lora"))
        .collect();
    let list = names.join(",");
    assert!(list.len() > 35_000 && list.len() > MAX_LABEL_VALUE_LEN);
    let newest = "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"a,b\",waiting_lora_adapters=\"b\"} 2.0e9";
    let big = format!(
        "vllm:lora_requests_info{{max_lora=\"1000\",running_lora_adapters=\"{list}\",waiting_lora_adapters=\"{list}\"}} 2.0e9"
    );
    let out = read(&vllm(Some((newest, &big))));
    assert!(out.unknown.is_empty(), "{:?}", out.unknown);
    let l = out.result.unwrap().lora.unwrap();
    assert_eq!(
        (l.running.len(), l.waiting.len(), l.max_lora),
        (1000, 1000, 1000)
    );
    assert!(l.is_running("org-name/finetune-adapter-0999-v1-lora"));
}
