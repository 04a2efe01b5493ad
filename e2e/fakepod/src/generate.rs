//! Generation of one request on a fake pod: tokenize and hash the prompt, queue and prefill in
//! the engine, then decode token by token (streamed or as one body).

use crate::body::{json_resp, ChannelBody, RespBody};
use crate::engine::{Engine, Job, Running};
use crate::latency::Timer;
use crate::openai::{self, error_body, token_text, GenRequest, RespMeta, Usage};
use crate::pd::prefill::{self as pd_prefill, Offer, Prefilled};
use crate::pd::request::{Act, PdJob, Produce};
use crate::tokenize::{block_hashes, tokenize, ApiKind};
use ailb_core::hash::{fnv1a, FNV_OFFSET};
use bytes::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::Response;
use hyper::StatusCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio::time::{sleep, sleep_until, Instant};

/// Everything decided about a request before it enters the engine.
struct Plan {
    job: Job,
    hashes: Vec<u64>,
    /// Blocks of prompt + answer, cached once the answer is complete (vLLM keeps the KV of
    /// generated tokens too, so a conversation's next turn hits through the previous answer).
    after: Vec<u64>,
    out_tokens: u64,
    seed: u64,
    meta: RespMeta,
    include_usage: bool,
    stream: bool,
    /// When the pod had the whole request: pod-side TTFT counts from here.
    arrived: Instant,
    /// Responses with `store`: the conversation's text after the answer, stored under the
    /// response's id once the answer is complete (responses_store.rs).
    stored: Option<String>,
    /// The request's prefill or decode side in a disaggregated deployment (pd/).
    pd: Option<PdJob>,
    /// The request's number on the pod (TensorRT-LLM `ctx_request_id`).
    n: u64,
    /// The canonical prompt, kept only for the P/D side (a prefill pod offers it).
    prompt: String,
}

fn plan(engine: &Engine, gen: &GenRequest, n: u64) -> Plan {
    let cfg = &engine.cfg;
    let lora = engine.lora_for(gen.model.as_deref());
    let tokens = tokenize(&gen.prompt);
    let namespace = lora.as_deref().unwrap_or(&cfg.served_model_name);
    let hashes = block_hashes(namespace, &tokens, cfg.block_tokens);
    let answered = openai::after_answer(
        gen.kind,
        &gen.prompt,
        &openai::answer_text(&gen.prompt, out_tokens_of(cfg, gen)),
    );
    let after = block_hashes(namespace, &tokenize(&answered), cfg.block_tokens);
    let stored = gen.store.then(|| answered.clone());
    let out_tokens = out_tokens_of(cfg, gen);
    let prefix = match gen.kind {
        ApiKind::Chat => "chatcmpl",
        ApiKind::Completions => "cmpl",
        ApiKind::Responses => "resp",
        ApiKind::Messages => "msg",
    };
    Plan {
        job: Job {
            prompt_tokens: tokens.len() as u64,
            block_hashes: hashes.clone(),
            lora,
            output_tokens: out_tokens_of(cfg, gen),
        },
        hashes,
        after,
        out_tokens,
        seed: fnv1a(FNV_OFFSET, gen.prompt.as_bytes()),
        meta: RespMeta {
            id: format!("{prefix}-{}-{n}", cfg.name),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            model: gen
                .model
                .clone()
                .unwrap_or_else(|| cfg.served_model_name.clone()),
            kind: gen.kind,
        },
        include_usage: gen.include_usage,
        stream: gen.stream,
        arrived: Instant::now(),
        stored,
        pd: None,
        n,
        prompt: String::new(),
    }
}

/// A complete Responses answer is stored for a later `previous_response_id`.
fn store(engine: &Engine, p: &Plan) {
    if let Some(text) = &p.stored {
        engine.cfg.responses.put(&p.meta.id, text.clone());
    }
}

fn out_tokens_of(cfg: &crate::config::PodConfig, gen: &GenRequest) -> u64 {
    gen.max_tokens
        .unwrap_or(cfg.default_max_tokens)
        .clamp(1, cfg.max_output_tokens.max(1))
}

/// Queue, then prefill: sleeps for the uncached part of the prompt and caches its blocks.
/// With a prefill lane the lookup, the prefill and the commit happen at the lane's head, one
/// request at a time (lane.rs). A decode pod given a prefill pod's parameters pulls the KV
/// instead (pd/decode.rs); `Err` is then a failed pull's message.
async fn prefill(engine: &Arc<Engine>, p: &Plan) -> Result<Running, String> {
    if let Some(PdJob {
        rank,
        act: Act::Consume(pull),
    }) = &p.pd
    {
        return crate::pd::decode::prefill_pulled(engine, &p.job, &p.hashes, rank, pull).await;
    }
    Ok(prefill_here(engine, p).await)
}

