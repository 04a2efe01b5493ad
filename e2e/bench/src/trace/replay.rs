//! Replays a workload, time-compressed and in order, through gateway URLs or an in-process
//! router that sends straight to a pod, and records what every request got.
//!
//! Time: trace time t is sent at wall time t / `time_scale`; every duration recorded is wall
//! time × `time_scale`, i.e. trace time again. The pods run the same compression (their rates
//! × `time_scale`, docs/trace-bench.md "Scaling").

use super::client::{self, Answer};
use super::workload::{Built, Dialogue, Workload};
use ailb_fakepod::load::client::{new_client, HttpClient};
use ailb_fakepod::probe::hashes_for;
use ailb_fakepod::PodHandle;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::{sleep_until, Instant};

/// A request as an in-process router sees it.
pub struct Dispatch<'a> {
    pub index: usize,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
    /// The prompt's KV block hashes as the pods key them.
    pub hashes: &'a [u64],
}

/// A router in the bench process (the peers and oracles): picks an endpoint, hears the first
/// token and the end of each request it routed there. An endpoint is a pod, or with
/// [`Router::ranks_per_pod`] above 1 a data-parallel rank of one.
pub trait Router: Send + Sync {
    fn pick(&self, d: &Dispatch<'_>) -> usize;
    fn first_token(&self, _endpoint: usize, _index: usize) {}
    fn done(&self, _endpoint: usize, _index: usize) {}
    /// With `n` above 1, endpoint `i` is rank `i % n` of pod `i / n`: the request goes to that
    /// pod with `X-data-parallel-rank: i % n`, the way vLLM reads the rank
    /// (docs/disaggregated-serving.md §5).
    fn ranks_per_pod(&self) -> usize {
        1
    }
}

/// The header naming the data-parallel rank that serves a request (vLLM's spelling).
pub const RANK_HEADER: &str = "X-data-parallel-rank";

pub enum Target {
    /// Request `i` goes to `urls[i % n]` (gateways or Envoys).
    Urls(Vec<String>),
    /// Straight to the pod the router picks.
    Router(Arc<dyn Router>),
}

pub struct Options {
    pub time_scale: f64,
    /// Per request, wall time.
    pub timeout: Duration,
    /// Extra request headers.
    pub headers: Vec<(String, String)>,
    /// Run at these trace times, once each (e.g. flush a pod's cache).
    pub events: Vec<(Duration, Box<dyn FnOnce() + Send>)>,
    /// A load sweep stops starting conversations (and turns) once a stage's pod-side TTFT p90,
    /// over at least 20 answered requests, exceeds this: the stage is past the knee, and
    /// loading further only lengthens the run.
    pub stop_past: Option<Duration>,
}

impl Options {
    pub fn new(time_scale: f64) -> Self {
        Options {
            time_scale,
            timeout: Duration::from_secs(120),
            headers: Vec::new(),
            events: Vec::new(),
            stop_past: None,
        }
    }
}

/// What one request got, times in trace time.
#[derive(Clone, Debug, Default)]
pub struct Record {
    pub index: usize,
    pub conv: usize,
    pub turn: usize,
    pub stage: usize,
    /// When it was sent.
    pub at: Duration,
    pub pod: Option<usize>,
    /// The data-parallel rank that served it (the fake pod's `x-fake-rank`).
    pub rank: Option<usize>,
    pub status: u16,
    pub error: Option<String>,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub ttft_pod: Option<Duration>,
    pub ttft_client: Option<Duration>,
    /// Client side, from sending to the answer's last byte (end-to-end latency).
    pub e2e: Option<Duration>,
    /// The plugin's debug reason (`prefix_hit`, …), when its debug header was set.
    pub reason: Option<String>,
    /// The whole debug header (`endpoint=…; reason=…`, and whatever fields a policy adds).
    pub debug: Option<String>,
}

/// Pod index of an `x-pod` name `pod-<i>`.
pub fn pod_index(name: &str) -> Option<usize> {
    name.rsplit_once('-').and_then(|(_, i)| i.parse().ok())
}

/// Replays `w` through `target`; records come back in (conversation, turn) order. `pods` are
/// the fleet (the in-process router's destinations).
pub async fn replay(
    w: &Workload,
    pods: &[PodHandle],
    target: Target,
    opts: Options,
) -> Vec<Record> {
    let client = new_client();
    let urls: Arc<Vec<String>> = Arc::new(pods.iter().map(|p| p.url()).collect());
    let target = Arc::new(target);
    let start = Instant::now();
    let scale = opts.time_scale;
    let wall = move |t: Duration| t.div_f64(scale);
    let mut events = JoinSet::new();
    for (at, f) in opts.events {
        events.spawn(async move {
            sleep_until(start + wall(at)).await;
            f();
        });
    }
    // Request indices: conversation c's turn t is first_index[c] + t.
    let mut first_index = Vec::with_capacity(w.conversations.len());
    let mut n = 0;
    for c in &w.conversations {
        first_index.push(n);
        n += c.turns.len();
    }
    let hashes_from = pods.first().map(|p| p.engine().clone());
    let headers = Arc::new(opts.headers);
    let mut tasks = JoinSet::new();
    let convs = Arc::new(w.conversations.clone());
    let stop = Arc::new(Stop::new(w.stages.len().max(1), opts.stop_past));
    for (c, conv) in w.conversations.iter().enumerate() {
        sleep_until(start + wall(conv.start)).await;
        if stop.stopped() {
            break;
        }
        let ctx = (
            client.clone(),
            urls.clone(),
            target.clone(),
            headers.clone(),
            convs.clone(),
            hashes_from.clone(),
            stop.clone(),
        );
        let (timeout, first) = (opts.timeout, first_index[c]);
        tasks.spawn(async move {
            let (client, urls, target, headers, convs, engine, stop) = ctx;
            let conv = &convs[c];
            let mut dialogue = Dialogue::new(conv);
            let mut out = Vec::new();
            let mut turn = 0;
            while let Some(built) = dialogue.next_request() {
                if let (true, Some(at)) = (turn > 0, built.at) {
                    sleep_until(start + wall(at)).await;
                }
                if turn > 0 && stop.stopped() {
                    break;
                }
                let index = first + turn;
                let at = start.elapsed().mul_f64(scale);
                let output_tokens = built.output_tokens;
                let (pod, answer) = match &*target {
                    Target::Urls(u) => {
                        let url = format!("{}/v1/chat/completions", u[index % u.len()]);
                        (
                            None,
                            client::send(&client, &url, &headers, built.body, timeout, || {}).await,
                        )
                    }
                    Target::Router(r) => {
                        let (p, a) = routed(
                            &client,
                            &urls,
                            r.as_ref(),
                            engine.as_deref(),
                            built,
                            index,
                            &headers,
                            timeout,
                        )
                        .await;
                        (Some(p), a)
                    }
                };
                let mut r = record(index, c, turn, conv.stage, at, pod, answer, scale);
                r.output_tokens = output_tokens;
                stop.observe(&r);
                out.push(r);
                turn += 1;
            }
            out
        });
    }
    let mut records: Vec<Record> = tasks.join_all().await.into_iter().flatten().collect();
    events.abort_all();
    records.sort_by_key(|r| r.index);
    records
}

/// The sweep's stopping rule ([`Options::stop_past`]).
struct Stop {
    limit: Option<Duration>,
    ttfts: std::sync::Mutex<Vec<Vec<Duration>>>,
    stopped: std::sync::atomic::AtomicBool,
}

impl Stop {
    fn new(stages: usize, limit: Option<Duration>) -> Self {
        Stop {
            limit,
            ttfts: std::sync::Mutex::new(vec![Vec::new(); stages]),
            stopped: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn stopped(&self) -> bool {
        self.stopped.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn observe(&self, r: &Record) {
        let (Some(limit), Some(t)) = (self.limit, r.ttft_pod) else {
            return;
        };
        let mut all = self.ttfts.lock().unwrap_or_else(|e| e.into_inner());
        let Some(v) = all.get_mut(r.stage) else {
            return;
        };
        v.push(t);
        if v.len() >= 20 {
            let mut s = v.clone();
            s.sort();
            if s[s.len() * 9 / 10] > limit {
                self.stopped
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn routed(
    client: &HttpClient,
    urls: &[String],
    router: &dyn Router,
    engine: Option<&ailb_fakepod::engine::Engine>,
    built: Built,
    index: usize,
    headers: &[(String, String)],
    timeout: Duration,
) -> (usize, Answer) {
    let (prompt_tokens, hashes) = match engine {
        Some(e) => hashes_for(e, &built.canonical),
        None => (0, Vec::new()),
    };
    let endpoint = router.pick(&Dispatch {
        index,
        prompt_tokens,
        output_tokens: built.output_tokens,
        hashes: &hashes,
    });
    let per_pod = router.ranks_per_pod().max(1);
    let pod = endpoint / per_pod;
    let mut with_rank;
    let headers = if per_pod > 1 {
        with_rank = headers.to_vec();
        with_rank.push((RANK_HEADER.into(), (endpoint % per_pod).to_string()));
        &with_rank[..]
    } else {
        headers
    };
    let url = format!("{}/v1/chat/completions", urls[pod]);
    let mut first = false;
    let a = client::send(client, &url, headers, built.body, timeout, || {
        first = true;
        router.first_token(endpoint, index);
    })
    .await;
    if !first {
        router.first_token(endpoint, index);
    }
    router.done(endpoint, index);
    (pod, a)
}

#[allow(clippy::too_many_arguments)]
fn record(
    index: usize,
    conv: usize,
    turn: usize,
    stage: usize,
    at: Duration,
    pod: Option<usize>,
    a: Answer,
    scale: f64,
) -> Record {
    let trace = |d: Duration| d.mul_f64(scale);
    Record {
        index,
        conv,
        turn,
        stage,
        at,
        pod: pod.or_else(|| a.pod.as_deref().and_then(pod_index)),
        rank: a.rank,
        status: a.status,
        error: a.error,
        prompt_tokens: a.prompt_tokens.unwrap_or(0),
        cached_tokens: a.cached_tokens.unwrap_or(0),
        output_tokens: 0,
        ttft_pod: a.pod_ttft.map(trace),
        ttft_client: a.first_byte.map(trace),
        e2e: a.last_byte.map(trace),
        reason: debug_field(a.debug.as_deref(), "reason").map(String::from),
        debug: a.debug,
    }
}

/// Field `name` of a debug header `k=v; k=v; …`.
pub fn debug_field<'a>(debug: Option<&'a str>, name: &str) -> Option<&'a str> {
    debug?.split(';').find_map(|kv| {
        let (k, v) = kv.trim().split_once('=')?;
        (k == name).then_some(v)
    })
}
