//! The engine-verified index on a workload that evicts (issue 47, docs/trace-bench.md):
//! the plugin with `verifyCachedTokens` on and off on the same arrivals. Its pods evict by LRU
//! (no restart, no flush), so a pod-wide forget there only drops conversations the pod still
//! holds: verification must cost no hits (`trace_verify_on_over_off_hit` ≥ 1.0). Runs go on,
//! off, off, on, so a drift of the machine's load over the four weighs on both sides alike.

use super::fleet::Scale;
use super::run::{bench, penalty_ms, run, Run, Via};
use ailb_bench::trace::replay::Options;
use ailb_bench::trace::workload::Workload;
use ailb_core::redis::resp::Value;
use ailb_e2e::bed::Bed;
use serde_json::json;

/// Requests the plugin sent to a pod as a hit (`prefix_hit`) that came back with under 512
/// cached tokens: half of one of its 4,096-byte blocks (as recovery.rs counts them).
fn short_hits(r: &Run) -> usize {
    r.ok()
        .filter(|x| x.reason.as_deref() == Some("prefix_hit") && x.cached_tokens < 512)
        .count()
}

/// Generation bumps in the bed's Redis since its last flush: the sum of every pod's generation.
fn generation_bumps(bed: &Bed) -> i64 {
    let Value::Array(Some(keys)) = bed.redis.cmd(&["KEYS", "*:gen"]) else {
        return 0;
    };
    let mut bumps = 0;
    for k in keys {
        let Value::Bulk(Some(k)) = k else { continue };
        let Value::Array(Some(fields)) = bed.redis.cmd(&[b"HGETALL".as_slice(), &k]) else {
            continue;
        };
        for pair in fields.chunks(2) {
            if let [Value::Bulk(Some(f)), Value::Bulk(Some(v))] = pair {
                if !f.ends_with(b"@ms") {
                    bumps += String::from_utf8_lossy(v).parse::<i64>().unwrap_or(0);
                }
            }
        }
    }
    bumps
}

pub fn verify_on_over_off(bed: &Bed, w: &Workload, s: Scale) -> anyhow::Result<()> {
    let lb = |verify: bool| Via::Gateways {
        n: 1,
        lb: json!({"maxTTFTPenaltyMs": penalty_ms(s), "verifyCachedTokens": verify}),
    };
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for verify in [true, false, false, true] {
        let name = if verify { "verify_on" } else { "verify_off" };
        let r = run(bed, name, w, lb(verify), Options::new(s.time))?;
        if verify {
            eprintln!(
                "  verify on: {} generation bumps, {} short hits",
                generation_bumps(bed),
                short_hits(&r)
            );
            on.push(r);
        } else {
            off.push(r);
        }
    }
    let hit = |rs: &[Run]| rs.iter().map(Run::hit).sum::<f64>() / rs.len() as f64;
    bench(
        "trace_verify_on_over_off_hit",
        hit(&on) / hit(&off),
        "ratio",
    );
    // The noise beside it: the two `off` runs, the same configuration and arrivals.
    if let [a, b] = off.as_slice() {
        bench("trace_verify_off_over_off_hit", a.hit() / b.hit(), "ratio");
    }
    Ok(())
}