/// The prefill lane's or the per-token prefill of [`prefill`].
async fn prefill_here(engine: &Arc<Engine>, p: &Plan) -> Running {
    let mut run = engine.admit(&p.job).await;
    // A slow-to-first-token service: prefill and the first decode step (which follows at
    // once) take `ttft_multiplier` times as long.
    let m = engine.cfg.ttft_multiplier.max(1.0);
    if let Some(lane) = engine.lane() {
        let turn = lane.enter(p.job.prompt_tokens - engine.peek(&p.job)).await;
        run.hit_tokens = engine.lookup(&p.job);
        let uncached = p.job.prompt_tokens - run.hit_tokens;
        turn.prefill((uncached as f64 * m) as u64).await;
        run.commit_prompt(&p.hashes);
        drop(turn);
        sleep(engine.decode_step().mul_f64(m - 1.0)).await;
        return run;
    }
    let uncached = p.job.prompt_tokens - run.hit_tokens;
    let prefill = Duration::from_micros(uncached * engine.cfg.prefill_us_per_token);
    sleep(prefill.mul_f64(m) + engine.decode_step().mul_f64(m - 1.0)).await;
    run.commit_prompt(&p.hashes);
    run
}

/// Decodes the next `n` tokens (one batch step each; step deadlines are absolute so short
/// steps don't accumulate timer slack).
async fn next_tokens(engine: &Engine, deadline: &mut Instant, run: &mut Running, n: u64) {
    *deadline += engine.decode_step() * n as u32;
    sleep_until(*deadline).await;
    run.add_generated(n);
}

/// Output tokens `[from, to)` by events: the first token alone (TTFT), then
/// `stream_interval` tokens per event.
fn groups(out_tokens: u64, interval: usize) -> impl Iterator<Item = (u64, u64)> {
    let step = interval.max(1) as u64;
    let mut from = 0;
    std::iter::from_fn(move || {
        if from >= out_tokens {
            return None;
        }
        let to = if from == 0 {
            1
        } else {
            (from + step).min(out_tokens)
        };
        let g = (from, to);
        from = to;
        Some(g)
    })
}

/// The request's timings as its engine's latency histograms record them (latency.rs).
fn timer(engine: &Engine, p: &Plan) -> Timer {
    let cfg = &engine.cfg;
    Timer::new(cfg.engine, cfg.role, p.stream, p.out_tokens, p.arrived)
}

fn micros(d: Duration) -> u64 {
    d.as_micros() as u64
}

/// Serves one parsed completion request (`n` numbers it for the response id): streamed as SSE
/// or as one JSON body.
pub async fn generate(engine: Arc<Engine>, gen: GenRequest, n: u64) -> Response<RespBody> {
    generate_pd(engine, gen, n, None).await
}

/// The prefill side's offer, once its prompt is prefilled: what the answer then names.
fn offer(p: &Plan) -> Option<(Produce, Offer)> {
    let PdJob {
        rank,
        act: Act::Produce(produce),
    } = p.pd.as_ref()?
    else {
        return None;
    };
    let offer = pd_prefill::offer(rank, produce, &prefilled(p));
    Some((produce.clone(), offer))
}

fn prefilled(p: &Plan) -> Prefilled<'_> {
    Prefilled {
        request_id: &p.meta.id,
        seq: p.n,
        prompt: &p.prompt,
        prompt_tokens: p.job.prompt_tokens,
        block_hashes: &p.hashes,
        first_token: token_text(p.seed, 0),
    }
}

