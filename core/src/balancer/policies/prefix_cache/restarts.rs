//! A pod restart seen in the metrics Higress keeps in the upstream host list (its health
//! checks' bodies, docs/higress-abi.md): a pod whose `process_start_time_seconds` changed has an
//! empty KV cache, so its older prefix keys are dropped (its generation bumped,
//! docs/redis-data-model.md §5) before a request is sent there as a hit. Without metrics in the
//! host list the engines' own answers find a restart (balancer/verify.rs).

use crate::bytes::find;
use crate::upstream;
use std::collections::HashMap;

/// How often one VM reads the host list's start times: a restart is found within this, and
/// the check costs a scan of each host's metrics text once per interval, not per request.
pub const CHECK_EVERY_MS: u64 = 1000;
/// The most pods remembered (a route's pods come and go).
const MAX_PODS: usize = 4096;

/// Each pod's start time as last read, and when the host list was last read.
#[derive(Debug, Default)]
pub struct Restarts {
    started: HashMap<String, String>,
    checked_ms: Option<u64>,
}

impl Restarts {
    /// Whether the host list is due for a read at `now_ms`.
    pub fn due(&self, now_ms: u64) -> bool {
        self.checked_ms
            .is_none_or(|t| now_ms.saturating_sub(t) >= CHECK_EVERY_MS)
    }

    /// The pods of host list `buf` whose start time changed since the last read (a pod seen
    /// for the first time is only remembered).
    pub fn check(&mut self, buf: &[u8], now_ms: u64) -> Vec<String> {
        self.checked_ms = Some(now_ms);
        let Ok(hosts) = upstream::decode_hosts_with_metrics(buf) else {
            return Vec::new();
        };
        if self.started.len() > MAX_PODS {
            self.started.clear();
        }
        let mut restarted = Vec::new();
        for h in hosts {
            let Some(start) = start_time(h.raw_metrics) else {
                continue;
            };
            match self
                .started
                .insert(h.address.to_string(), start.to_string())
            {
                Some(before) if before != start => restarted.push(h.address.to_string()),
                _ => {}
            }
        }
        restarted
    }
}

const NAME: &[u8] = b"process_start_time_seconds ";

/// The value of the `process_start_time_seconds` sample in a metrics text as it sits in the
/// host list's JSON (lines separated by the two characters `\n`); None without one.
pub fn start_time(raw: &[u8]) -> Option<&str> {
    let mut from = 0;
    while let Some(at) = find(raw.get(from..)?, NAME).map(|i| i + from) {
        let line_start = at == 0 || raw.get(at.saturating_sub(2)..at) == Some(b"\\n");
        let value_at = at + NAME.len();
        if line_start {
            let rest = raw.get(value_at..)?;
            let len = rest
                .iter()
                .take_while(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
                .count();
            let value = std::str::from_utf8(rest.get(..len)?).ok()?;
            return (!value.is_empty()).then_some(value);
        }
        from = value_at;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_list(hosts: &[(&str, &str)]) -> Vec<u8> {
        let infos: Vec<String> = hosts
            .iter()
            .map(|(_, m)| serde_json::json!({"health_status": "Healthy", "metrics": m}).to_string())
            .collect();
        let pairs: Vec<(&str, &str)> = hosts
            .iter()
            .zip(&infos)
            .map(|((a, _), info)| (*a, info.as_str()))
            .collect();
        crate::host::pairs::encode(&pairs)
    }

    const PAGE: &str = "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n\
        # TYPE process_start_time_seconds gauge\n\
        process_start_time_seconds 1.7642e+09\n\
        vllm:num_requests_waiting{model_name=\"m\"} 0.0\n";

    #[test]
    fn the_start_time_is_read_from_its_sample_line_only() {
        let list = host_list(&[("10.0.0.1:8000", PAGE)]);
        let hosts = upstream::decode_hosts_with_metrics(&list).unwrap();
        assert_eq!(start_time(hosts[0].raw_metrics), Some("1.7642e+09"));
        assert_eq!(start_time(b"process_start_time_seconds 12"), Some("12"));
        assert_eq!(start_time(b"# HELP process_start_time_seconds x"), None);
        assert_eq!(start_time(b"process_start_time_seconds x"), None);
        assert_eq!(start_time(b""), None);
    }

    #[test]
    fn a_changed_start_time_is_a_restart_and_a_first_sight_is_not() {
        let mut r = Restarts::default();
        assert!(r.due(0));
        let a = host_list(&[("a:1", PAGE), ("b:1", "no metrics here")]);
        assert!(r.check(&a, 0).is_empty(), "first sight");
        assert!(!r.due(CHECK_EVERY_MS - 1) && r.due(CHECK_EVERY_MS));
        assert!(r.check(&a, 1000).is_empty(), "unchanged");
        let restarted = PAGE.replace("1.7642e+09", "1.7643e+09");
        let b = host_list(&[("a:1", &restarted), ("b:1", "no metrics here")]);
        assert_eq!(r.check(&b, 2000), ["a:1"]);
        assert!(r.check(&b, 3000).is_empty());
        assert!(r.check(b"garbage", 4000).is_empty());
    }
}
