//! A fake pod's handle: it binds, serves until shut down, or dies holding its port.

use crate::config::PodConfig;
use crate::dp::Ranks;
use crate::engine::{Engine, Snapshot};
use crate::server::{serve_conn, Ctx};
use anyhow::{Context as _, Result};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

/// A running fake pod. Dropping it stops the server and aborts its connections.
pub struct PodHandle {
    pub name: String,
    pub addr: SocketAddr,
    ranks: Arc<Ranks>,
    stop: Option<oneshot::Sender<Stop>>,
    /// The accept loop (None once a dead pod took it).
    task: Option<tokio::task::JoinHandle<()>>,
}

/// How the accept loop ends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The port is released.
    Release,
    /// The port stays bound and every connection is reset at once ([`PodHandle::die`]).
    Reset,
}

/// A pod that died holding its port ([`PodHandle::die`]); dropping it releases the port.
pub struct DeadPod {
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for DeadPod {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl PodHandle {
    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Current engine state (same as `GET /admin/state`).
    pub fn state(&self) -> Snapshot {
        self.ranks.snapshot()
    }

    /// The engine (for in-process assertions); rank 0's when the pod has several.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.ranks.first().engine
    }

    /// The pod's data-parallel ranks (one without DP).
    pub fn ranks(&self) -> &Arc<Ranks> {
        &self.ranks
    }

    /// Stops accepting, aborts open connections and waits for the accept loop to end.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(Stop::Release);
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// Dies as a crashed pod does, for as long as the returned handle lives: open connections
    /// are aborted and every new one is reset at once. Unlike [`PodHandle::shutdown`] the port
    /// stays bound, so that a test running beside this one, binding a free port, cannot take it
    /// and answer health checks and requests in the dead pod's place.
    pub fn die(mut self) -> DeadPod {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(Stop::Reset);
        }
        // The accept loop goes on resetting; it ends when the DeadPod is dropped.
        DeadPod {
            task: self.task.take(),
        }
    }
}

impl Drop for PodHandle {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Binds `cfg.listen` and serves until the handle is shut down or dropped.
pub async fn spawn_pod(cfg: PodConfig) -> Result<PodHandle> {
    let listener = TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("bind {}", cfg.listen))?;
    let addr = listener.local_addr()?;
    let name = cfg.name.clone();
    let ranks = Arc::new(Ranks::new(&cfg, addr));
    let ctx = Arc::new(Ctx {
        ranks: ranks.clone(),
        ids: AtomicU64::new(0),
        received: AtomicU64::new(0),
    });
    let (stop_tx, mut stop_rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        // Connections live in this set so that stopping the pod aborts them all.
        let mut conns = JoinSet::new();
        let stop = loop {
            tokio::select! {
                stop = &mut stop_rx => break stop.unwrap_or(Stop::Release),
                accepted = listener.accept() => {
                    if let Ok((stream, _)) = accepted {
                        conns.spawn(serve_conn(stream, ctx.clone()));
                    }
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        };
        conns.shutdown().await;
        if stop == Stop::Reset {
            loop {
                // An RST, not a FIN: the client sees the connection reset, as from a dead
                // process.
                if let Ok((stream, _)) = listener.accept().await {
                    let _ = stream.set_zero_linger();
                }
            }
        }
    });
    Ok(PodHandle {
        name,
        addr,
        ranks,
        stop: Some(stop_tx),
        task: Some(task),
    })
}
