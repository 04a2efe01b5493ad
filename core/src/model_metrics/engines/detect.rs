//! Which engine a page comes from, told by the metric names present, and which series names
//! any engine mapping reads (the parse filter).

use crate::model_metrics::names::{ModelServer, SPECS, WANTED};
use crate::model_metrics::prom::Exposition;

/// Filter for [`crate::model_metrics::prom::parse_filtered`]: true for every series name some
/// engine mapping reads, plus `extra` (a configured `target_metric`). Called once per line, so it
/// is a binary search.
pub fn is_wanted(name: &str, extra: Option<&str>) -> bool {
    extra == Some(name) || WANTED.binary_search(&name).is_ok()
}

/// ModelServer whose queue or running family is present; else the engine any mapped family belongs
/// to (so a page with only `vllm:cache_config_info` reports `NoLoadMetrics(Vllm)`).
pub fn detect_engine(expo: &Exposition) -> Option<ModelServer> {
    let by_load = SPECS.iter().find(|sp| {
        sp.waiting
            .iter()
            .chain(sp.running)
            .any(|x| expo.has(x.name))
    });
    let by_any = || {
        expo.samples.iter().find_map(|smp| {
            SPECS
                .iter()
                .find(|sp| is_wanted(&smp.name, None) && smp.name.starts_with(prefix(sp.engine)))
        })
    };
    by_load.or_else(by_any).map(|sp| sp.engine)
}

fn prefix(e: ModelServer) -> &'static str {
    match e {
        ModelServer::Vllm => "vllm:",
        ModelServer::Sglang => "sglang:",
        ModelServer::TritonTrtLlm => "nv_trt_llm_",
        ModelServer::TrtllmServe => "trtllm_",
        ModelServer::Tgi => "tgi_",
        ModelServer::LlamaCpp => "llamacpp:",
    }
}
