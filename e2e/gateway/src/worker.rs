//! A worker: one thread, one single-threaded event loop, one plugin VM (like an Envoy
//! worker). All host→guest calls go through `with_vm`, which afterwards runs the queued
//! side effects (Redis writes, HTTP callouts, tick timer) so callbacks only ever come from
//! the event loop, never from inside a host call.

mod outbound;

use crate::abi::AbiVersion;
use crate::config::{FailurePolicy, RouteCfg};
use crate::host_state::HostState;
use crate::redis::{spawn_connection, RedisTx};
use crate::shared::Shared;
use crate::stream_data::{HttpOut, Pairs, StreamData, StreamSignals};
use crate::upstream::Upstreams;
use crate::vm::{Plugin, Vm};
use anyhow::Result;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Worker {
    pub idx: usize,
    pub shared: Arc<Shared>,
    pub abi: AbiVersion,
    vm: Option<RefCell<Vm>>,
    plugin: Option<Arc<Plugin>>,
    /// Bumped when FAIL_RELOAD replaces the VM: callout replies of an older VM are dropped.
    vm_gen: Cell<u64>,
    /// When the current VM died (FAIL_RELOAD's backoff runs from here, and from each failed
    /// reload).
    failed_at: Cell<Option<Instant>>,
    redis: RefCell<HashMap<String, RedisTx>>,
    next_ctx: Cell<u32>,
    tick_gen: Cell<u64>,
    pub upstreams: Upstreams,
    me: Weak<Worker>,
}

impl Worker {
    /// Build the worker's VM and run vm_start/configure. `Ok(None)`-like failure of
    /// on_configure is reported as an error mentioning "on_configure".
    pub fn new(idx: usize, shared: Arc<Shared>, plugin: Option<Arc<Plugin>>) -> Result<Rc<Worker>> {
        let (vm, abi) = match &plugin {
            Some(p) => (
                Some(RefCell::new(Self::instantiate(idx, &shared, p)?)),
                p.abi,
            ),
            None => (None, AbiVersion::V0_2_100),
        };
        let w = Rc::new_cyclic(|me| Worker {
            idx,
            shared: shared.clone(),
            abi,
            vm,
            plugin,
            vm_gen: Cell::new(0),
            failed_at: Cell::new(None),
            redis: RefCell::new(HashMap::new()),
            next_ctx: Cell::new(2),
            tick_gen: Cell::new(0),
            upstreams: Upstreams::new(shared.clone()),
            me: me.clone(),
        });
        if w.vm.is_some() {
            let len = shared.plugin_config.len();
            let ok = w.with_vm(|vm| vm.start(len)).unwrap_or(Ok(false))?;
            let held =
                w.vm.as_ref()
                    .and_then(|c| c.borrow_mut().store.data_mut().startup_log.take());
            if !ok {
                for line in held.unwrap_or_default() {
                    eprintln!("{line}");
                }
                anyhow::bail!(
                    "plugin rejected its configuration (proxy_on_configure returned false)"
                );
            }
        }
        Ok(w)
    }

    fn instantiate(idx: usize, shared: &Arc<Shared>, plugin: &Plugin) -> Result<Vm> {
        let mut host = HostState::new(shared.clone(), idx, plugin.abi);
        if let Some(pc) = &shared.cfg.plugin {
            host.vm_config = pc.vm_config.clone().into_bytes();
            host.root_name = pc.root_id.clone();
        }
        Vm::instantiate(plugin, host)
    }

    pub fn has_plugin(&self) -> bool {
        self.vm.is_some()
    }

    pub fn vm_failed(&self) -> bool {
        self.vm.as_ref().map(|v| v.borrow().failed).unwrap_or(false)
    }

    pub fn failure_policy(&self) -> FailurePolicy {
        self.shared
            .cfg
            .plugin
            .as_ref()
            .map(|p| p.failure_policy)
            .unwrap_or_default()
    }

    /// FAIL_OPEN: the streams of a dead VM go on as if it had answered Continue.
    pub fn fail_open(&self) -> bool {
        self.failure_policy() == FailurePolicy::FailOpen
    }

