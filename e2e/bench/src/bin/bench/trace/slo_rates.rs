//! How far the latency-aware plugin's learned prefill rates are from the pods' true ones
//! (issue 50: within 15 %), read from Redis after its run: the hash `<namespace>:latency_coef`
//! (docs/redis-data-model.md §15; namespace as `ailb_core::redis::scripts::Keys::new` builds
//! it), one field per pod address (and `*`, the fleet prior), each value the CSV of its TTFT
//! coefficients (ms; ms per 1,000 tokens prefilled before the first token; ms per running
//! request) then its TPOT ones: the learned rate is 1,000,000 ÷ the second number, tokens per
//! wall second, the true one the pod's `prefill_tokens_per_s`.

use super::fleet::{Cost, Scale};
use ailb_core::redis::resp::Value;
use ailb_e2e::bed::Bed;

/// The hash's fields and values, flat (HGETALL's answer).
fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::Array(Some(items)) => items
            .iter()
            .filter_map(|i| i.as_str().map(String::from))
            .collect(),
        _ => Vec::new(),
    }
}

/// max over pods of |learned ÷ true − 1|; None (said on stderr) when the plugin wrote no
/// coefficients or names no pod of the bed.
pub fn learned_rate_error(bed: &Bed, cost: &Cost, s: Scale) -> Option<f64> {
    let keys = strings(&bed.redis.cmd(&["KEYS", "*:latency_coef"]));
    let Some(key) = keys.first() else {
        eprintln!("slo: no *:latency_coef hash in Redis: no slo_learned_rate_error_max");
        return None;
    };
    let flat = strings(&bed.redis.cmd(&["HGETALL", key.as_str()]));
    let addrs = bed.pod_addrs();
    let n = addrs.len();
    let mut worst: Option<f64> = None;
    for pair in flat.chunks(2) {
        let [field, value] = pair else { continue };
        if field == "*" {
            continue;
        }
        let Some(i) = addrs.iter().position(|a| a == field) else {
            eprintln!("slo: {key} names {field}, not a pod of the bed");
            continue;
        };
        let numbers: Vec<f64> = value
            .split(',')
            .filter_map(|v| v.trim().parse::<f64>().ok())
            .collect();
        // A fit whose slope went negative has a negative rate, and counts: its error is over 1.
        let Some(&per_k) = numbers.get(1).filter(|c| numbers.len() == 6 && **c != 0.0) else {
            eprintln!("slo: {key} {field}: not 6 coefficients with a rate: {value:?}");
            continue;
        };
        let learned = 1e6 / per_k;
        let truth = cost.rate(i, n, s) * s.time;
        let err = (learned / truth - 1.0).abs();
        eprintln!("    pod-{i}: learned {learned:.0} tokens/s, true {truth:.0} (wall, scaled tokens): {err:.3}");
        worst = Some(worst.map_or(err, |w: f64| w.max(err)));
    }
    worst
}
