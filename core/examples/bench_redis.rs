//! Redis CPU per pick and per release (`INFO commandstats` usec_per_call), measured under load:
//! 8 connections issuing pipelined EVALSHA batches in steady state (about 2 requests in flight
//! per endpoint). Acquire and release batches alternate behind a barrier so each is measured
//! on its own, at a constant load. A trivial script (`return 1`) measured the same way in the
//! same run gives the floor; the ratio to it is what holds on a noisy machine.
//!
//! Run: `cargo run --release --example bench_redis` (needs redis-server on PATH).

// A benchmark driver, not plugin code: failing loudly on a broken setup is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ailb_core::redis::resp::Value;
use ailb_core::redis::scripts::{self, AcquireArgs, Keys, PrefixArgs, Scripts, SessionArgs};
use ailb_core::upstream::fingerprint;
use ailb_testkit::{command_stats, Conn, RedisServer};
use std::collections::VecDeque;
use std::sync::{Arc, Barrier};

const CONNECTIONS: usize = 8;
const BATCH: usize = 32;
const ROUNDS: usize = 60;

struct Measured {
    pick_us: f64,
    release_us: f64,
}

fn endpoints(n: usize) -> Vec<String> {
    let mut v: Vec<String> = (0..n)
        .map(|i| format!("10.{}.{}.{}:8000", i / 65536, i / 256 % 256, i % 256))
        .collect();
    v.sort();
    v
}

/// Alternating measured phases; returns usec per acquire and per release.
fn measure_glr(redis: &RedisServer, hosts: usize) -> Measured {
    measure(redis, hosts, 0, false)
}

/// Distinct sessions the sticky measurement draws from: most picks find their session bound
/// (kept), a few bind it (docs/redis-data-model.md §10).
const STICKY_SESSIONS: u64 = 2048;

