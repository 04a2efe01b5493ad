//! prefix_cache's latency-aware placement against a real redis-server (docs/latency-model.md
//! §5, docs/redis-data-model.md §15), through the plugin's own call builders, models and reply
//! parser: two gateways' models merge into one fleet record and every gateway predicts with
//! it; records fade by the half-life; the pick places by predicted TTFT, keeps a warm pod that
//! meets the objective, leaves one that does not, and sheds only a sheddable request and only
//! when nothing meets it, taking nothing.

// Test scaffolding helpers outside #[test] fns fail loudly by design.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_core::config::TokenGate;
use ailb_core::latency::{Book, Features, Outcome, Prior};
use ailb_core::redis::scripts::latency::{csv, merge_call, parse_merged, Batch, Merge};
use ailb_core::redis::scripts::{
    self, AcquireArgs, AcquireReply, Keys, LatencyArgs, PrefixArgs, PrefixChain, Scripts,
};
use ailb_core::upstream::fingerprint;
use ailb_testkit::{Conn, RedisServer};

const A: &str = "10.0.0.1:8000";
const B: &str = "10.0.0.2:8000";
const C: &str = "10.0.0.3:8000";
const HALF_LIFE_MS: u64 = 600_000;

struct Bed {
    keys: Keys,
    scripts: Scripts,
    eps: Vec<String>,
    fp: String,
}

impl Bed {
    fn new() -> Bed {
        let eps: Vec<String> = [A, B, C].iter().map(|e| e.to_string()).collect();
        Bed {
            keys: Keys::new("ailb", "chat", "llm"),
            scripts: Scripts::new(),
            fp: fingerprint(&eps),
            eps,
        }
    }

    /// One gateway's merge: its unsent samples and coefficients out, the fleet's records back.
    fn merge(&self, c: &mut Conn, book: &mut Book, now_ms: u64) {
        let batch = (now_ms, book.take_unsent());
        let coefficients: Vec<(String, Vec<f64>)> = book
            .coefficients()
            .into_iter()
            .map(|(p, v)| (p, v.to_vec()))
            .collect();
        let q = merge_call(
            &self.keys,
            &Merge {
                now_ms,
                half_life_ms: HALF_LIFE_MS,
                sender: &format!("{:p}", book as *const Book),
                batches: &[batch],
                coefficients: &coefficients,
            },
        );
        let fleet = parse_merged(&c.raw_reply(&q)).unwrap();
        book.merged(&fleet);
    }

    /// Sets a pod's coefficients as a merge writes them.
    fn set_coef(&self, c: &mut Conn, ep: &str, v: [f64; 6]) {
        c.cmd(&["HSET", &self.keys.latency_coef, ep, &csv(&v)]);
    }

    fn acquire(
        &self,
        c: &mut Conn,
        rid: &str,
        chain: &PrefixChain,
        latency: LatencyArgs,
        random: u32,
    ) -> AcquireReply {
        let send = |sync: bool, c: &mut Conn| {
            let args = AcquireArgs {
                now_ms: 1_000,
                lease_ttl_ms: 60_000,
                request_id: rid,
                cost: 1,
                cap: 0,
                random,
                fingerprint: &self.fp,
                reclaim: 4,
                endpoints: sync.then_some(self.eps.as_slice()),
                session: None,
                wait_rank: None,
                pool_cap: 0,
                tenant: None,
                trials: 0,
            };
            let prefix = PrefixArgs {
                chain,
                ttl_s: 1800,
                max_imbalance: 1000,
                max_imbalance_ratio: 1000.0,
                gate: TokenGate::default(),
                latency: Some(latency),
            };
            let q = scripts::pick_call(&self.scripts, false, &self.keys, &args, Some(&prefix));
            scripts::parse_acquire(&c.raw_reply(&q)).unwrap()
        };
        match send(false, c) {
            AcquireReply::Sync => send(true, c),
            other => other,
        }
    }

