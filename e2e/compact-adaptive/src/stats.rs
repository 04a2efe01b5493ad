//! The statistics of the bench's three services and AdaptiveScore's arithmetic over them, as
//! the plugin computes it for the bench's config (`p2c_choices: 3`, `inflight_capacity: 8`,
//! Higress's other defaults; docs/higress-cluster-policies.md §3.5): every service a candidate,
//! score = latency × load × (1 + 3 × error rate), latency = 0.7·√(TTFT+1) + 0.3·√(total+1) of
//! the EWMAs (β 0.5), a failure's sample doubled and at least the slowest service's, a 30 s
//! cooldown after a failure. Pure, one fixed-size block per service, no allocation; EWMAs where
//! the plugin also keeps sample windows.

/// The bench's services (`ailb-bench cluster-p99`), in record order.
pub const NAMES: [&[u8]; N] = [b"llm-a", b"llm-b", b"llm-c"];
pub const N: usize = 3;
const BETA: f64 = 0.5;
const TTFT_WEIGHT: f64 = 0.7;
const TOTAL_WEIGHT: f64 = 0.3;
const ERROR_PENALTY: f64 = 3.0;
const COOLDOWN_MS: i64 = 30_000;
const INFLIGHT_CAPACITY: f64 = 8.0;

const MAGIC: u8 = 0xac;
const BLOCK_LEN: usize = 40;
pub const RECORD_LEN: usize = 1 + N * BLOCK_LEN;

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Service {
    pub ongoing: u32,
    pub success: u32,
    pub errors: u32,
    pub consecutive_errors: u32,
    /// EWMAs in ms, 0 before the first sample (a sample is never below 0).
    pub ewma_ttft: f64,
    pub ewma_total: f64,
    pub cooldown_until_ms: i64,
}

pub type Record = [Service; N];

/// The record in `bytes`, or a fresh one when they are not a record of this layout.
pub fn decode(bytes: &[u8]) -> Record {
    let mut out = Record::default();
    let Some((&MAGIC, blocks)) = bytes.split_first() else {
        return out;
    };
    if blocks.len() != N * BLOCK_LEN {
        return out;
    }
    for (s, b) in out.iter_mut().zip(blocks.chunks_exact(BLOCK_LEN)) {
        let half = |at: usize| {
            let mut w = [0u8; 4];
            w.copy_from_slice(&b[at..at + 4]);
            u32::from_le_bytes(w)
        };
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(w)
        };
        s.ongoing = half(0);
        s.success = half(4);
        s.errors = half(8);
        s.consecutive_errors = half(12);
        s.ewma_ttft = f64::from_bits(word(16));
        s.ewma_total = f64::from_bits(word(24));
        s.cooldown_until_ms = word(32) as i64;
    }
    out
}

pub fn encode(record: &Record) -> [u8; RECORD_LEN] {
    let mut out = [0u8; RECORD_LEN];
    out[0] = MAGIC;
    for (s, b) in record.iter().zip(out[1..].chunks_exact_mut(BLOCK_LEN)) {
        b[0..4].copy_from_slice(&s.ongoing.to_le_bytes());
        b[4..8].copy_from_slice(&s.success.to_le_bytes());
        b[8..12].copy_from_slice(&s.errors.to_le_bytes());
        b[12..16].copy_from_slice(&s.consecutive_errors.to_le_bytes());
        b[16..24].copy_from_slice(&s.ewma_ttft.to_bits().to_le_bytes());
        b[24..32].copy_from_slice(&s.ewma_total.to_bits().to_le_bytes());
        b[32..40].copy_from_slice(&(s.cooldown_until_ms as u64).to_le_bytes());
    }
    out
}

fn sampled(s: &Service) -> bool {
    s.success > 0 || s.errors > 0
}

/// The latency term of the score, None before the first sample.
fn latency(s: &Service) -> Option<f64> {
    sampled(s).then(|| {
        TTFT_WEIGHT * (s.ewma_ttft + 1.0).sqrt() + TOTAL_WEIGHT * (s.ewma_total + 1.0).sqrt()
    })
}

/// Lower is better. A service with no sample yet borrows the mean latency of those with one.
fn score(s: &Service, now_ms: i64, prior: Option<f64>) -> f64 {
    let mut load = 1.0 + f64::from(s.ongoing) / INFLIGHT_CAPACITY;
    if s.cooldown_until_ms > now_ms {
        load += f64::from(s.consecutive_errors) + 1.0;
    }
    let Some(latency) = latency(s).or(prior) else {
        return load;
    };
    let requests = s.success.saturating_add(s.errors);
    let error_rate = match requests {
        0 => 0.0,
        n => f64::from(s.errors) / f64::from(n),
    };
    latency * load * (1.0 + ERROR_PENALTY * error_rate)
}