/// Like `measure_glr`, but each pick is a prefix_cache pick of a prompt of `blocks` blocks whose
/// first `blocks - 2` are known (the previous turn of its conversation) and whose last two are
/// new (the answer and the next question): the steady state of a multi-turn chat.
/// `sticky`: every pick also carries a session (`sessionHeader`), drawn from
/// [`STICKY_SESSIONS`].
fn measure(redis: &RedisServer, hosts: usize, blocks: usize, sticky: bool) -> Measured {
    let tag = if sticky { "s" } else { "" };
    let keys = Arc::new(Keys::new(
        "ailb",
        "bench",
        &format!("outbound|8000||llm{hosts}{tag}.static"),
    ));
    let scripts = Arc::new(Scripts::new());
    let eps = Arc::new(endpoints(hosts));
    let fp: Arc<str> = fingerprint(&eps).into();
    let mut c = redis.conn();
    for s in scripts.all() {
        c.cmd(&[b"SCRIPT".as_slice(), b"LOAD", s.text.as_bytes()]);
    }
    // Sync the membership once, as the first pick of a gateway does.
    let args = AcquireArgs {
        now_ms: 1,
        lease_ttl_ms: 600_000,
        request_id: "sync",
        cost: 1,
        cap: 0,
        random: 0,
        fingerprint: &fp,
        reclaim: 0,
        endpoints: Some(&eps),
        session: None,
        wait_rank: None,
        pool_cap: 0,
        tenant: None,
    };
    c.cmd_raw(&scripts::acquire_call(&scripts, true, &keys, &args));

    // Conversations and their known prefixes (previous turns), pointing at some endpoint.
    const SESSIONS: usize = 64;
    let known = blocks.saturating_sub(2);
    let sessions: Arc<Vec<Vec<String>>> = Arc::new(
        (0..SESSIONS)
            .map(|s| {
                (0..known)
                    .map(|b| format!("{}:px:{s:08x}{b:08x}", keys.namespace))
                    .collect()
            })
            .collect(),
    );
    for (s, chain) in sessions.iter().enumerate() {
        let owner = &eps[s % eps.len()];
        let sets: Vec<Vec<u8>> = chain
            .iter()
            .map(|k| {
                ailb_core::redis::resp::encode_command(&[
                    "SET",
                    k.as_str(),
                    owner.as_str(),
                    "EX",
                    "3600",
                ])
            })
            .collect();
        c.pipeline(&sets);
    }
    let in_flight_per_conn = (2 * hosts).div_ceil(CONNECTIONS).max(BATCH);
    let barrier = Arc::new(Barrier::new(CONNECTIONS + 1));
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|t| {
            let (keys, scripts, eps, fp, barrier) = (
                keys.clone(),
                scripts.clone(),
                eps.clone(),
                fp.clone(),
                barrier.clone(),
            );
            let sessions = sessions.clone();
            let port = redis.port;
            std::thread::spawn(move || {
                let mut conn = Conn::try_connect(port).unwrap();
                let mut held: VecDeque<String> = VecDeque::new();
                let mut seq: u64 = 0;
                let mut rng: u64 = 0x2545_f491_4f6c_dd1d ^ t as u64;
                let mut acquire_batch = |conn: &mut Conn, held: &mut VecDeque<String>, n: usize| {
                    let mut rids = Vec::with_capacity(n);
                    let queries: Vec<Vec<u8>> = (0..n)
                        .map(|_| {
                            seq += 1;
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            let rid = format!("b{t:02}{seq:x}");
                            let session = sticky.then(|| {
                                let id = format!("user-{}", (rng >> 16) % STICKY_SESSIONS);
                                scripts::session_key(&keys.namespace, id.as_bytes())
                            });
                            let args = AcquireArgs {
                                now_ms: 1_000_000 + seq,
                                lease_ttl_ms: 600_000,
                                request_id: &rid,
                                cost: 1,
                                cap: 0,
                                random: (rng >> 32) as u32,
                                fingerprint: &fp,
                                reclaim: if seq.is_multiple_of(16) { 4 } else { 0 },
                                endpoints: None,
                                session: session.as_deref().map(|key| SessionArgs {
                                    key,
                                    ttl_s: 1800,
                                    max_imbalance: 8,
                                    max_imbalance_ratio: 1.5,
                                }),
                                wait_rank: None,
                                pool_cap: 0,
                                tenant: None,
                            };
                            // The conversation's known prefix plus this turn's two new blocks.
                            let mut chain = sessions[(rng as usize) % sessions.len()].clone();
                            if blocks > 0 {
                                chain.push(format!("{}:px:a{t:02}{seq:013x}", keys.namespace));
                                chain.push(format!("{}:px:b{t:02}{seq:013x}", keys.namespace));
                            }
                            let prefix = PrefixArgs {
                                chain: &chain,
                                ttl_s: 1800,
                                max_imbalance: 8,
                                max_imbalance_ratio: 1.5,
                            };
                            let q = scripts::pick_call(
                                &scripts,
                                true,
                                &keys,
                                &args,
                                (blocks > 0).then_some(&prefix),
                            );
                            rids.push(rid);
                            q
                        })
                        .collect();
                    for (rid, reply) in rids.iter().zip(conn.pipeline(&queries)) {
                        let Value::Array(Some(items)) = reply else {
                            panic!("acquire failed: {reply:?}")
                        };
                        let ep = items[1].as_str().unwrap().to_string();
                        held.push_back(scripts::lease_member(rid, &ep, 1, None));
                    }
                };
                // Warm up to the steady-state number of leases (not measured).
                while held.len() < in_flight_per_conn {
                    acquire_batch(&mut conn, &mut held, BATCH);
                }
                let _ = &eps;
                for _ in 0..ROUNDS {
                    barrier.wait(); // measured: acquires
                    acquire_batch(&mut conn, &mut held, BATCH);
                    barrier.wait();
                    barrier.wait(); // measured: releases of the oldest leases
                    let queries: Vec<Vec<u8>> = held
                        .drain(..BATCH)
                        .map(|m| scripts::release_call(&scripts, true, &keys, &[m]))
                        .collect();
                    for r in conn.pipeline(&queries) {
                        assert_eq!(r, Value::Integer(1), "release must find its lease");
                    }
                    barrier.wait();
                }
            })
        })
        .collect();
    let (mut pick, mut release) = ((0u64, 0u64), (0u64, 0u64));
    for _ in 0..ROUNDS {
        c.cmd(&["CONFIG", "RESETSTAT"]);
        barrier.wait();
        barrier.wait();
        let (calls, usec) = command_stats(&mut c, "evalsha");
        pick = (pick.0 + calls, pick.1 + usec);
        c.cmd(&["CONFIG", "RESETSTAT"]);
        barrier.wait();
        barrier.wait();
        let (calls, usec) = command_stats(&mut c, "evalsha");
        release = (release.0 + calls, release.1 + usec);
    }
    for w in workers {
        w.join().unwrap();
    }
    Measured {
        pick_us: pick.1 as f64 / pick.0 as f64,
        release_us: release.1 as f64 / release.0 as f64,
    }
}