    /// (endpoint, spilled, predicted TTFT ms, rounded down).
    fn pick(
        &self,
        c: &mut Conn,
        rid: &str,
        chain: &PrefixChain,
        l: LatencyArgs,
    ) -> (String, bool, u64) {
        match self.acquire(c, rid, chain, l, 0) {
            AcquireReply::Picked {
                endpoint,
                spilled,
                booked,
                ..
            } => {
                let p = booked.and_then(|b| b.predicted).expect("a prediction");
                (endpoint, spilled, p.ttft_us / 1000)
            }
            other => panic!("{other:?}"),
        }
    }

    fn load(&self, c: &mut Conn) -> Vec<String> {
        match c.cmd(&["ZRANGE", &self.keys.load, "0", "-1", "WITHSCORES"]) {
            ailb_core::redis::resp::Value::Array(Some(v)) => v
                .iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect(),
            other => panic!("{other:?}"),
        }
    }
}

/// A chain of `blocks` keys of 1,000 tokens each, named by `conv`, of a prompt of `prompt`.
fn chain(keys: &Keys, conv: &str, blocks: u64, prompt: u64) -> PrefixChain {
    PrefixChain {
        keys: (1..=blocks)
            .map(|i| format!("{}:px:{conv}{i:04}", keys.namespace))
            .collect(),
        cached_tokens: (1..=blocks).map(|i| i * 1000).collect(),
        prompt_tokens: prompt,
        stream: true,
    }
}

fn no_slo() -> LatencyArgs {
    LatencyArgs::default()
}

/// The TTFT weight of `pod`'s fleet record (field 9 of its CSV, stats.rs `to_fields`).
fn ttft_weight(c: &mut Conn, keys: &Keys, pod: &str) -> f64 {
    let record = c.cmd(&["HGET", &keys.latency, pod]);
    let fields: Vec<&str> = record.as_str().unwrap().split(',').collect();
    fields[9].parse().unwrap()
}