/// The service with the lowest score (the first on a tie).
pub fn choose(record: &Record, now_ms: i64) -> usize {
    let (mut sum, mut known) = (0.0, 0u32);
    for l in record.iter().filter_map(latency) {
        sum += l;
        known += 1;
    }
    let prior = (known > 0).then(|| sum / f64::from(known));
    let mut best = (0, f64::INFINITY);
    for (i, s) in record.iter().enumerate() {
        let v = score(s, now_ms, prior);
        if v < best.1 {
            best = (i, v);
        }
    }
    best.0
}

fn ewma(old: f64, sample: f64, first: bool) -> f64 {
    match first {
        true => sample,
        false => BETA * old + (1.0 - BETA) * sample,
    }
}

/// Stream end of a request to service `i`: its count back, its samples in (a failure's
/// doubled and at least the slowest service's), and on a failure the cooldown.
pub fn on_end(
    r: &mut Record,
    i: usize,
    ttft_ms: Option<i64>,
    total_ms: i64,
    ok: bool,
    now_ms: i64,
) {
    let penalised = |ms: i64, slowest: f64| match ok {
        true => ms as f64,
        false => 2.0 * (ms as f64).max(slowest),
    };
    let slowest_ttft = r.iter().map(|s| s.ewma_ttft).fold(0.0, f64::max);
    let slowest_total = r.iter().map(|s| s.ewma_total).fold(0.0, f64::max);
    let Some(s) = r.get_mut(i) else {
        return;
    };
    let first = !sampled(s);
    s.ongoing = s.ongoing.saturating_sub(1);
    let total = penalised(total_ms, slowest_total);
    let ttft = ttft_ms.map_or(total, |t| penalised(t, slowest_ttft));
    s.ewma_ttft = ewma(s.ewma_ttft, ttft, first);
    s.ewma_total = ewma(s.ewma_total, total, first);
    if ok {
        s.success = s.success.saturating_add(1);
        s.consecutive_errors = 0;
    } else {
        s.errors = s.errors.saturating_add(1);
        s.consecutive_errors = s.consecutive_errors.saturating_add(1);
        s.cooldown_until_ms = now_ms.saturating_add(COOLDOWN_MS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written_and_garbage_reads_fresh() {
        let mut r = Record::default();
        r[1] = Service {
            ongoing: 3,
            success: 9,
            errors: 2,
            consecutive_errors: 1,
            ewma_ttft: 45.5,
            ewma_total: 80.25,
            cooldown_until_ms: 1234,
        };
        assert_eq!(decode(&encode(&r)), r);
        assert_eq!(decode(b"not a record"), Record::default());
        assert_eq!(decode(&encode(&r)[..RECORD_LEN - 1]), Record::default());
        let mut long = encode(&r).to_vec();
        long.push(0);
        assert_eq!(decode(&long), Record::default(), "one byte too many");
    }

    #[test]
    fn the_faster_service_wins_until_it_is_loaded() {
        let mut r = Record::default();
        for (i, ms) in [(0, 40), (1, 120), (2, 60)] {
            on_end(&mut r, i, Some(ms), 2 * ms, true, 0);
        }
        assert_eq!(choose(&r, 0), 0);
        r[0].ongoing = 16;
        assert_eq!(choose(&r, 0), 2, "llm-a at twice its capacity");
    }

    #[test]
    fn a_failure_costs_its_service_the_choice_and_counts_come_back() {
        let mut r = Record::default();
        for i in 0..N {
            r[i].ongoing = 1;
            on_end(&mut r, i, Some(40), 80, true, 0);
        }
        r[0].ongoing = 1;
        // A fast failure is sampled at twice the slowest EWMA, and cools llm-a down.
        on_end(&mut r, 0, None, 5, false, 100);
        assert_eq!(r[0].ongoing, 0);
        assert_eq!(r[0].ewma_total, 0.5 * 80.0 + 0.5 * 160.0);
        assert_eq!(r[0].cooldown_until_ms, 100 + COOLDOWN_MS);
        assert_ne!(choose(&r, 200), 0);
        on_end(&mut r, 0, None, 5, true, 200);
        assert_eq!(r[0].ongoing, 0, "never below zero");
    }
}