    /// Run `f` on the VM, then flush what the plugin queued. `None` without a plugin. If `f`
    /// killed the VM, every stream it holds is told at once (a stream paused on a Redis reply
    /// or an HTTP callout would otherwise wait for a callback that can no longer come).
    pub fn with_vm<R>(&self, f: impl FnOnce(&mut Vm) -> R) -> Option<R> {
        let cell = self.vm.as_ref()?;
        let (r, died) = {
            let mut vm = cell.borrow_mut();
            let was_failed = vm.failed;
            let r = f(&mut vm);
            (r, !was_failed && vm.failed)
        };
        if died {
            self.on_vm_death();
        }
        self.after_vm_call();
        Some(r)
    }

    fn on_vm_death(&self) {
        let Some(cell) = &self.vm else { return };
        self.failed_at.set(Some(Instant::now()));
        // Stop the dead VM's ticker.
        self.tick_gen.set(self.tick_gen.get() + 1);
        let signals: Vec<Rc<StreamSignals>> = {
            let mut vm = cell.borrow_mut();
            let h = vm.store.data_mut();
            // What the trapping call queued is never sent: nothing could take the reply.
            h.redis_out.clear();
            h.http_out.clear();
            h.tick_period_ms = None;
            h.streams.values().map(|s| s.signals.clone()).collect()
        };
        for s in signals {
            s.fail_vm();
        }
    }

    /// FAIL_RELOAD: a dead VM is replaced by a fresh one (instantiate, vm_start, configure)
    /// for a new request, once `reload_backoff_ms` has passed since the failure or since the
    /// last failed reload. Returns whether the worker now has a live VM.
    pub fn try_reload(&self) -> bool {
        let (Some(cell), Some(plugin)) = (&self.vm, &self.plugin) else {
            return false;
        };
        if !self.vm_failed() {
            return true;
        }
        let backoff = self
            .shared
            .cfg
            .plugin
            .as_ref()
            .map(|p| p.reload_backoff_ms)
            .unwrap_or(1000);
        let due = self
            .failed_at
            .get()
            .is_none_or(|t| t.elapsed() >= Duration::from_millis(backoff));
        if !due {
            return false;
        }
        self.failed_at.set(Some(Instant::now()));
        let Ok(vm) = Self::instantiate(self.idx, &self.shared, plugin) else {
            return false;
        };
        // The old VM and its streams' host data go; its Redis connections (whose replies
        // carry the old VM's tokens) and ticker go with them.
        *cell.borrow_mut() = vm;
        self.vm_gen.set(self.vm_gen.get() + 1);
        self.redis.borrow_mut().clear();
        self.tick_gen.set(self.tick_gen.get() + 1);
        let len = self.shared.plugin_config.len();
        let started = matches!(self.with_vm(|vm| vm.start(len)), Some(Ok(true)));
        if let Some(c) = &self.vm {
            c.borrow_mut().store.data_mut().startup_log = None;
        }
        if !started {
            // A VM that refuses its configuration is as dead as one that trapped.
            if let Some(c) = &self.vm {
                c.borrow_mut().failed = true;
            }
            return false;
        }
        self.shared.counters.vm_reloads.fetch_add(1, Relaxed);
        eprintln!(
            "[gw {}][worker {}][warn] wasm VM reloaded after a failure (FAIL_RELOAD)",
            self.shared.cfg.gateway_id, self.idx
        );
        true
    }

    /// Access host-side stream data without entering the VM.
    pub fn with_stream<R>(&self, ctx: u32, f: impl FnOnce(&mut StreamData) -> R) -> Option<R> {
        let cell = self.vm.as_ref()?;
        let mut vm = cell.borrow_mut();
        vm.store.data_mut().streams.get_mut(&ctx).map(f)
    }

    fn after_vm_call(&self) {
        let Some(cell) = &self.vm else { return };
        let (redis, http, tick) = {
            let mut vm = cell.borrow_mut();
            let h = vm.store.data_mut();
            (
                std::mem::take(&mut h.redis_out),
                std::mem::take(&mut h.http_out),
                h.tick_period_ms.take(),
            )
        };
        for r in redis {
            self.redis_send(&r.cluster, r.token, r.query);
        }
        for h in http {
            self.spawn_http_call(h);
        }
        if let Some(ms) = tick {
            self.start_ticker(ms);
        }
    }

