//! Micro-benchmark: the plain-Envoy prefix_cache decision (docs/redis-data-model.md §9) for the
//! next turn of a 10-turn chat (~8 KB) over 16 endpoints: canonicalise, chain, read the index
//! records, count the request with CAS, record the new keys, publish, and give the count back at
//! stream end — everything `ailb-core` does for the request, on an in-memory host.
//!
//! `cargo run --profile bench-native --example bench_local_prefix` prints
//! `BENCH plugin_core_us_local_prefix_decide <µs per request> us` (native figure; best of 7
//! batches of 500 conversations, each warmed with its 9th turn, timed on its 10th).

use ailb_core::balancer::{Balancer, Verdict};
use ailb_core::config::{Build, PluginConfig, PolicyConfig};
use ailb_core::host::{Host, HostError, HostErrorKind, HostResult, LogLevel, MetricType};
use serde_json::json;
use std::collections::HashMap;
use std::time::Instant;

/// What the decision path asks of a host: shared data, headers, the body, counters.
#[derive(Default)]
struct BenchHost {
    shared: HashMap<String, (Vec<u8>, u32)>,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    metrics: Vec<i64>,
    now_ms: u64,
}

fn unsupported<T>(call: &'static str) -> HostResult<T> {
    Err(HostError::new(call, HostErrorKind::Unsupported))
}

impl Host for BenchHost {
    fn log(&self, _level: LogLevel, _message: &str) {}
    fn now_ms(&self) -> u64 {
        self.now_ms
    }
    fn property(&self, _path: &[&str]) -> HostResult<Option<Vec<u8>>> {
        Ok(None)
    }
    fn request_header_map(&self) -> HostResult<Vec<u8>> {
        let pairs: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        Ok(ailb_core::host::pairs::encode(&pairs))
    }
    fn request_header(&self, name: &str) -> HostResult<Option<String>> {
        Ok(self
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone()))
    }
    fn remove_request_header(&mut self, name: &str) -> HostResult<()> {
        self.headers.retain(|(k, _)| k != name);
        Ok(())
    }
    fn set_request_header(&mut self, name: &str, value: &str) -> HostResult<()> {
        self.remove_request_header(name)?;
        self.headers.push((name.into(), value.into()));
        Ok(())
    }
    fn add_response_header(&mut self, _name: &str, _value: &str) -> HostResult<()> {
        Ok(())
    }
    fn response_status(&self) -> HostResult<Option<Vec<u8>>> {
        Ok(None)
    }
    fn request_body(&self, start: usize, len: usize) -> HostResult<Vec<u8>> {
        let end = start.saturating_add(len).min(self.body.len());
        Ok(self.body.get(start..end).unwrap_or_default().to_vec())
    }
    fn resume_request(&mut self) -> HostResult<()> {
        Ok(())
    }
    fn send_local_response(
        &mut self,
        _s: u32,
        _d: &str,
        _b: &[u8],
        _h: &[(&str, &str)],
    ) -> HostResult<()> {
        Ok(())
    }
    fn set_effective_context(&mut self, _context_id: u32) -> HostResult<()> {
        Ok(())
    }
    fn define_metric(&mut self, _kind: MetricType, _name: &str) -> HostResult<u32> {
        self.metrics.push(0);
        Ok(self.metrics.len() as u32 - 1)
    }
    fn increment_metric(&mut self, id: u32, delta: i64) -> HostResult<()> {
        if let Some(m) = self.metrics.get_mut(id as usize) {
            *m += delta;
        }
        Ok(())
    }
    fn shared_get(&self, key: &str) -> HostResult<Option<(Vec<u8>, u32)>> {
        Ok(self.shared.get(key).cloned())
    }
    fn shared_set(&mut self, key: &str, value: &[u8], cas: u32) -> HostResult<()> {
        let e = self
            .shared
            .entry(key.to_string())
            .or_insert((Vec::new(), 0));
        if cas != 0 && cas != e.1 {
            return Err(HostError::new(
                "set_shared_data",
                HostErrorKind::CasMismatch,
            ));
        }
        e.0 = value.to_vec();
        e.1 += 1;
        Ok(())
    }
    fn set_tick_period(&mut self, _ms: u32) -> HostResult<()> {
        Ok(())
    }
    fn http_call(&mut self, _c: &str, _h: &[(&str, &str)], _t: u32) -> HostResult<u32> {
        unsupported("http_call")
    }
    fn http_call_status(&self) -> HostResult<Option<u16>> {
        unsupported("get_http_call_response_headers")
    }
    fn http_call_body(&self, _size: usize) -> HostResult<Vec<u8>> {
        unsupported("get_http_call_response_body")
    }
    fn upstream_hosts(&self) -> HostResult<Vec<u8>> {
        unsupported("get_upstream_hosts")
    }
    fn set_upstream_override_host(&mut self, _address: &str) -> HostResult<()> {
        unsupported("set_upstream_override_host")
    }
    fn redis_init(&mut self, _c: &str, _u: &str, _p: &str, _t: u32) -> HostResult<()> {
        unsupported("redis_init")
    }
    fn redis_call(&mut self, _cluster: &str, _query: &[u8]) -> HostResult<u32> {
        unsupported("redis_call")
    }
    fn redis_reply(&self, _size: usize) -> HostResult<Vec<u8>> {
        unsupported("get_redis_call_response")
    }
}

