//! The Redis Cluster bed (e2e/suite/src/redis_cluster.rs): pick throughput through Envoy's
//! `redis_proxy` over all three shards, and the master failover drill under load.

use ailb_core::config::Ejection;
use ailb_core::redis::resp::Value;
use ailb_core::redis::scripts::release::{release_call, Learned};
use ailb_core::redis::scripts::{self, AcquireArgs, Keys, Scripts};
use ailb_core::upstream::fingerprint;
use ailb_e2e::cluster3::{drill, Fleet};
use ailb_e2e::redis_cluster::{failover_budget, time_until, PASSWORD, USER};
use ailb_testkit::Conn;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CONNECTIONS: usize = 8;
const BATCH: usize = 32;
/// Namespaces (route, cluster) the picks spread over: hash tags on every shard.
const NAMESPACES: usize = 48;

/// Least-request picks, each followed by its release, pipelined `BATCH` at a time on
/// `CONNECTIONS` authenticated connections to the proxy, each pick on a random namespace.
/// Picks per second of wall time (a pick and its release counted once).
fn picks_per_s(fleet: &Fleet, seconds: f64) -> anyhow::Result<f64> {
    let port = fleet.redis.proxy.port;
    let scripts = Arc::new(Scripts::new());
    let eps: Arc<Vec<String>> = Arc::new((0..8).map(|i| format!("10.0.0.{i}:8000")).collect());
    let fp: Arc<str> = fingerprint(&eps).into();
    let keys: Arc<Vec<Keys>> = Arc::new(
        (0..NAMESPACES)
            .map(|i| Keys::new("ailb", &format!("bench-{i}"), "outbound|8000||llm.static"))
            .collect(),
    );
    let mut c = Conn::try_connect(port)?;
    anyhow::ensure!(c.cmd(&["AUTH", USER, PASSWORD]) == Value::Simple("OK".into()));
    for s in scripts.all() {
        // The proxy sends SCRIPT LOAD to every master.
        c.cmd(&[b"SCRIPT".as_slice(), b"LOAD", s.text.as_bytes()]);
    }
    let shards: std::collections::BTreeSet<Option<u16>> = keys
        .iter()
        .map(|k| fleet.redis.master_of(&k.load))
        .collect();
    anyhow::ensure!(shards.len() == 3, "namespaces on every shard: {shards:?}");
    for k in keys.iter() {
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
            trials: Ejection::DEFAULT.trials(),
        };
        let r = c.cmd_raw(&scripts::acquire_call(&scripts, true, k, &args));
        let Value::Array(Some(items)) = r else {
            anyhow::bail!("sync: {r:?}");
        };
        let ep = items.get(1).and_then(|v| v.as_str()).unwrap_or_default();
        let rel = release(&scripts, k, scripts::lease_member("sync", ep, 1, None));
        anyhow::ensure!(c.cmd_raw(&rel) == Value::Integer(1), "sync release");
    }
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|t| {
            let (scripts, fp, keys) = (scripts.clone(), fp.clone(), keys.clone());
            std::thread::spawn(move || -> anyhow::Result<u64> {
                let mut conn = Conn::try_connect(port)?;
                anyhow::ensure!(conn.cmd(&["AUTH", USER, PASSWORD]) == Value::Simple("OK".into()));
                let mut rng: u64 = 0x9e37_79b9_7f4a_7c15 ^ t as u64;
                let mut seq = 0u64;
                let mut done = 0u64;
                while Instant::now() < deadline {
                    let mut picked = Vec::with_capacity(BATCH);
                    let queries: Vec<Vec<u8>> = (0..BATCH)
                        .map(|_| {
                            seq += 1;
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            let k = &keys[(rng as usize) % keys.len()];
                            let rid = format!("b{t:02}{seq:x}");
                            let args = AcquireArgs {
                                now_ms: 1_000_000 + seq,
                                lease_ttl_ms: 600_000,
                                request_id: &rid,
                                cost: 1,
                                cap: 0,
                                random: (rng >> 32) as u32,
                                fingerprint: &fp,
                                reclaim: scripts::RECLAIM_LIMIT, // as the plugin sends on every acquire
                                endpoints: None,
                                session: None,
                                wait_rank: None,
                                pool_cap: 0,
                                tenant: None,
                                trials: Ejection::DEFAULT.trials(),
                            };
                            let q = scripts::acquire_call(&scripts, true, k, &args);
                            picked.push((k, rid));
                            q
                        })
                        .collect();
                    let mut releases = Vec::with_capacity(BATCH);
                    for ((k, rid), reply) in picked.iter().zip(conn.pipeline(&queries)) {
                        let Value::Array(Some(items)) = reply else {
                            anyhow::bail!("pick failed: {reply:?}");
                        };
                        let ep = items.get(1).and_then(|v| v.as_str()).unwrap_or_default();
                        releases.push(release(
                            &scripts,
                            k,
                            scripts::lease_member(rid, ep, 1, None),
                        ));
                    }
                    for r in conn.pipeline(&releases) {
                        anyhow::ensure!(r == Value::Integer(1), "release: {r:?}");
                    }
                    done += BATCH as u64;
                }
                Ok(done)
            })
        })
        .collect();
    let mut total = 0;
    for w in workers {
        total += w.join().map_err(|_| anyhow::anyhow!("worker panicked"))??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

pub fn cluster3() -> anyhow::Result<()> {
    let mut fleet = Fleet::new(8, |c| {
        c.max_running = 256;
        c.decode_us_per_token = 2_000;
        c.decode_batch_penalty = 0.0;
        c.prefill_us_per_token = 1;
    });
    let rate = picks_per_s(&fleet, 5.0)?;
    println!("BENCH cluster3_redis_picks_per_s {rate:.0} picks/s");

    let lease_ttl = 3;
    let gws = fleet.gateways(2, PASSWORD, lease_ttl);
    let routes = fleet.routes();
    let d = drill(
        &mut fleet,
        &gws,
        &routes,
        6,
        Duration::from_millis(1500),
        Duration::from_secs(lease_ttl + 12),
        |f| {
            let victim = f.redis.masters()[0].clone();
            f.redis.node_mut(victim.port).kill();
            let took = time_until(failover_budget(), || {
                f.redis.serving()
                    && f.redis
                        .masters()
                        .iter()
                        .any(|m| victim.replicas.contains(&m.port))
            })
            .unwrap_or(failover_budget());
            f.redis.wait_proxy(failover_budget());
            took
        },
    );
    eprintln!(
        "cluster3 failover: {} requests, promoted after {} ms, healed {} ms after the load; negative seen {}",
        d.requests,
        d.fault_ms,
        d.heal_ms,
        d.negative.len()
    );
    println!("BENCH cluster3_failover_requests_lost {} requests", d.lost);
    println!("BENCH cluster3_failover_leaked_counts {} counts", d.leaked);
    println!(
        "BENCH cluster3_failover_fallback_share {:.3} ratio",
        d.fallback_share()
    );
    Ok(())
}

/// A release as the plugin sends one after an answer, failure memory on (its defaults).
fn release(scripts: &Scripts, keys: &Keys, member: String) -> Vec<u8> {
    let learned = (Learned::Answered, 1_000_000, &Ejection::DEFAULT);
    release_call((scripts, true), keys, &[member], false, learned)
}