    fn redis_send(&self, cluster: &str, token: u32, query: Vec<u8>) {
        let mut map = self.redis.borrow_mut();
        let mut msg = (token, query);
        if let Some(tx) = map.get(cluster) {
            match tx.send(msg) {
                Ok(()) => return,
                Err(e) => msg = e.0,
            }
        }
        let Some(rc) = self
            .shared
            .cfg
            .redis_clusters
            .iter()
            .find(|r| r.name == cluster)
        else {
            return;
        };
        let init = self
            .vm
            .as_ref()
            .and_then(|c| c.borrow().store.data().redis_init.get(cluster).cloned())
            .unwrap_or_default();
        let me = self.me.clone();
        let shared = self.shared.clone();
        let gen = self.vm_gen.get();
        let deliver = Rc::new(move |token: u32, reply: Option<Vec<u8>>| {
            if reply.is_none() {
                shared.counters.redis_failures.fetch_add(1, Relaxed);
            }
            if let Some(w) = me.upgrade().filter(|w| w.vm_gen.get() == gen) {
                w.with_vm(|vm| {
                    let _ = vm.on_redis_call_response(token, reply);
                });
            }
        });
        let timeout = Duration::from_millis(rc.connect_timeout_ms);
        let tx = spawn_connection(rc.address.clone(), timeout, init, deliver);
        let _ = tx.send(msg);
        map.insert(cluster.to_string(), tx);
    }

    fn start_ticker(&self, ms: u32) {
        let gen = self.tick_gen.get() + 1;
        self.tick_gen.set(gen);
        if ms == 0 {
            return;
        }
        let me = self.me.clone();
        tokio::task::spawn_local(async move {
            let mut iv = tokio::time::interval(Duration::from_millis(ms as u64));
            iv.tick().await;
            loop {
                iv.tick().await;
                let Some(w) = me.upgrade() else { return };
                if w.tick_gen.get() != gen {
                    return;
                }
                w.with_vm(|vm| {
                    let _ = vm.on_tick();
                });
            }
        });
    }

    fn spawn_http_call(&self, out: HttpOut) {
        let me = self.me.clone();
        let gen = self.vm_gen.get();
        tokio::task::spawn_local(async move {
            let Some(w) = me.upgrade() else { return };
            let resp = outbound::http_call(&w.upstreams, &out).await;
            if w.vm_gen.get() != gen {
                return;
            }
            w.with_vm(|vm| {
                let _ = vm.on_http_call_response(out.context_id, out.token, resp);
            });
        });
    }

    pub fn new_stream(&self, headers: Pairs, route: Option<&RouteCfg>) -> Result<u32> {
        let ctx = self.next_ctx.get();
        self.next_ctx.set(ctx + 1);
        if let Some(cell) = &self.vm {
            cell.borrow_mut()
                .store
                .data_mut()
                .streams
                .insert(ctx, StreamData::new(headers, route));
            self.with_vm(|vm| vm.on_context_create(ctx))
                .unwrap_or(Ok(()))?;
        }
        Ok(ctx)
    }

    /// on_done/on_log/on_delete for a finished stream (idempotent).
    pub fn destroy_stream(&self, ctx: u32) {
        let Some(cell) = &self.vm else { return };
        match cell.try_borrow_mut() {
            Ok(mut vm) => {
                let known = vm.destroy_stream(ctx);
                drop(vm);
                if known {
                    self.shared.counters.streams_destroyed.fetch_add(1, Relaxed);
                }
                self.after_vm_call();
            }
            Err(_) => {
                // Only reachable if a drop happened inside a VM call; defer to the loop.
                let w = self.me.upgrade();
                tokio::task::spawn_local(async move {
                    if let Some(w) = w {
                        w.destroy_stream(ctx);
                    }
                });
            }
        }
    }
}

/// Destroys the stream's plugin context when dropped: on response completion, client
/// abort (hyper drops the handler future or the response body), errors and local replies.
pub struct StreamGuard {
    pub worker: Rc<Worker>,
    pub ctx: u32,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.worker.destroy_stream(self.ctx);
    }
}
