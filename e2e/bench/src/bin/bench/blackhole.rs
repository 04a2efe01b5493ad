//! Failure memory against a black hole (issue 48, docs/redis-data-model.md §14): one of four
//! fake pods fails — every request answered 500 at once, half of them, or none answered (it
//! hangs until the gateway's upstream timeout answers 504) — while clients send 480 requests,
//! 16 at a time, through global_least_request gateways sharing one Redis. The routes have no
//! retry policy, so every failure the plugin lets through reaches the client: the usual default
//! of Envoy-based gateways (Istio's: connect failures and 503s) retries none of these faults.
//! One more run puts the 500s behind a route retrying every 5xx once (the emulator's router:
//! a retry ignores the override, docs/test-bed.md), where the plugin learns each failure from
//! the answer of another pod (docs/redis-data-model.md §14 "Served elsewhere"): its figures are
//! the clients' error share and the share of requests that paid a failed try first.
//!
//! Figures: the failing pod's share of the requests sent after the first ejection (or of all
//! requests when it never was), the clients' error share, the requests sent before the
//! ejection, the seconds from the pod healing to its first answer taken back (`ejectionMs` 5 s
//! here, 30 s on defaults), and the requests that reached the failing pod with four gateways
//! over one. Beside them: the same black hole without failure memory.

use crate::common::bench;
use ailb_e2e::bed::{chat, probe_until_zero, Bed};
use ailb_e2e::gateway::{glr_config, Gateway};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BAD: &str = "pod-0";
const REQUESTS: usize = 480;
const CLIENTS: usize = 16;
/// The ejection's first length here (30 s on defaults): the recovery figure waits it out.
const EJECTION_MS: u64 = 5_000;
/// The gateways' upstream timeout: what a hanging pod's requests wait for, then a 504.
const TIMEOUT_MS: u64 = 2_000;

/// How the failing pod fails.
#[derive(Clone, Copy)]
enum Fault {
    /// Every request answered 500 at once.
    All,
    /// Half the requests answered 500 at once (seeded draws), the rest served.
    Half,
    /// No request answered: the gateway's timeout answers 504.
    Hang,
}

/// One request as the client saw it: when it started (from the run's start), whether it went
/// to the failing pod, and its status (0: no answer).
struct Sent {
    at: Duration,
    bad: bool,
    status: u16,
}

/// One run's figures.
struct Outcome {
    sent: Vec<Sent>,
    /// When the gateways first counted an ejection (from the run's start).
    ejected_at: Option<Duration>,
}

impl Outcome {
    fn after_detection(&self) -> impl Iterator<Item = &Sent> {
        let from = self.ejected_at.unwrap_or_default();
        self.sent.iter().filter(move |s| s.at >= from)
    }

    /// The failing pod's share of the requests sent after the first ejection (of all when
    /// there was none).
    fn bad_share(&self) -> f64 {
        let (bad, n) = self
            .after_detection()
            .fold((0, 0), |(b, n), s| (b + usize::from(s.bad), n + 1));
        bad as f64 / n.max(1) as f64
    }

    fn error_share(&self) -> f64 {
        let errors = self.sent.iter().filter(|s| s.status != 200).count();
        errors as f64 / self.sent.len().max(1) as f64
    }

    fn to_detect(&self) -> usize {
        match self.ejected_at {
            Some(t) => self.sent.iter().filter(|s| s.at < t).count(),
            None => self.sent.len(),
        }
    }

    fn to_bad(&self) -> usize {
        self.sent.iter().filter(|s| s.bad).count()
    }
}

fn bed(fault: Fault) -> Bed {
    Bed::new(4, |c| {
        c.max_running = 64;
        // A healthy answer takes ~20 ms; a failing pod answers at once (or never).
        c.decode_us_per_token = 10_000;
        if c.name == BAD {
            (c.error_rate, c.error_fault) = match fault {
                Fault::All => (1.0, "status:500".into()),
                Fault::Half => (0.5, "status:500".into()),
                Fault::Hang => (1.0, "hang".into()),
            };
        }
    })
}

/// `n` gateways over `bed` with `lb` added to their `lb_config` and their route's `retry`
/// policy (None: none).
fn gateways(
    bed: &Bed,
    n: usize,
    (lb, retry): (&Value, Option<&Value>),
) -> anyhow::Result<Vec<Gateway>> {
    (0..n)
        .map(|i| {
            let mut spec = bed.spec(
                &format!("gw-{i}"),
                Some(glr_config(bed.redis.port, lb.clone())),
            );
            spec.upstream_timeout_ms = TIMEOUT_MS;
            spec.retry_policy = retry.cloned();
            Gateway::start(&spec)
        })
        .collect()
}

fn ejections(gws: &[Gateway]) -> i64 {
    sum(gws, "ai_lb.eject.ejected")
}

fn sum(gws: &[Gateway], stat: &str) -> i64 {
    gws.iter().map(|g| g.stat(stat)).sum()
}

