//! `cluster_metrics` per-service statistics and their updates, formula for formula as Higress
//! keeps them (docs/higress-cluster-policies.md §3.2, §3.3), plus a line codec so the table can
//! live in proxy-wide shared data (the caller does the compare-and-swap).
//!
//! Services are keyed by name: `service_list` may repeat a name, and Go's maps then share one
//! record, so [`ServiceTable`] keeps one record per distinct name (first-seen order) and maps
//! every `service_list` entry to it.

use super::MetricsParams;
use std::collections::VecDeque;
use std::fmt::Write as _;

/// Go's success test: the `:status` response header is exactly `"200"`. Anything else —
/// another 2xx, a 3xx, no response headers at all (reset, timeout before headers) — is a
/// failure.
pub fn is_success(status: Option<&str>) -> bool {
    status == Some("200")
}

/// Go's EWMA: the first sample is taken as is, later ones `beta·old + (1−beta)·sample`.
pub fn ewma(old: Option<f64>, sample: f64, beta: f64) -> f64 {
    match old {
        None => sample,
        Some(old) => beta * old + (1.0 - beta) * sample,
    }
}

/// The last `capacity` latency samples in ms, oldest first (Go's `FixedQueue`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ring {
    samples: VecDeque<f64>,
}

impl Ring {
    /// Appends `sample`, dropping the oldest ones beyond `capacity`.
    pub fn push(&mut self, sample: f64, capacity: usize) {
        self.samples.push_back(sample);
        self.trim(capacity);
    }

    fn trim(&mut self, capacity: usize) {
        while self.samples.len() > capacity {
            self.samples.pop_front();
        }
    }

    /// Mean of the samples, summed oldest first as Go does; 0 when empty, so a service with no
    /// samples looks fastest.
    pub fn mean(&self) -> f64 {
        if self.samples.is_empty() {
            return 0.0;
        }
        let sum = self.samples.iter().fold(0.0, |acc, s| acc + s);
        sum / self.samples.len() as f64
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = f64> + '_ {
        self.samples.iter().copied()
    }
}

/// One service's record. Counters are Go `int`s (64-bit) that only grow, except `ongoing`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServiceStats {
    /// Requests sent to this service and not yet finished.
    pub ongoing: i64,
    /// Selections since the config loaded; `rate_limit` compares shares of these.
    pub count: u64,
    /// Last `queue_size` times to first byte and total latencies (ms), for the Least* modes.
    pub ttft: Ring,
    pub total: Ring,
    /// AdaptiveScore EWMAs; `None` until the first sample (Go's `HasTTFT` / `HasTotalRT`).
    pub ewma_ttft: Option<f64>,
    pub ewma_total: Option<f64>,
    pub success: u64,
    pub errors: u64,
    pub consecutive_errors: u64,
    /// Unix ms; the service is cooling down while this is later than now.
    pub cooldown_until_ms: i64,
}

impl ServiceStats {
    pub fn in_cooldown(&self, now_ms: i64) -> bool {
        self.cooldown_until_ms > now_ms
    }
}

/// Every service of one `cluster_metrics` config: one record per distinct name.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceTable {
    names: Vec<String>,
    /// `service_list` as configured, each entry an index into `names`.
    list: Vec<usize>,
    stats: Vec<ServiceStats>,
    ring_capacity: usize,
}

impl ServiceTable {
    /// A fresh table for `service_list` (duplicates allowed; `ring_capacity` from
    /// [`MetricsParams::ring_capacity`]).
    pub fn new<S: AsRef<str>>(service_list: &[S], ring_capacity: usize) -> ServiceTable {
        let mut names: Vec<String> = Vec::new();
        let mut list = Vec::with_capacity(service_list.len());
        for name in service_list {
            let name = name.as_ref();
            let index = match names.iter().position(|n| n == name) {
                Some(i) => i,
                None => {
                    names.push(name.to_string());
                    names.len() - 1
                }
            };
            list.push(index);
        }
        let stats = vec![ServiceStats::default(); names.len()];
        ServiceTable {
            names,
            list,
            stats,
            ring_capacity,
        }
    }

    /// Distinct service names; a decision's index points here.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// `service_list` as configured, as indices into [`ServiceTable::names`].
    pub fn list(&self) -> &[usize] {
        &self.list
    }

    pub fn stats(&self) -> &[ServiceStats] {
        &self.stats
    }

    pub fn get(&self, index: usize) -> Option<&ServiceStats> {
        self.stats.get(index)
    }

