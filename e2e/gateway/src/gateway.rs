//! Process assembly: compile the plugin once, start N worker threads (each accepting on a
//! clone of the listening socket with its own VM and event loop) and the admin thread. They run
//! until the [`Gateway`] is dropped (the binary never drops it; in-process tests do).

use crate::config::Config;
use crate::shared::Shared;
use crate::vm::Plugin;
use crate::worker::Worker;
use anyhow::{anyhow, Context, Result};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::net::{SocketAddr, TcpListener};
use std::sync::{mpsc, Arc};
use tokio::sync::watch;

/// The plugin refused its configuration: the process must exit with status 2.
#[derive(Debug)]
pub struct ConfigRejected(pub String);
impl std::fmt::Display for ConfigRejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "plugin configuration rejected: {}", self.0)
    }
}
impl std::error::Error for ConfigRejected {}

pub struct Gateway {
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub shared: Arc<Shared>,
    /// Dropped with the gateway: every worker and the admin thread then stop accepting and
    /// end, dropping their VMs.
    _stop: watch::Sender<()>,
}

/// Compiles `cfg.plugin.wasm` (if any) and starts the gateway.
pub fn start(cfg: Config) -> Result<Gateway> {
    let plugin = match &cfg.plugin {
        Some(p) => {
            let path = cfg.resolve(&p.wasm);
            let bytes =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            Some(Arc::new(Plugin::load(&bytes)?))
        }
        None => None,
    };
    start_with(cfg, plugin)
}

/// Starts the gateway on an already compiled plugin, which stands for `cfg.plugin.wasm`
/// (`cfg.plugin` still gives its configuration): many gateways, one compilation (tests that
/// start one gateway per plugin configuration).
pub fn start_with(cfg: Config, plugin: Option<Arc<Plugin>>) -> Result<Gateway> {
    let listener =
        TcpListener::bind(&cfg.listen).with_context(|| format!("bind {}", cfg.listen))?;
    listener.set_nonblocking(true)?;
    let admin = TcpListener::bind(&cfg.admin).with_context(|| format!("bind {}", cfg.admin))?;
    admin.set_nonblocking(true)?;
    let shared = Shared::new(cfg)?;
    let (stop, stopped) = watch::channel(());
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    for idx in 0..shared.cfg.workers {
        let l = listener.try_clone()?;
        let shared = shared.clone();
        let plugin = plugin.clone();
        let ready = ready_tx.clone();
        let stopped = stopped.clone();
        std::thread::Builder::new()
            .name(format!("worker-{idx}"))
            .spawn(move || run_worker(idx, shared, plugin, l, ready, stopped))?;
    }
    drop(ready_tx);
    for _ in 0..shared.cfg.workers {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) if e.contains("proxy_on_configure") => {
                return Err(anyhow!(ConfigRejected(e)))
            }
            Ok(Err(e)) => return Err(anyhow!(e)),
            Err(_) => return Err(anyhow!("worker thread died during start")),
        }
    }
    let admin_addr = admin.local_addr()?;
    crate::admin::spawn(shared.clone(), admin, stopped)?;
    Ok(Gateway {
        listen: listener.local_addr()?,
        admin: admin_addr,
        shared,
        _stop: stop,
    })
}

fn run_worker(
    idx: usize,
    shared: Arc<Shared>,
    plugin: Option<Arc<Plugin>>,
    listener: TcpListener,
    ready: mpsc::Sender<Result<(), String>>,
    mut stopped: watch::Receiver<()>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(e.to_string()));
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let worker = match Worker::new(idx, shared, plugin) {
            Ok(w) => w,
            Err(e) => {
                let _ = ready.send(Err(format!("{e:#}")));
                return;
            }
        };
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                let _ = ready.send(Err(e.to_string()));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        loop {
            let accepted = tokio::select! {
                // Err: the Gateway was dropped. Leaving drops the LocalSet's tasks (open
                // streams, Redis connections, the ticker) and then the worker and its VM.
                _ = stopped.changed() => return,
                a = listener.accept() => a,
            };
            let Ok((sock, _)) = accepted else {
                continue;
            };
            let _ = sock.set_nodelay(true);
            let w = worker.clone();
            tokio::task::spawn_local(async move {
                let svc = service_fn(move |req| {
                    let w = w.clone();
                    async move {
                        // Every client gone before its response ended is counted once
                        // (`gateway.client_aborts`): dropped unanswered, hyper gave up on the
                        // request before its response began; after, the response's body was
                        // dropped unfinished.
                        let shared = w.shared.clone();
                        let head = req.method() == hyper::Method::HEAD;
                        let pending = crate::shared::PendingResponse::new(shared.clone());
                        let response = crate::stream::handle(w, req).await;
                        pending.answered();
                        response.map(|mut r| {
                            let s = r.status();
                            let bodiless = head
                                || s.is_informational()
                                || s == hyper::StatusCode::NO_CONTENT
                                || s == hyper::StatusCode::NOT_MODIFIED;
                            if !bodiless {
                                r.body_mut().count_abort(shared);
                            }
                            r
                        })
                    }
                });
                let _ = http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(sock), svc)
                    .await;
            });
        }
    });
}