#[test]
fn two_gateways_merge_into_one_fleet_record_that_fades() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let bed = Bed::new();
    let prior = Prior::from_rates(16_000.0, 30.0, 8.0);
    let (mut g1, mut g2) = (Book::new(prior), Book::new(prior));
    // Pod A prefills 2,000 tokens/s: each gateway sees half of its answers.
    for i in 0..40u32 {
        let f = Features {
            ahead_tokens: f64::from(i % 5) * 1_000.0,
            uncached_tokens: f64::from(i % 3) * 1_000.0 + 500.0,
            running: f64::from(i % 4),
            prompt_tokens: 4_000.0,
        };
        let o = Outcome {
            ttft_ms: 10.0 + (f.ahead_tokens + f.uncached_tokens) / 2.0,
            tpot_ms: Some(20.0 + 2.0 * f.running),
        };
        if i % 2 == 0 { &mut g1 } else { &mut g2 }
            .learn(A, &f, &o)
            .unwrap();
    }
    bed.merge(&mut c, &mut g1, 1_000);
    bed.merge(&mut c, &mut g2, 1_100);
    bed.merge(&mut c, &mut g1, 1_200); // g1 reads g2's half back, and writes coefficients
    let x = Features {
        ahead_tokens: 3_000.0,
        uncached_tokens: 1_000.0,
        running: 2.0,
        prompt_tokens: 4_000.0,
    };
    for g in [&g1, &g2] {
        // g2 has not read g1's later merge yet, but holds every sample (it merged after g1).
        let p = g.predict(A, &x);
        assert!((p.ttft_ms - 2_010.0).abs() < 60.0, "{p:?}");
        assert!((p.tpot_ms - 24.0).abs() < 1.5, "{p:?}");
    }
    // The record holds both gateways' 40 samples' weight.
    let record = c.cmd(&["HGET", &bed.keys.latency, A]);
    let fields: Vec<f64> = record
        .as_str()
        .unwrap()
        .split(',')
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(fields[9], 40.0, "TTFT weight");
    // Coefficients for A and the fleet prior are there for the pick script.
    let coef = c.cmd(&["HGET", &bed.keys.latency_coef, A]);
    assert_eq!(coef.as_str().unwrap().split(',').count(), 6);
    assert!(c
        .cmd(&["HGET", &bed.keys.latency_coef, "*"])
        .as_str()
        .is_some());
    // One half-life later the fleet's weight has halved (whoever merges applies it, once).
    let mut g3 = Book::new(prior);
    bed.merge(&mut c, &mut g3, 1_200 + HALF_LIFE_MS);
    let w = ttft_weight(&mut c, &bed.keys, A);
    // Decayed from the first merge's stamp (1,000 ms: the later ones were under a hundredth of
    // a half-life apart).
    let want = 40.0 * 0.5f64.powf((HALF_LIFE_MS + 200) as f64 / HALF_LIFE_MS as f64);
    assert!((w - want).abs() < 1e-9, "{w} {want}");
    // A gateway that found A is no longer the pod its model knew replaces A's record.
    let mut g4 = Book::new(prior);
    let f = Features {
        ahead_tokens: 0.0,
        uncached_tokens: 1_000.0,
        running: 0.0,
        prompt_tokens: 1_000.0,
    };
    let o = Outcome {
        ttft_ms: 2_000.0,
        tpot_ms: None,
    };
    g4.learn(A, &f, &o).unwrap();
    let mut sent = g4.take_unsent();
    sent[0].0 = format!("!{A}");
    g4.restore(&sent);
    bed.merge(&mut c, &mut g4, 1_250 + HALF_LIFE_MS);
    let w = ttft_weight(&mut c, &bed.keys, A);
    assert_eq!(w, 1.0, "replaced by the one answer");
    // A garbage record sent by a broken gateway is ignored; the rest still merge.
    let q = scripts::latency::merge_call(
        &bed.keys,
        &Merge {
            now_ms: 1_300 + HALF_LIFE_MS,
            half_life_ms: HALF_LIFE_MS,
            sender: "broken",
            batches: &[(1, vec![(B.into(), vec![f64::NAN; 3])])],
            coefficients: &[],
        },
    );
    let fleet = parse_merged(&c.raw_reply(&q)).unwrap();
    assert_eq!(fleet.len(), 1, "{fleet:?}");
    assert_eq!(fleet[0].0, A);
}

#[test]
fn a_request_goes_where_its_ttft_is_predicted_lowest() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let bed = Bed::new();
    // A prefills at 2,000 tokens/s, B at 20,000, C at 5,000 (ms per 1,000 tokens).
    bed.set_coef(&mut c, A, [10.0, 500.0, 0.0, 30.0, 1.0, 0.0]);
    bed.set_coef(&mut c, B, [10.0, 50.0, 0.0, 30.0, 1.0, 0.0]);
    bed.set_coef(&mut c, C, [10.0, 200.0, 0.0, 30.0, 1.0, 0.0]);
    let (ep, spilled, ttft) = bed.pick(&mut c, "r1", &chain(&bed.keys, "x", 2, 2_000), no_slo());
    assert_eq!((ep.as_str(), spilled, ttft), (B, false, 110));
    // B now has 2,000 tokens booked ahead: 10 + 100 + 100 = 210 ms, C 410 ms: B again.
    let (ep, _, ttft) = bed.pick(&mut c, "r2", &chain(&bed.keys, "y", 2, 2_000), no_slo());
    assert_eq!((ep.as_str(), ttft), (B, 210));
    // With 40,000 tokens ahead on B (2,000 ms + ...), C is sooner.
    c.cmd(&["ZADD", &bed.keys.prefill, "40000", B]);
    let (ep, _, ttft) = bed.pick(&mut c, "r3", &chain(&bed.keys, "z", 2, 2_000), no_slo());
    assert_eq!((ep.as_str(), ttft), (C, 410));
}

