//! The scrape snapshot in shared data: one tab-separated line per endpoint, written by the VM
//! holding the scrape lease and read (decoded only when its CAS moved) by every worker VM; and
//! the `rate_limit` window record. Garbage lines are skipped, never a panic.

use crate::model_metrics::{EndpointMetrics, LoraInfo, ModelServer};
use std::collections::HashMap;

/// Requests sent by this proxy per endpoint (monotonic; in-flight = now − value at scrape).
pub const SENT_KEY: &str = "ailb.sent";

/// A request count that fits the scheduler's u32.
pub fn clamp_u32(x: u64) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

pub fn snapshot_key(ns: &str) -> String {
    format!("ailb.snap.{ns}")
}

pub fn targets_key(ns: &str) -> String {
    format!("ailb.targets.{ns}")
}

/// The window's decisions with their times (`ailb.rlw.`; the `ailb.rl.` record of earlier
/// versions held hashes only and is not read).
pub fn window_key(ns: &str) -> String {
    format!("ailb.rlw.{ns}")
}

/// One endpoint in the scrape snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapEntry {
    /// When the scrape answered (ms).
    pub at_ms: u64,
    /// The endpoint's sent counter when the scrape was dispatched.
    pub sent_base: u64,
    /// `None`: the scrape failed or the text had no usable metrics.
    pub metrics: Option<EndpointMetrics>,
}

/// Snapshot codec: one tab-separated line per endpoint.
/// `addr at base ok W R KV EXTRA ECR ENGINE MAXLORA RUNNING WAITING` (`-` = none).
pub fn encode_snapshot(s: &HashMap<String, SnapEntry>) -> Vec<u8> {
    let mut keys: Vec<&String> = s.keys().collect();
    keys.sort_unstable();
    let mut out = String::new();
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |x| x.to_string());
    for k in keys {
        let Some(e) = s.get(k) else { continue };
        out.push_str(&format!("{k}\t{}\t{}", e.at_ms, e.sent_base));
        match &e.metrics {
            None => out.push_str("\t0\n"),
            Some(m) => {
                let (max_lora, run, wait) = match &m.lora {
                    Some(l) => (
                        l.max_lora.to_string(),
                        clean(&l.running.join(",")),
                        clean(&l.waiting.join(",")),
                    ),
                    None => ("-".into(), String::new(), String::new()),
                };
                out.push_str(&format!(
                    "\t1\t{}\t{}\t{}\t{}\t{}\t{}\t{max_lora}\t{run}\t{wait}\n",
                    m.waiting,
                    m.running,
                    opt(m.kv_usage),
                    opt(m.extra),
                    u8::from(m.extra_counts_requests),
                    engine_code(m.engine),
                ));
            }
        }
    }
    out.into_bytes()
}

pub fn decode_snapshot(b: &[u8]) -> HashMap<String, SnapEntry> {
    let text = String::from_utf8_lossy(b);
    text.lines().filter_map(decode_line).collect()
}

fn decode_line(line: &str) -> Option<(String, SnapEntry)> {
    let mut f = line.split('\t');
    let addr = f.next()?.to_string();
    let at_ms = f.next()?.parse().ok()?;
    let sent_base = f.next()?.parse().ok()?;
    let metrics = match f.next()? {
        "1" => {
            let num = |s: Option<&str>| -> Option<Option<f64>> {
                match s? {
                    "-" => Some(None),
                    x => x.parse().ok().map(Some),
                }
            };
            let waiting = num(f.next())??;
            let running = num(f.next())??;
            let kv_usage = num(f.next())?;
            let extra = num(f.next())?;
            let extra_counts_requests = f.next()? == "1";
            let engine = engine_from(f.next()?)?;
            let max_lora = f.next()?;
            let run = f.next().unwrap_or("");
            let wait = f.next().unwrap_or("");
            let split = |s: &str| -> Vec<String> {
                s.split(',')
                    .filter(|x| !x.is_empty())
                    .map(str::to_string)
                    .collect()
            };
            let lora = match max_lora {
                "-" => None,
                n => Some(LoraInfo {
                    running: split(run),
                    waiting: split(wait),
                    max_lora: n.parse().ok()?,
                }),
            };
            Some(EndpointMetrics {
                engine,
                waiting,
                running,
                kv_usage,
                lora,
                prefix_hit_rate: None,
                prefix_cache_counters: None,
                block_size: None,
                num_gpu_blocks: None,
                dp_groups: 1,
                extra,
                extra_counts_requests,
            })
        }
        _ => None,
    };
    Some((
        addr,
        SnapEntry {
            at_ms,
            sent_base,
            metrics,
        },
    ))
}

fn clean(s: &str) -> String {
    s.replace(['\t', '\n', '\r'], " ")
}

fn engine_code(e: ModelServer) -> &'static str {
    match e {
        ModelServer::Vllm => "v",
        ModelServer::Sglang => "s",
        ModelServer::TritonTrtLlm => "t",
        ModelServer::TrtllmServe => "r",
        ModelServer::Tgi => "g",
        ModelServer::LlamaCpp => "l",
    }
}

fn engine_from(s: &str) -> Option<ModelServer> {
    Some(match s {
        "v" => ModelServer::Vllm,
        "s" => ModelServer::Sglang,
        "t" => ModelServer::TritonTrtLlm,
        "r" => ModelServer::TrtllmServe,
        "g" => ModelServer::Tgi,
        "l" => ModelServer::LlamaCpp,
        _ => return None,
    })
}

/// Serialised rate-limit window (`rate_limit` per proxy): each recent decision's address hash
/// and time (ms), little-endian, 16 bytes each.
pub fn encode_window(entries: &[(u64, u64)]) -> Vec<u8> {
    entries
        .iter()
        .flat_map(|(h, at)| h.to_le_bytes().into_iter().chain(at.to_le_bytes()))
        .collect()
}

pub fn decode_window(b: &[u8]) -> Vec<(u64, u64)> {
    let word = |c: &[u8]| {
        let mut w = [0u8; 8];
        w.copy_from_slice(c.get(..8).unwrap_or(&[0; 8]));
        u64::from_le_bytes(w)
    };
    b.chunks_exact(16)
        .map(|c| (word(c), word(c.get(8..).unwrap_or_default())))
        .collect()
}