/// [`REQUESTS`] requests from [`CLIENTS`] clients, round robin over the gateways, while a
/// watcher notes when the gateways first count an ejection.
fn send(gws: &[Gateway]) -> Outcome {
    let urls: Arc<Vec<String>> = Arc::new(gws.iter().map(|g| g.url.clone()).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let sent = Arc::new(Mutex::new(Vec::with_capacity(REQUESTS)));
    let done = AtomicBool::new(false);
    let t0 = Instant::now();
    let ejected_at = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                if ejections(gws) > 0 {
                    return Some(t0.elapsed());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            None
        });
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let (urls, next, sent) = (urls.clone(), next.clone(), sent.clone());
                s.spawn(move || loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= REQUESTS {
                        return;
                    }
                    let at = t0.elapsed();
                    let (status, pod) = chat(&urls[i % urls.len()], &format!("q{i}"), 2);
                    // A hanging pod's requests come back as the gateway's 504, named by no pod.
                    let bad = pod == BAD || status == 504;
                    if let Ok(mut v) = sent.lock() {
                        v.push(Sent { at, bad, status });
                    }
                })
            })
            .collect();
        for c in clients {
            let _ = c.join();
        }
        done.store(true, Ordering::Relaxed);
        watcher.join().ok().flatten()
    });
    let sent = std::mem::take(&mut *sent.lock().unwrap_or_else(|p| p.into_inner()));
    Outcome { sent, ejected_at }
}

/// Heals the failing pod and sends requests until it answers one: the seconds it took.
fn recovery_s(bed: &Bed, gws: &[Gateway]) -> f64 {
    bed.pods[0].engine().set_error_rate(0.0);
    let t0 = Instant::now();
    let limit = Duration::from_millis(6 * EJECTION_MS);
    let back = AtomicBool::new(false);
    std::thread::scope(|s| {
        for c in 0..CLIENTS {
            let (back, url) = (&back, gws[c % gws.len()].url.clone());
            s.spawn(move || {
                while !back.load(Ordering::Relaxed) && t0.elapsed() < limit {
                    let (status, pod) = chat(&url, "after", 2);
                    if status == 200 && pod == BAD {
                        back.store(true, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    t0.elapsed().as_secs_f64()
}

/// One black hole through `n` gateways: the run, its log line, and the gateways (for the
/// recovery run).
fn scenario(
    name: &str,
    fault: Fault,
    n: usize,
    lb: Value,
) -> anyhow::Result<(Outcome, Bed, Vec<Gateway>)> {
    scenario_with(name, fault, n, (lb, None))
}

/// [`scenario`] with the route's retry policy.
fn scenario_with(
    name: &str,
    fault: Fault,
    n: usize,
    (lb, retry): (Value, Option<Value>),
) -> anyhow::Result<(Outcome, Bed, Vec<Gateway>)> {
    let bed = bed(fault);
    let gws = gateways(&bed, n, (&lb, retry.as_ref()))?;
    let out = send(&gws);
    eprintln!(
        "  blackhole {name}: {} of {REQUESTS} to {BAD}, {} errors, ejected after {} requests \
         ({:?}), {} ejections",
        out.to_bad(),
        out.sent.iter().filter(|s| s.status != 200).count(),
        out.to_detect(),
        out.ejected_at,
        ejections(&gws)
    );
    Ok((out, bed, gws))
}

pub fn blackhole() -> anyhow::Result<()> {
    let memory = json!({"ejectionMs": EJECTION_MS});
    let (off, _, _) = scenario(
        "without memory",
        Fault::All,
        1,
        json!({"ejectAfterFailures": 0}),
    )?;
    bench(
        "blackhole_bad_pod_share_without_memory",
        off.bad_share(),
        "ratio",
    );

    let (one, bed, gws) = scenario("500 at once", Fault::All, 1, memory.clone())?;
    bench("blackhole_bad_pod_share", one.bad_share(), "ratio");
    bench("blackhole_client_error_share", one.error_share(), "ratio");
    bench(
        "blackhole_requests_to_detect",
        one.to_detect() as f64,
        "requests",
    );
    bench("blackhole_recovery_s", recovery_s(&bed, &gws), "s");
    let left = probe_until_zero(&bed, &gws[0].url, Duration::from_secs(10));
    anyhow::ensure!(left.is_zero(), "counts left after the black hole: {left:?}");
    drop((gws, bed));

    let (half, _, _) = scenario("half failing", Fault::Half, 1, memory.clone())?;
    bench(
        "blackhole_half_failing_bad_pod_share",
        half.bad_share(),
        "ratio",
    );
    let (hang, _, _) = scenario("hanging", Fault::Hang, 1, memory.clone())?;
    bench("blackhole_hanging_bad_pod_share", hang.bad_share(), "ratio");

    let (four, _, _) = scenario("500 at once, 4 gateways", Fault::All, 4, memory.clone())?;
    bench(
        "blackhole_4_gateways_over_1",
        four.to_bad() as f64 / one.to_bad().max(1) as f64,
        "ratio",
    );

    // Behind a retry of every 5xx: no client error either way; what failure memory saves is
    // the failed first tries (each a round trip to the black hole, then another pod's).
    let retry = json!({"retry_on": "5xx", "num_retries": 1});
    for (suffix, lb) in [
        ("_without_memory", json!({"ejectAfterFailures": 0})),
        ("", memory),
    ] {
        let name = format!("500 at once behind a 5xx retry{}", suffix.replace('_', " "));
        let (out, bed, gws) = scenario_with(&name, Fault::All, 1, (lb, Some(retry.clone())))?;
        let tries = sum(&gws, "gateway.upstream_rq_retry");
        eprintln!("    {tries} requests retried around {BAD}");
        let metric = format!("blackhole_behind_retry_failed_first_try_share{suffix}");
        bench(&metric, tries as f64 / REQUESTS as f64, "ratio");
        if suffix.is_empty() {
            let errors = out.error_share();
            bench("blackhole_behind_retry_client_error_share", errors, "ratio");
        }
        let left = probe_until_zero(&bed, &gws[0].url, Duration::from_secs(10));
        anyhow::ensure!(left.is_zero(), "counts left behind the retry: {left:?}");
    }
    Ok(())
}