    pub fn get_mut(&mut self, index: usize) -> Option<&mut ServiceStats> {
        self.stats.get_mut(index)
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    pub fn ring_capacity(&self) -> usize {
        self.ring_capacity
    }

    /// This service's share of all selections so far, 0 before the first one.
    pub fn request_rate(&self, index: usize) -> f64 {
        let total = self
            .stats
            .iter()
            .fold(0u64, |t, s| t.saturating_add(s.count));
        match self.stats.get(index) {
            Some(s) if total != 0 => s.count as f64 / total as f64,
            _ => 0.0,
        }
    }

    /// Request headers, after the pick: one more in flight and one more selection.
    pub fn on_request_start(&mut self, index: usize) {
        if let Some(s) = self.stats.get_mut(index) {
            s.ongoing = s.ongoing.saturating_add(1);
            s.count = s.count.saturating_add(1);
        }
    }

    /// First response-body chunk, `elapsed_ms` after request headers: a TTFT sample. A failed
    /// request counts double the worse of its own time and the slowest service's mean TTFT.
    pub fn on_first_byte(&mut self, index: usize, elapsed_ms: i64, success: bool, beta: f64) {
        let sample = self.penalised(elapsed_ms, success, |s| &s.ttft);
        let capacity = self.ring_capacity;
        if let Some(s) = self.stats.get_mut(index) {
            s.ttft.push(sample, capacity);
            s.ewma_ttft = Some(ewma(s.ewma_ttft, sample, beta));
        }
    }

    /// Stream done (every request that was started, whatever its outcome). `elapsed_ms` is
    /// `None` when the start time is unknown: Go then only releases the in-flight count.
    /// A failure counts an error, extends the consecutive run and starts the cooldown; a
    /// success resets the run but leaves a running cooldown alone.
    pub fn on_stream_end(
        &mut self,
        index: usize,
        elapsed_ms: Option<i64>,
        success: bool,
        now_ms: i64,
        params: &MetricsParams,
    ) {
        let Some(s) = self.stats.get_mut(index) else {
            return;
        };
        // Go never goes below 0 (every release follows its acquire on the same config
        // instance); a shared record reset under running requests could, so stop at 0.
        s.ongoing = (s.ongoing - 1).max(0);
        let Some(elapsed_ms) = elapsed_ms else {
            return;
        };
        let sample = self.penalised(elapsed_ms, success, |s| &s.total);
        let capacity = self.ring_capacity;
        let Some(s) = self.stats.get_mut(index) else {
            return;
        };
        s.total.push(sample, capacity);
        s.ewma_total = Some(ewma(s.ewma_total, sample, params.ewma_beta));
        if success {
            s.success = s.success.saturating_add(1);
            s.consecutive_errors = 0;
        } else {
            s.errors = s.errors.saturating_add(1);
            s.consecutive_errors = s.consecutive_errors.saturating_add(1);
            // Go's int64 addition wraps; so does this.
            s.cooldown_until_ms = now_ms.wrapping_add(params.failure_cooldown_ms);
        }
    }

    fn penalised(
        &self,
        elapsed_ms: i64,
        success: bool,
        ring: impl Fn(&ServiceStats) -> &Ring,
    ) -> f64 {
        let mut sample = elapsed_ms as f64;
        if !success {
            for s in &self.stats {
                let mean = ring(s).mean();
                if sample < mean {
                    sample = mean;
                }
            }
            sample *= 2.0;
        }
        sample
    }

    /// One line per distinct service, in table order (see [`ServiceTable::decode`]).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        for (name, s) in self.names.iter().zip(&self.stats) {
            encode_line(&mut out, name, s);
        }
        out
    }

    /// Rebuilds the table for `service_list` from [`ServiceTable::encode`] output. Lines that
    /// do not parse, name no configured service or repeat a name are ignored, so a service
    /// whose line is missing or garbled starts fresh. Rings are cut to `ring_capacity`,
    /// keeping the newest samples. Never panics.
    pub fn decode<S: AsRef<str>>(
        text: &str,
        service_list: &[S],
        ring_capacity: usize,
    ) -> ServiceTable {
        Self::decode_checked(text, service_list, ring_capacity).0
    }

    /// [`Self::decode`], and whether the text was exactly one good line per service (what this
    /// codec writes): any skipped, unknown, repeated or missing line makes it `false`. Decided
    /// while decoding, so a caller need not re-encode to compare.
    pub fn decode_checked<S: AsRef<str>>(
        text: &str,
        service_list: &[S],
        ring_capacity: usize,
    ) -> (ServiceTable, bool) {
        let mut table = ServiceTable::new(service_list, ring_capacity);
        let mut seen = vec![false; table.names.len()];
        let mut clean = true;
        for line in text.lines() {
            let Some((name, mut stats)) = decode_line(line) else {
                clean = false;
                continue;
            };
            let Some(index) = table.index_of(&name) else {
                clean = false;
                continue;
            };
            if seen.get(index).copied().unwrap_or(true) {
                clean = false;
                continue;
            }
            clean &= stats.ttft.len() <= ring_capacity && stats.total.len() <= ring_capacity;
            stats.ttft.trim(ring_capacity);
            stats.total.trim(ring_capacity);
            if let (Some(slot), Some(flag)) = (table.stats.get_mut(index), seen.get_mut(index)) {
                *slot = stats;
                *flag = true;
            }
        }
        clean &= seen.iter().all(|s| *s);
        (table, clean)
    }
}

