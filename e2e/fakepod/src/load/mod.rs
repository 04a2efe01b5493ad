//! Load generator: seeded workloads against one or more gateway URLs, measured client-side
//! (TTFT, latency, errors, `x-pod` spread) and, optionally, server-side via the pods' admin API.

pub mod cli;
pub mod client;
pub mod plan;
pub mod spec;
pub mod stats;

pub use plan::{plan, Plan, PlannedRequest};
pub use spec::*;
pub use stats::{Percentiles, PodReport, Summary};

use crate::engine::Snapshot;
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use client::{new_client, send, HttpClient, Outcome};
use http_body_util::{BodyExt, Full};
use std::sync::Arc;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::{sleep_until, Instant};

/// Runs the workload and returns its summary.
pub async fn run(cfg: &LoadConfig) -> Result<Summary> {
    run_plan(cfg, &plan(cfg)).await
}

/// Runs `plan` (made from `cfg` by [`plan()`], then edited: e.g. a routing header the caller
/// chooses per request) and returns its summary; `sequence` is the edited plan's fingerprint.
pub async fn run_plan(cfg: &LoadConfig, plan: &Plan) -> Result<Summary> {
    Ok(run_plan_outcomes(cfg, plan).await?.0)
}

/// [`run_plan`], also returning every request's outcome in plan order (e.g. which pod served
/// each round of a session).
pub async fn run_plan_outcomes(cfg: &LoadConfig, plan: &Plan) -> Result<(Summary, Vec<Outcome>)> {
    if cfg.targets.is_empty() {
        bail!("no target URLs");
    }
    let client = new_client();
    if cfg.reset_pods {
        for url in &cfg.admin_urls {
            admin_reset(&client, url).await?;
        }
    }
    let started = Instant::now();
    let outcomes = match &cfg.workload {
        Workload::Sessions(s) => run_sessions(cfg, &client, plan, s.concurrency).await,
        Workload::Skewed(_) | Workload::Hold(_) => run_open_loop(cfg, &client, plan).await,
    };
    let mut summary = Summary::build(
        cfg.workload.name(),
        cfg.seed,
        &cfg.targets,
        plan.fingerprint(),
        &outcomes,
        started.elapsed(),
    );
    if !cfg.admin_urls.is_empty() {
        let mut pods = Vec::new();
        for url in &cfg.admin_urls {
            pods.push(admin_state(&client, url).await?);
        }
        summary.pods = Some(PodReport::from_pods(pods));
    }
    Ok((summary, outcomes))
}

/// Closed loop: sessions start in index order as one of `concurrency` slots frees; a session's
/// rounds run back to back.
async fn run_sessions(
    cfg: &LoadConfig,
    client: &HttpClient,
    plan: &Plan,
    concurrency: usize,
) -> Vec<Outcome> {
    let slots = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut by_session: Vec<Vec<PlannedRequest>> = Vec::new();
    for r in &plan.requests {
        let s = r.session.map(|(s, _)| s).unwrap_or(0);
        if by_session.len() <= s {
            by_session.resize(s + 1, Vec::new());
        }
        by_session[s].push(r.clone());
    }
    let mut tasks = JoinSet::new();
    for rounds in by_session {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            break;
        };
        let (client, targets, path, limit) = (
            client.clone(),
            cfg.targets.clone(),
            cfg.api.path(),
            cfg.timeout,
        );
        tasks.spawn(async move {
            let mut outs = Vec::new();
            for r in rounds {
                outs.push(send(&client, &targets[r.target], path, &r, limit).await);
            }
            drop(permit);
            outs
        });
    }
    let mut outcomes: Vec<Outcome> = tasks.join_all().await.into_iter().flatten().collect();
    outcomes.sort_by_key(|o| o.index);
    outcomes
}

/// Open loop: each request is sent at its planned offset regardless of earlier responses.
async fn run_open_loop(cfg: &LoadConfig, client: &HttpClient, plan: &Plan) -> Vec<Outcome> {
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for r in plan.requests.clone() {
        if let Some(at) = r.at {
            sleep_until(start + at).await;
        }
        let (client, base, path, limit) = (
            client.clone(),
            cfg.targets[r.target].clone(),
            cfg.api.path(),
            cfg.timeout,
        );
        tasks.spawn(async move { send(&client, &base, path, &r, limit).await });
    }
    let mut outcomes = tasks.join_all().await;
    outcomes.sort_by_key(|o| o.index);
    outcomes
}

async fn admin_reset(client: &HttpClient, base: &str) -> Result<()> {
    let url = format!("{}/admin/reset?cache=1", base.trim_end_matches('/'));
    let req = hyper::Request::post(&url).body(Full::new(Bytes::new()))?;
    let resp = client
        .request(req)
        .await
        .with_context(|| format!("POST {url}"))?;
    if !resp.status().is_success() {
        bail!("POST {url}: {}", resp.status());
    }
    Ok(())
}

/// `GET {base}/admin/state` of a fake pod.
pub async fn admin_state(client: &HttpClient, base: &str) -> Result<Snapshot> {
    let url = format!("{}/admin/state", base.trim_end_matches('/'));
    let req = hyper::Request::get(&url).body(Full::new(Bytes::new()))?;
    let resp = client
        .request(req)
        .await
        .with_context(|| format!("GET {url}"))?;
    let body = resp.into_body().collect().await?.to_bytes();
    serde_json::from_slice(&body).with_context(|| format!("GET {url}: bad JSON"))
}