/// A plain-Envoy prefix_cache route over 16 endpoints, decided once the body is in.
fn config() -> Option<PluginConfig> {
    let endpoints: Vec<String> = (1..=16).map(|i| format!("10.0.0.{i}:8000")).collect();
    let cfg = json!({"lb_policy": "prefix_cache", "lb_config": {"endpoints": endpoints}});
    let parsed = PluginConfig::parse_for(cfg.to_string().as_bytes(), Build::Envoy).ok()?;
    let route = parsed.global.as_ref()?;
    let local = matches!(route.policy, PolicyConfig::PrefixCache(_))
        && route.redis.is_none()
        && !route.decide_at_headers;
    local.then_some(parsed)
}

/// Conversation `id` up to `turns` earlier exchanges (bench_prefix.rs's chat, ~8 KB at 10).
fn chat(id: usize, turns: usize) -> Vec<u8> {
    let system = "You are a senior support engineer for a cloud storage product. Answer \
        precisely, cite the relevant documentation section when you can, never invent API names, \
        and keep answers under 200 words unless the user asks for detail.";
    let mut messages = vec![json!({"role": "system", "content": system})];
    for turn in 0..=turns {
        messages.push(json!({"role": "user", "content": format!(
            "Conversation {id}, turn {turn}: my upload of a 4 GB file to bucket \"media-{turn}\" \
             stalls at 87% with error SlowDown after about ten minutes. I use the CLI v2.{turn} \
             on Ubuntu. What should I check?")}));
        if turn < turns {
            messages.push(json!({"role": "assistant", "content": format!(
                "For turn {turn}: SlowDown means the bucket prefix is receiving more requests \
                 than it can absorb. 1) Enable multipart upload with a part size of 64 MB. \
                 2) Spread keys over several prefixes. 3) Retry with exponential backoff; the CLI \
                 does this when `max_attempts` is set. 4) Check that no lifecycle rule is \
                 rewriting objects in the same prefix. See docs section 4.{turn}.")}));
        }
    }
    json!({"model": "qwen2.5-7b-instruct", "stream": true, "max_tokens": 512, "messages": messages})
        .to_string()
        .into_bytes()
}

/// One whole request; true when the plugin routed it (a destination header was written).
fn request(host: &mut BenchHost, e: &mut Balancer, ctx: u32, body: Vec<u8>) -> bool {
    host.headers.clear();
    let len = body.len();
    host.body = body;
    let held = e.on_request_headers(host, ctx, false) == Verdict::Pause;
    let go = e.on_request_body(host, ctx, len, true) == Verdict::Continue;
    let routed = held && go && !host.headers.is_empty();
    e.on_done(host, ctx);
    routed
}

fn main() {
    let Some(config) = config() else {
        eprintln!("bench config did not parse");
        return;
    };
    let mut host = BenchHost {
        now_ms: 1_700_000_000_000,
        ..Default::default()
    };
    let mut e = Balancer::configure(&mut host, config, 42, LogLevel::Warn);
    let per_batch = 500;
    let mut ctx = 0u32;
    let mut samples = Vec::new();
    let mut bytes = 0;
    for batch in 0..7 {
        let ids = batch * per_batch..(batch + 1) * per_batch;
        for id in ids.clone() {
            ctx += 1;
            request(&mut host, &mut e, ctx, chat(id, 9));
        }
        let bodies: Vec<Vec<u8>> = ids.map(|id| chat(id, 10)).collect();
        bytes = bodies.first().map_or(0, Vec::len);
        let start = Instant::now();
        let mut routed = 0;
        for body in bodies {
            ctx += 1;
            routed += usize::from(request(&mut host, &mut e, ctx, body));
        }
        let us = start.elapsed().as_secs_f64() * 1e6 / per_batch as f64;
        if routed != per_batch {
            eprintln!("only {routed} of {per_batch} requests were routed");
            return;
        }
        samples.push(us);
        host.now_ms += 1_000;
    }
    samples.sort_by(f64::total_cmp);
    let best = samples.first().copied().unwrap_or(f64::NAN);
    let median = samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN);
    let records = host
        .shared
        .keys()
        .filter(|k| k.starts_with("ailb.px."))
        .count();
    println!(
        "body {bytes} bytes, 16 endpoints, {records} index records; best / median of 7 x {per_batch}: {best:.2} / {median:.2} us"
    );
    println!("BENCH plugin_core_us_local_prefix_decide {best:.2} us");
}