/// `return 1` under the same load shape.
fn measure_floor(redis: &RedisServer) -> f64 {
    let mut c = redis.conn();
    let sha = c
        .cmd(&["SCRIPT", "LOAD", "return 1"])
        .as_str()
        .unwrap()
        .to_string();
    let query = ailb_core::redis::resp::encode_command(&["EVALSHA", sha.as_str(), "0"]);
    c.cmd(&["CONFIG", "RESETSTAT"]);
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let (port, q) = (redis.port, query.clone());
            std::thread::spawn(move || {
                let mut conn = Conn::try_connect(port).unwrap();
                let batch: Vec<Vec<u8>> = vec![q; BATCH];
                for _ in 0..ROUNDS * 2 {
                    conn.pipeline(&batch);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let (calls, usec) = command_stats(&mut c, "evalsha");
    usec as f64 / calls as f64
}

fn main() {
    let redis = RedisServer::start();
    let floor_before = measure_floor(&redis);
    let mut picks = Vec::new();
    let mut release = 0.0;
    for hosts in [4, 64, 256, 4096] {
        let m = measure_glr(&redis, hosts);
        picks.push((hosts, m.pick_us));
        if hosts == 256 {
            release = m.release_us;
        }
    }
    // prefix_cache: a chat of T turns has 2T blocks (system, then user/assistant pairs).
    let mut prefix = Vec::new();
    for (name, blocks) in [
        ("turns1", 2),
        ("turns5", 10),
        ("turns20", 40),
        ("blocks100", 100),
    ] {
        prefix.push((name, measure(&redis, 64, blocks, false).pick_us));
    }
    // Session stickiness on top of least-request, side by side with plain least-request at the
    // same endpoint count (measured again next to it: the machine's noise moves both alike).
    // Fifteen adjacent pairs; the median of the pairs' differences is the session's cost (a few
    // noisy pairs move neither), the least of each side the absolute figures.
    let (mut plain256, mut sticky256) = (f64::MAX, f64::MAX);
    let mut diffs = Vec::new();
    for _ in 0..15 {
        let plain = measure_glr(&redis, 256).pick_us;
        let sticky = measure(&redis, 256, 0, true).pick_us;
        plain256 = plain256.min(plain);
        sticky256 = sticky256.min(sticky);
        diffs.push(sticky - plain);
    }
    diffs.sort_by(f64::total_cmp);
    let session_cost = diffs[diffs.len() / 2];
    // Floor measured before and after; the mean is the reference for the ratio.
    let floor = (floor_before + measure_floor(&redis)) / 2.0;
    for (hosts, us) in &picks {
        println!("BENCH redis_us_per_pick_glr_hosts{hosts} {us:.2} us");
    }
    println!("BENCH redis_us_per_release_glr {release:.2} us");
    for (name, us) in &prefix {
        println!("BENCH redis_us_per_pick_prefix_{name} {us:.2} us");
    }
    println!("BENCH redis_us_trivial_script_floor {floor:.2} us");
    let at256 = picks.iter().find(|(h, _)| *h == 256).map_or(0.0, |p| p.1);
    println!(
        "BENCH redis_pick_over_floor_glr_hosts256 {:.1} ratio",
        at256 / floor
    );
    println!(
        "BENCH redis_pick_over_floor_glr_session {:.1} ratio",
        sticky256 / floor
    );
    println!(
        "BENCH redis_pick_over_floor_glr_session_vs_plain_hosts256 {:.1} ratio",
        session_cost / floor
    );
    let turns20 = prefix
        .iter()
        .find(|(n, _)| *n == "turns20")
        .map_or(0.0, |p| p.1);
    println!(
        "BENCH redis_pick_over_floor_prefix_turns20 {:.1} ratio",
        turns20 / floor
    );
    match std::fs::metadata(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../dist/ai-load-balancer.wasm"
    )) {
        Ok(m) => println!("BENCH wasm_module_bytes {} bytes", m.len()),
        Err(_) => {
            eprintln!("dist/ai-load-balancer.wasm not built (make build): module size not reported")
        }
    }
}