/// [`generate`] with the request's P/D side, if any.
pub async fn generate_pd(
    engine: Arc<Engine>,
    mut gen: GenRequest,
    n: u64,
    pd: Option<PdJob>,
) -> Response<RespBody> {
    // An SGLang prefill server and a TensorRT-LLM context_only request make exactly one
    // token (§2, §4); vLLM's prefill makes what `max_tokens` asks (the proxy sends 1).
    if let Some(PdJob {
        act: Act::Produce(Produce::Sglang { .. } | Produce::Trt { .. }),
        ..
    }) = &pd
    {
        gen.max_tokens = Some(1);
    }
    let mut p = plan(&engine, &gen, n);
    if pd.is_some() {
        p.prompt = gen.prompt.clone();
    }
    p.pd = pd;
    if gen.stream {
        let (tx, body) = ChannelBody::pair(64);
        tokio::spawn(async move {
            // A client that goes away cancels the request and frees its slot, as vLLM aborts.
            tokio::select! {
                _ = tx.closed() => {}
                _ = stream_tokens(&engine, &p, &tx) => {}
            }
        });
        let mut r = Response::new(body);
        let h = r.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        h.insert("cache-control", HeaderValue::from_static("no-cache"));
        return r;
    }
    let mut run = match prefill(&engine, &p).await {
        Ok(run) => run,
        // docs/disaggregated-serving.md §1 says only that vLLM's `fail` policy ends the
        // request "with an error finish reason"; the fake answers it as a server error, 500
        // (unverified), and an SGLang room that never arrives the same way (unverified).
        Err(msg) => return json_resp(StatusCode::INTERNAL_SERVER_ERROR, error_body(500, &msg)),
    };
    let offered = offer(&p);
    let mut deadline = Instant::now();
    let mut text = String::new();
    let mut ttft = Duration::ZERO;
    let mut timer = timer(&engine, &p);
    for (from, to) in groups(p.out_tokens, engine.cfg.stream_interval) {
        next_tokens(&engine, &mut deadline, &mut run, to - from).await;
        let now = Instant::now();
        timer.tokens(&mut engine.latency(), from, to, now);
        if from == 0 {
            ttft = now - p.arrived;
        }
        (from..to).for_each(|i| text.push_str(token_text(p.seed, i)));
    }
    run.commit_prompt(&p.after);
    store(&engine, &p);
    let usage = Usage {
        prompt: p.job.prompt_tokens,
        completion: p.out_tokens,
        cached: run.hit_tokens,
        timing: Some((micros(ttft), micros(run.queue_wait))),
    };
    let mut body = p.meta.full(&text, usage);
    if let (Some((produce, offer)), Some(job)) = (&offered, &p.pd) {
        if let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&body) {
            pd_prefill::decorate(&job.rank, produce, &prefilled(&p), offer, &mut v);
            body = v.to_string();
        }
    }
    let mut r = json_resp(StatusCode::OK, body);
    let h = r.headers_mut();
    h.insert(
        "x-fake-queue-us",
        HeaderValue::from(run.queue_wait.as_micros() as u64),
    );
    h.insert("x-fake-cached-tokens", HeaderValue::from(run.hit_tokens));
    r
}

async fn stream_tokens(
    engine: &Arc<Engine>,
    p: &Plan,
    tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
) {
    let mut run = match prefill(engine, p).await {
        Ok(run) => run,
        Err(msg) => {
            // Headers are out: the error goes as an event, as vLLM streams one.
            let event = format!("data: {}\n\n{}", error_body(500, &msg), openai::DONE);
            let _ = tx.send(Ok(event.into())).await;
            return;
        }
    };
    // Only SGLang's prefill offers KV to a streamed request: its decode pod finds it by room.
    // vLLM's and TensorRT-LLM's proxies ask prefill pods for non-streamed answers (§1, §2),
    // the only kind that can carry the parameters.
    if matches!(
        &p.pd,
        Some(PdJob {
            act: Act::Produce(Produce::Sglang { .. }),
            ..
        })
    ) {
        let _ = offer(p);
    }
    let mut usage = Usage {
        prompt: p.job.prompt_tokens,
        completion: p.out_tokens,
        cached: run.hit_tokens,
        timing: None,
    };
    let open = p.meta.open(usage);
    if !open.is_empty() && tx.send(Ok(open.into())).await.is_err() {
        return;
    }
    let mut deadline = Instant::now();
    let mut text = String::new();
    let mut ttft = Duration::ZERO;
    let mut timer = timer(engine, p);
    for (from, to) in groups(p.out_tokens, engine.cfg.stream_interval) {
        next_tokens(engine, &mut deadline, &mut run, to - from).await;
        let now = Instant::now();
        timer.tokens(&mut engine.latency(), from, to, now);
        let finish = (to == p.out_tokens).then_some("length");
        let piece: String = (from..to).map(|i| token_text(p.seed, i)).collect();
        text.push_str(&piece);
        if from == 0 {
            ttft = now - p.arrived;
        }
        if tx
            .send(Ok(p.meta.chunk(&piece, from, finish).into()))
            .await
            .is_err()
        {
            return;
        }
    }
    usage.cached = run.hit_tokens;
    usage.timing = Some((micros(ttft), micros(run.queue_wait)));
    run.commit_prompt(&p.after);
    store(engine, p);
    drop(run); // the request is finished before the closing events go out
    let close = p.meta.close(&text, usage, p.include_usage);
    let _ = tx.send(Ok(close.into())).await;
}