#[test]
fn the_warm_pod_is_kept_while_it_meets_the_objective() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let bed = Bed::new();
    for ep in [A, B, C] {
        bed.set_coef(&mut c, ep, [10.0, 100.0, 0.0, 30.0, 1.0, 0.0]);
    }
    let slo = |ttft| LatencyArgs {
        slo_ttft_ms: ttft,
        slo_tpot_ms: 0,
        sheddable: false,
    };
    // A conversation's first turn, 4,000 tokens.
    let t1 = chain(&bed.keys, "c", 4, 4_000);
    let (warm, _, _) = bed.pick(&mut c, "r1", &t1, slo(1_000));
    // Its next turn: 1,000 new tokens on the warm pod, with 6,000 tokens booked ahead there
    // (10 + 600 + 100 = 710 ms) against 10 + 500 = 510 ms on a cold one: kept under 1 s.
    c.cmd(&["ZADD", &bed.keys.prefill, "6000", &warm]);
    let t2 = chain(&bed.keys, "c", 5, 5_000);
    let (ep, spilled, ttft) = bed.pick(&mut c, "r2", &t2, slo(1_000));
    assert_eq!((ep.as_str(), spilled, ttft), (warm.as_str(), false, 710));
    // Under a 600 ms objective the warm pod misses and a cold one meets it: spilled.
    c.cmd(&["ZADD", &bed.keys.prefill, "6000", &warm]);
    let (ep, spilled, ttft) = bed.pick(&mut c, "r3", &t2, slo(600));
    assert_ne!(ep, warm);
    assert!(spilled);
    assert_eq!(ttft, 510);
    // Without an objective the warm pod is kept within the penalty (5 s).
    let (ep, spilled, _) = bed.pick(&mut c, "r4", &t2, no_slo());
    assert_eq!((ep.as_str(), spilled), (warm.as_str(), false));
}

#[test]
fn only_a_sheddable_request_is_shed_and_only_for_a_predicted_miss() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let bed = Bed::new();
    for ep in [A, B, C] {
        // 1 s per 1,000 tokens.
        bed.set_coef(&mut c, ep, [0.0, 1_000.0, 0.0, 30.0, 0.0, 0.0]);
    }
    let t = chain(&bed.keys, "s", 2, 2_000);
    let args = |sheddable| LatencyArgs {
        slo_ttft_ms: 1_000,
        slo_tpot_ms: 0,
        sheddable,
    };
    // Predicted 2,000 ms against 1,000: a miss of 2, shed with probability 1/2. The draw
    // (random % 1000003 / 1000003) decides: under 1/2 sheds, over it places.
    match bed.acquire(&mut c, "r1", &t, args(true), 100) {
        AcquireReply::Shed(p) => assert_eq!(p.ttft_us, 2_000_000),
        other => panic!("{other:?}"),
    }
    assert!(
        bed.load(&mut c).iter().all(|s| s == "0" || s.contains(':')),
        "nothing taken"
    );
    assert!(matches!(
        bed.acquire(&mut c, "r2", &t, args(true), 900_000),
        AcquireReply::Picked { .. }
    ));
    // Not sheddable (a critical or standard request): placed, whatever the draw.
    assert!(matches!(
        bed.acquire(&mut c, "r3", &t, args(false), 100),
        AcquireReply::Picked { .. }
    ));
    // Meeting the objective: never shed.
    let short = chain(&bed.keys, "q", 1, 500);
    assert!(matches!(
        bed.acquire(&mut c, "r4", &short, args(true), 0),
        AcquireReply::Picked { .. }
    ));
}