/// `name ongoing count success errors consecutive cooldown ewma_ttft ewma_total ttfts totals`,
/// space-separated; the name percent-escapes `%`, space and control bytes; an absent EWMA or
/// an empty ring is `-`; ring samples are comma-separated, oldest first.
fn encode_line(out: &mut String, name: &str, s: &ServiceStats) {
    for c in name.chars() {
        if c == '%' || c == ' ' || c.is_ascii_control() {
            let _ = write!(out, "%{:02X}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    let _ = write!(
        out,
        " {} {} {} {} {} {} ",
        s.ongoing, s.count, s.success, s.errors, s.consecutive_errors, s.cooldown_until_ms
    );
    push_opt(out, s.ewma_ttft);
    out.push(' ');
    push_opt(out, s.ewma_total);
    out.push(' ');
    push_ring(out, &s.ttft);
    out.push(' ');
    push_ring(out, &s.total);
    out.push('\n');
}

fn push_opt(out: &mut String, v: Option<f64>) {
    match v {
        Some(v) => push_f64(out, v),
        None => out.push('-'),
    }
}

fn push_ring(out: &mut String, ring: &Ring) {
    if ring.is_empty() {
        out.push('-');
        return;
    }
    for (i, v) in ring.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_f64(out, v);
    }
}

/// Shortest text that parses back to the same bits; exponent form only for extreme
/// magnitudes, where plain digits would run to hundreds of characters.
fn push_f64(out: &mut String, v: f64) {
    let a = v.abs();
    if a != 0.0 && !(1e-6..1e16).contains(&a) {
        let _ = write!(out, "{v:e}");
    } else {
        let _ = write!(out, "{v}");
    }
}

fn decode_line(line: &str) -> Option<(String, ServiceStats)> {
    let mut fields = line.split(' ');
    let name = unescape(fields.next()?)?;
    let mut int = || fields.next()?.parse::<i64>().ok();
    let ongoing = int()?;
    let count = u64::try_from(int()?).ok()?;
    let success = u64::try_from(int()?).ok()?;
    let errors = u64::try_from(int()?).ok()?;
    let consecutive_errors = u64::try_from(int()?).ok()?;
    let cooldown_until_ms = int()?;
    let ewma_ttft = parse_opt(fields.next()?)?;
    let ewma_total = parse_opt(fields.next()?)?;
    let ttft = parse_ring(fields.next()?)?;
    let total = parse_ring(fields.next()?)?;
    if fields.next().is_some() {
        return None;
    }
    Some((
        name,
        ServiceStats {
            ongoing,
            count,
            ttft,
            total,
            ewma_ttft,
            ewma_total,
            success,
            errors,
            consecutive_errors,
            cooldown_until_ms,
        },
    ))
}

fn unescape(field: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(field.len());
    let mut it = field.bytes();
    while let Some(b) = it.next() {
        if b == b'%' {
            let hi = char::from(it.next()?).to_digit(16)?;
            let lo = char::from(it.next()?).to_digit(16)?;
            bytes.push(u8::try_from(hi * 16 + lo).ok()?);
        } else {
            bytes.push(b);
        }
    }
    String::from_utf8(bytes).ok()
}

fn parse_f64(field: &str) -> Option<f64> {
    field.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// `Some(None)` for `-`, `None` for garbage.
fn parse_opt(field: &str) -> Option<Option<f64>> {
    if field == "-" {
        return Some(None);
    }
    parse_f64(field).map(Some)
}

fn parse_ring(field: &str) -> Option<Ring> {
    let mut ring = Ring::default();
    if field == "-" {
        return Some(ring);
    }
    for v in field.split(',') {
        ring.samples.push_back(parse_f64(v)?);
    }
    Some(ring)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::SplitMix64;

    fn table(list: &[&str]) -> ServiceTable {
        ServiceTable::new(list, MetricsParams::default().ring_capacity())
    }

    #[test]
    fn only_exact_200_is_success() {
        assert!(is_success(Some("200")));
        for s in [
            None,
            Some(""),
            Some("201"),
            Some("204"),
            Some("302"),
            Some("500"),
            Some("200 "),
        ] {
            assert!(!is_success(s), "{s:?}");
        }
    }

    #[test]
    fn duplicate_names_share_one_record() {
        let t = table(&["a", "b", "a", "c"]);
        assert_eq!(t.names(), ["a", "b", "c"]);
        assert_eq!(t.list(), [0, 1, 0, 2]);
        assert_eq!(t.stats().len(), 3);
        assert_eq!(t.index_of("c"), Some(2));
        assert_eq!(t.index_of("d"), None);
    }

    #[test]
    fn ring_keeps_the_newest_samples_and_averages_them() {
        let mut r = Ring::default();
        assert_eq!(r.mean(), 0.0);
        for v in [10.0, 20.0, 30.0, 40.0] {
            r.push(v, 3);
        }
        assert_eq!(r.iter().collect::<Vec<_>>(), [20.0, 30.0, 40.0]);
        assert_eq!(r.mean(), 30.0);
        assert_eq!(r.len(), 3);
    }

    #[test]
    fn ewma_matches_higress_test_values() {
        // Go TestAdaptiveScoreEWMAAndFailureState: 100 then 300 at beta 0.5 → 200.
        let e = ewma(None, 100.0, 0.5);
        assert_eq!(e, 100.0);
        assert_eq!(ewma(Some(e), 300.0, 0.5), 200.0);
        assert_eq!(ewma(Some(800.0), 400.0, 0.5), 600.0);
        assert_eq!(ewma(Some(10.0), 20.0, 0.0), 20.0);
        assert_eq!(ewma(Some(10.0), 20.0, 1.0), 10.0);
    }

    #[test]
    fn request_rate_is_the_share_of_selections() {
        let mut t = table(&["a", "b"]);
        assert_eq!(t.request_rate(0), 0.0);
        for _ in 0..7 {
            t.on_request_start(0);
        }
        for _ in 0..3 {
            t.on_request_start(1);
        }
        assert_eq!(t.request_rate(0), 0.7);
        assert_eq!(t.request_rate(1), 0.3);
        assert_eq!(t.request_rate(9), 0.0);
        assert_eq!(t.get(0).unwrap().ongoing, 7);
        assert_eq!(t.get(0).unwrap().count, 7);
    }

    #[test]
    fn first_byte_records_ttft_and_penalises_failures() {
        let p = MetricsParams::default();
        let mut t = table(&["a", "b"]);
        t.on_first_byte(0, 100, true, p.ewma_beta);
        t.on_first_byte(0, 300, true, p.ewma_beta);
        assert_eq!(t.get(0).unwrap().ttft.mean(), 200.0);
        assert_eq!(t.get(0).unwrap().ewma_ttft, Some(200.0));
        // A failure after 50 ms: max(50, slowest mean TTFT = 200) × 2.
        t.on_first_byte(1, 50, false, p.ewma_beta);
        assert_eq!(t.get(1).unwrap().ttft.iter().collect::<Vec<_>>(), [400.0]);
        assert_eq!(t.get(1).unwrap().ewma_ttft, Some(400.0));
        // A slow failure keeps its own time, doubled.
        t.on_first_byte(1, 1000, false, p.ewma_beta);
        assert_eq!(
            t.get(1).unwrap().ttft.iter().collect::<Vec<_>>(),
            [400.0, 2000.0]
        );
        // Nothing about success or cooldown changes at first byte.
        assert_eq!(t.get(1).unwrap().errors, 0);
        assert_eq!(t.get(1).unwrap().cooldown_until_ms, 0);
    }

    #[test]
    fn stream_end_tracks_latency_errors_and_cooldown() {
        let p = MetricsParams::default();
        let mut t = table(&["a", "b"]);
        t.on_request_start(0);
        t.on_request_start(0);
        // Go TestAdaptiveScoreEWMAAndFailureState: failure of 800 ms at t=1000.
        t.on_stream_end(0, Some(400), false, 1000, &p);
        let s = t.get(0).unwrap().clone();
        assert_eq!(s.ongoing, 1);
        assert_eq!(s.total.iter().collect::<Vec<_>>(), [800.0]);
        assert_eq!(s.ewma_total, Some(800.0));
        assert_eq!((s.success, s.errors, s.consecutive_errors), (0, 1, 1));
        assert_eq!(s.cooldown_until_ms, 1000 + 30_000);
        assert!(s.in_cooldown(30_999) && !s.in_cooldown(31_000));
        // A success at t=2000 resets the run but not the cooldown.
        t.on_stream_end(0, Some(400), true, 2000, &p);
        let s = t.get(0).unwrap();
        assert_eq!(s.ongoing, 0);
        assert_eq!((s.success, s.errors, s.consecutive_errors), (1, 1, 0));
        assert_eq!(s.ewma_total, Some(600.0));
        assert_eq!(s.cooldown_until_ms, 31_000);
        assert_eq!(s.count, 2);
    }

    #[test]
    fn stream_end_penalty_uses_the_slowest_mean_total_latency() {
        let p = MetricsParams::default();
        let mut t = table(&["a", "b", "c"]);
        t.on_stream_end(0, Some(100), true, 0, &p);
        t.on_stream_end(1, Some(500), true, 0, &p);
        t.on_stream_end(1, Some(700), true, 0, &p);
        // max(30, mean(b) = 600) × 2, recorded on c.
        t.on_stream_end(2, Some(30), false, 0, &p);
        assert_eq!(t.get(2).unwrap().total.iter().collect::<Vec<_>>(), [1200.0]);
        assert_eq!(t.get(2).unwrap().consecutive_errors, 1);
        t.on_stream_end(2, Some(30), false, 5, &p);
        assert_eq!(t.get(2).unwrap().consecutive_errors, 2);
        assert_eq!(t.get(2).unwrap().cooldown_until_ms, 30_005);
    }

    #[test]
    fn stream_end_without_start_time_only_releases() {
        let p = MetricsParams::default();
        let mut t = table(&["a"]);
        t.on_request_start(0);
        t.on_stream_end(0, None, false, 0, &p);
        let s = t.get(0).unwrap();
        assert_eq!(s.ongoing, 0);
        assert!(s.total.is_empty());
        assert_eq!(s.errors, 0);
        // A release with nothing in flight stops at zero.
        t.on_stream_end(0, None, true, 0, &p);
        assert_eq!(t.get(0).unwrap().ongoing, 0);
        // Unknown indices are ignored.
        t.on_stream_end(7, Some(1), true, 0, &p);
        t.on_request_start(7);
        t.on_first_byte(7, 1, true, 0.5);
    }

    #[test]
    fn cooldown_deadline_wraps_like_go_int64() {
        let p = MetricsParams {
            failure_cooldown_ms: i64::MAX,
            ..MetricsParams::default()
        };
        let mut t = table(&["a"]);
        t.on_stream_end(0, Some(1), false, 10, &p);
        assert_eq!(t.get(0).unwrap().cooldown_until_ms, i64::MIN + 9);
        assert!(!t.get(0).unwrap().in_cooldown(10));
    }

    fn busy_table() -> ServiceTable {
        let p = MetricsParams {
            queue_size: 4,
            ..MetricsParams::default()
        };
        let mut t = ServiceTable::new(
            &[
                "outbound|80||a.dns",
                "weird name%\t",
                "ünï",
                "",
                "outbound|80||a.dns",
            ],
            p.ring_capacity(),
        );
        for i in 0..6 {
            t.on_request_start(i % 4);
            t.on_first_byte(i % 4, 10 + i as i64 * 7, i % 3 != 0, p.ewma_beta);
            t.on_stream_end(
                i % 4,
                Some(100 + i as i64 * 33),
                i % 3 != 0,
                1_700_000_000_000,
                &p,
            );
        }
        t.on_request_start(1);
        t.get_mut(2).unwrap().ttft.push(0.1 + 0.2, 4);
        t.get_mut(2).unwrap().total.push(1e300, 4);
        t.get_mut(2).unwrap().total.push(-3.5e-9, 4);
        t
    }

    #[test]
    fn codec_round_trips_exactly() {
        let t = busy_table();
        let text = t.encode();
        assert_eq!(text.lines().count(), 4);
        let list = [
            "outbound|80||a.dns",
            "weird name%\t",
            "ünï",
            "",
            "outbound|80||a.dns",
        ];
        let back = ServiceTable::decode(&text, &list, t.ring_capacity());
        assert_eq!(back, t);
        assert_eq!(back.encode(), text);
        // A fresh table encodes and decodes too.
        let fresh = table(&["x", "y"]);
        assert_eq!(
            ServiceTable::decode(&fresh.encode(), &["x", "y"], 100),
            fresh
        );
    }

    #[test]
    fn codec_line_format_is_stable() {
        let mut t = table(&["outbound|80||a.dns"]);
        t.on_request_start(0);
        t.on_first_byte(0, 12, true, 0.5);
        t.on_stream_end(0, Some(40), false, 1000, &MetricsParams::default());
        t.get_mut(0).unwrap().ongoing = 3;
        assert_eq!(
            t.encode(),
            "outbound|80||a.dns 3 1 0 1 1 31000 12 80 12 80\n"
        );
        let t = table(&["a b%"]);
        assert_eq!(t.encode(), "a%20b%25 0 0 0 0 0 0 - - - -\n");
    }

    #[test]
    fn decode_keeps_configured_services_and_ignores_the_rest() {
        let text = "a 1 2 3 4 5 6 7 8 1,2,3 4\n\
                    zzz 9 9 9 9 9 9 9 9 9 9\n\
                    a 7 7 7 7 7 7 7 7 7 7\n\
                    b 1 2 3 4 5 6 - x - -\n\
                    c 1 -2 3 4 5 6 - - - -\n\
                    d 1 2 3 4 5 6 - - - - extra\n\
                    e 1 2 3 4 5 6 - - inf -\n\
                    f%zz 1 2 3 4 5 6 - - - -\n";
        let t = ServiceTable::decode(text, &["a", "b", "c", "d", "e"], 2);
        let a = t.get(0).unwrap();
        assert_eq!((a.ongoing, a.count, a.success, a.errors), (1, 2, 3, 4));
        assert_eq!((a.consecutive_errors, a.cooldown_until_ms), (5, 6));
        assert_eq!((a.ewma_ttft, a.ewma_total), (Some(7.0), Some(8.0)));
        // Cut to the capacity, newest kept.
        assert_eq!(a.ttft.iter().collect::<Vec<_>>(), [2.0, 3.0]);
        assert_eq!(a.total.iter().collect::<Vec<_>>(), [4.0]);
        for i in 1..5 {
            assert_eq!(t.get(i), Some(&ServiceStats::default()), "service {i}");
        }
    }

    #[test]
    fn decode_never_panics_on_garbage() {
        let list = ["outbound|80||a.dns", "weird name%\t", "ünï", ""];
        let good = busy_table().encode();
        let mut rng = SplitMix64(7);
        for round in 0..2000 {
            let mut bytes = good.clone().into_bytes();
            match round % 3 {
                0 => {
                    for _ in 0..1 + rng.next_u64() % 8 {
                        let i = (rng.next_u64() % bytes.len() as u64) as usize;
                        bytes[i] = rng.next_u64() as u8;
                    }
                }
                1 => bytes.truncate((rng.next_u64() % bytes.len() as u64) as usize),
                _ => {
                    bytes = (0..rng.next_u64() % 300)
                        .map(|_| rng.next_u64() as u8)
                        .collect();
                }
            }
            let text = String::from_utf8_lossy(&bytes);
            let t = ServiceTable::decode(&text, &list, 4);
            assert_eq!(t.names().len(), 4);
            for s in t.stats() {
                assert!(s.ttft.len() <= 4 && s.total.len() <= 4);
                assert!(s.ttft.iter().chain(s.total.iter()).all(f64::is_finite));
            }
        }
    }
}

#[cfg(test)]
mod decode_checked_tests {
    use super::*;

    #[test]
    fn only_one_good_line_per_service_is_clean() {
        let list = ["a", "b"];
        let ours = ServiceTable::new(&list, 4).encode();
        assert!(ServiceTable::decode_checked(&ours, &list, 4).1);
        let first = ours.lines().next().unwrap_or_default();
        for bad in [
            format!("{ours}garbage line\n"),
            format!("{first}\n"),
            format!("{ours}{first}\n"),
            ours.replace("a ", "zz "),
        ] {
            assert!(!ServiceTable::decode_checked(&bad, &list, 4).1, "{bad:?}");
        }
    }
}