#[test]
fn a_batch_sent_again_after_a_lost_reply_is_applied_once() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let bed = Bed::new();
    let mut g = Book::new(Prior::from_rates(16_000.0, 30.0, 8.0));
    let f = Features {
        ahead_tokens: 0.0,
        uncached_tokens: 1_000.0,
        running: 0.0,
        prompt_tokens: 1_000.0,
    };
    let o = Outcome {
        ttft_ms: 100.0,
        tpot_ms: None,
    };
    let send = |c: &mut Conn, batches: &[Batch]| {
        let q = merge_call(
            &bed.keys,
            &Merge {
                now_ms: 1_000,
                half_life_ms: HALF_LIFE_MS,
                sender: "gw-1",
                batches,
                coefficients: &[],
            },
        );
        parse_merged(&c.raw_reply(&q)).unwrap()
    };
    g.learn(A, &f, &o).unwrap();
    let first = (1, g.take_unsent());
    send(&mut c, std::slice::from_ref(&first));
    // Its reply was lost: the gateway sends batch 1 again with its next one.
    g.learn(A, &f, &o).unwrap();
    let second = (2, g.take_unsent());
    let fleet = send(&mut c, &[first, second]);
    assert_eq!(fleet.len(), 1);
    assert_eq!(fleet[0].1[9], 2.0, "two answers, each counted once");
}

/// The rule's table (core/src/latency/choose_cases.rs), which the plain-Envoy pick's unit test
/// runs through `latency::choose`.
#[path = "../src/latency/choose_cases.rs"]
mod cases;

#[test]
fn the_script_follows_the_rules_table() {
    use cases::{Want, CASES};
    const CAP: u64 = 10;
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let bed = Bed::new();
    let pods = [A, B, C];
    for (n, case) in CASES.iter().enumerate() {
        c.cmd(&["FLUSHALL"]);
        // Each pod predicts its case's constant TTFT and TPOT at its case's load; one the case
        // lists as ineligible (or does not list) is at the cap.
        for (i, pod) in pods.iter().enumerate() {
            let (ttft, tpot, load, eligible) = case.pods.get(i).copied().unwrap_or_default();
            bed.set_coef(&mut c, pod, [ttft, 0.0, 0.0, tpot, 0.0, 0.0]);
            let load = if eligible { load } else { CAP };
            c.cmd(&["ZADD", &bed.keys.load, &load.to_string(), pod]);
        }
        let t = chain(&bed.keys, &format!("case{n}-"), 1, 1_000);
        if let Some(w) = case.warm {
            c.cmd(&["SET", &t.keys[0], pods[w]]);
        }
        let latency = LatencyArgs {
            slo_ttft_ms: case.slo.0,
            slo_tpot_ms: case.slo.1,
            sheddable: case.shed_draw.is_some(),
        };
        let random = (case.shed_draw.unwrap_or(0.0) * 1_000_003.0) as u32;
        let send = |sync: bool, c: &mut Conn| {
            let args = AcquireArgs {
                now_ms: 1_000,
                lease_ttl_ms: 60_000,
                request_id: "r",
                cost: 1,
                cap: CAP,
                random,
                fingerprint: &bed.fp,
                reclaim: 4,
                endpoints: sync.then_some(bed.eps.as_slice()),
                session: None,
                wait_rank: None,
                pool_cap: 0,
                tenant: None,
                trials: 0,
            };
            let prefix = PrefixArgs {
                chain: &t,
                ttl_s: 1800,
                max_imbalance: 1000,
                max_imbalance_ratio: 1000.0,
                gate: TokenGate {
                    penalty_ms: case.penalty_ms,
                    ..TokenGate::default()
                },
                latency: Some(latency),
            };
            let q = scripts::pick_call(&bed.scripts, false, &bed.keys, &args, Some(&prefix));
            scripts::parse_acquire(&c.raw_reply(&q)).unwrap()
        };
        let reply = match send(false, &mut c) {
            AcquireReply::Sync => send(true, &mut c),
            other => other,
        };
        let got = match reply {
            AcquireReply::Picked { endpoint, .. } => {
                Want::Place(pods.iter().position(|p| *p == endpoint).unwrap())
            }
            AcquireReply::Shed(_) => Want::Shed,
            AcquireReply::Full => Want::Nothing,
            other => panic!("{}: {other:?}", case.says),
        };
        assert_eq!(got, case.want, "{}", case.says);
    }
}
