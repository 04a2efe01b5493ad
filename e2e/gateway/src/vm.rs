//! One plugin VM (wasmtime Store + Instance) per worker; the host-side state its host calls
//! read and write is `host_state::HostState`. Every host→guest entry goes through `Vm::enter`, which sets the
//! current context and resets the effective context (cpp-host `SaveRestoreContext`).

use crate::abi::AbiVersion;
use crate::host_state::HostState;
use crate::stream_data::HttpCallResp;
use anyhow::{anyhow, bail, Context as _, Result};
use std::cell::RefCell;
use std::rc::Rc;
use wasmtime::{AsContext, Engine, Instance, Linker, Module, Store, TypedFunc};

type F1 = TypedFunc<i32, ()>;
type F1R = TypedFunc<i32, i32>;
type F2 = TypedFunc<(i32, i32), ()>;
type F2R = TypedFunc<(i32, i32), i32>;
type F3R = TypedFunc<(i32, i32, i32), i32>;
type F4 = TypedFunc<(i32, i32, i32, i32), ()>;
type F5 = TypedFunc<(i32, i32, i32, i32, i32), ()>;
/// Selects one export of [`Exports`] for [`Vm::call`].
type Pick<P, R> = fn(&Exports) -> Option<&TypedFunc<P, R>>;

/// Exports the host calls; missing optional callbacks are `None` and treated as Continue.
struct Exports {
    on_vm_start: Option<F2R>,
    on_configure: Option<F2R>,
    on_context_create: Option<F2>,
    on_request_headers: Option<F3R>,
    on_request_body: Option<F3R>,
    on_response_headers: Option<F3R>,
    on_response_body: Option<F3R>,
    on_done: Option<F1R>,
    on_log: Option<F1>,
    on_delete: Option<F1>,
    on_tick: Option<F1>,
    on_http_call_response: Option<F5>,
    on_redis_call_response: Option<F4>,
}

pub struct Vm {
    pub store: Store<HostState>,
    ex: Exports,
    /// Set after a trap; Envoy treats the VM as dead from then on.
    pub failed: bool,
    /// The module's compiled code (bench instruments may read it back in, `crate::instrument`).
    code: std::ops::Range<usize>,
}

/// The compiled plugin, shared by every worker (one compilation per process).
pub struct Plugin {
    pub engine: Engine,
    pub module: Module,
    pub abi: AbiVersion,
}

impl Plugin {
    pub fn load(wasm: &[u8]) -> Result<Plugin> {
        let mut config = wasmtime::Config::new();
        let instruments = crate::instrument::get();
        if let Some(i) = instruments {
            i.engine_config(&mut config);
        }
        let engine = Engine::new(&config).map_err(anyhow::Error::from)?;
        let module = crate::module_cache::module(&engine, wasm, instruments.is_none())?;
        let abi = AbiVersion::detect(module.exports().map(|e| e.name()))
            .ok_or_else(|| anyhow!("module exports no proxy_abi_version_* function"))?;
        Ok(Plugin {
            engine,
            module,
            abi,
        })
    }
}

/// Removes `/tmp/perf-<pid>.map` once per process, before the first engine writes it. wasmtime
/// appends to that file (several engines of one process share it), so a map an earlier
/// process with the same pid left would be read as this process's code.
impl Vm {
    /// Instantiate and run `_initialize`. Unknown `env` imports fail here with their name.
    pub fn instantiate(plugin: &Plugin, host: HostState) -> Result<Vm> {
        let mut linker: Linker<HostState> = Linker::new(&plugin.engine);
        crate::hostcalls::add_to_linker(&mut linker)?;
        crate::higress::add_to_linker(&mut linker)?;
        crate::wasi::add_to_linker(&mut linker, &plugin.module)?;
        let mut store = Store::new(&plugin.engine, host);
        let instance: Instance = linker
            .instantiate(&mut store, &plugin.module)
            .map_err(anyhow::Error::from)
            .context("instantiating plugin (missing host function?)")?;
        let memory = instance.get_memory(&mut store, "memory");
        let alloc = instance
            .get_typed_func::<i32, i32>(&mut store, "malloc")
            .or_else(|_| {
                instance.get_typed_func::<i32, i32>(&mut store, "proxy_on_memory_allocate")
            })
            .ok();
        store.data_mut().memory = memory;
        store.data_mut().alloc = alloc.map(Rc::new);
        macro_rules! get {
            ($name:literal) => {
                instance.get_typed_func(&mut store, $name).ok()
            };
        }
        let ex = Exports {
            on_vm_start: get!("proxy_on_vm_start"),
            on_configure: get!("proxy_on_configure"),
            on_context_create: get!("proxy_on_context_create"),
            on_request_headers: get!("proxy_on_request_headers"),
            on_request_body: get!("proxy_on_request_body"),
            on_response_headers: get!("proxy_on_response_headers"),
            on_response_body: get!("proxy_on_response_body"),
            on_done: get!("proxy_on_done"),
            on_log: get!("proxy_on_log"),
            on_delete: get!("proxy_on_delete"),
            on_tick: get!("proxy_on_tick"),
            on_http_call_response: get!("proxy_on_http_call_response"),
            on_redis_call_response: get!("proxy_on_redis_call_response"),
        };
        if let Ok(init) = instance.get_typed_func::<(), ()>(&mut store, "_initialize") {
            init.call(&mut store, ())
                .map_err(anyhow::Error::from)
                .context("_initialize trapped")?;
        }
        let image = plugin.module.image_range();
        Ok(Vm {
            store,
            ex,
            failed: false,
            code: image.start as usize..image.end as usize,
        })
    }

    fn trap(&mut self, what: &str, e: anyhow::Error) -> anyhow::Error {
        self.failed = true;
        let h = self.store.data();
        h.shared
            .counters
            .vm_traps
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        eprintln!(
            "[gw {}][worker {}][critical] wasm VM trapped in {what}: {e:#}",
            h.shared.cfg.gateway_id, h.worker
        );
        e.context(format!("VM trapped in {what}"))
    }

    /// Calls the export `pick` selects, borrowed: cloning a `TypedFunc` per call takes
    /// references on the engine and its type registry (atomics every worker of the process
    /// shares), which the VM-time figures counted as plugin time (6% of it in a profile of
    /// `ailb-bench cluster-cpu`) though no real host pays it.
    fn call<P, R>(&mut self, ctx: u32, what: &'static str, pick: Pick<P, R>, args: P) -> Result<R>
    where
        P: wasmtime::WasmParams,
        R: wasmtime::WasmResults + Default,
    {
        if self.failed {
            bail!("VM failed earlier");
        }
        // A stream of a VM that FAIL_RELOAD replaced is not a context of this one.
        if ctx != 0 && !self.store.data().is_live_context(ctx) {
            bail!("context {ctx} does not exist in this VM");
        }
        let Some(f) = pick(&self.ex) else {
            return Ok(R::default());
        };
        let instruments = crate::instrument::get();
        if let Some(i) = instruments {
            let memory = self.store.data().memory;
            i.before_entry(self.store.as_context(), memory, &self.code);
        }
        let h = self.store.data_mut();
        h.current = ctx;
        h.effective = None;
        // The wall clock innermost, so the CPU clock's system calls stay out of it.
        let cpu_at = instruments.and_then(|i| i.thread_cpu_ns());
        let started = std::time::Instant::now();
        let r = f.call(&mut self.store, args);
        let ns = started.elapsed().as_nanos() as u64;
        let cpu_ns = cpu_at
            .zip(instruments.and_then(|i| i.thread_cpu_ns()))
            .map(|(at, now)| now.saturating_sub(at));
        crate::instrument::record(what, ns);
        let h = self.store.data_mut();
        h.current = 0;
        h.effective = None;
        let counters = &h.shared.counters;
        counters
            .vm_call_ns
            .fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
        counters
            .vm_calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(cpu_ns) = cpu_ns {
            counters
                .vm_call_cpu_ns
                .fetch_add(cpu_ns, std::sync::atomic::Ordering::Relaxed);
        }
        r.map_err(|e| self.trap(what, e.into()))
    }

    /// `_initialize` done; create the root context, then vm_start and configure.
    pub fn start(&mut self, plugin_config_len: usize) -> Result<bool> {
        let root = self.store.data().root_id as i32;
        let vm_len = self.store.data().vm_config.len() as i32;
        // cpp-host creates the root context before vm_start (the SDK panics otherwise).
        let create: Pick<_, _> = |e| e.on_context_create.as_ref();
        self.call(0, "proxy_on_context_create", create, (root, 0))?;
        let f: Pick<_, _> = |e| e.on_vm_start.as_ref();
        let ok = self.call(root as u32, "proxy_on_vm_start", f, (root, vm_len))?;
        if self.ex.on_vm_start.is_some() && ok == 0 {
            return Ok(false);
        }
        let f: Pick<_, _> = |e| e.on_configure.as_ref();
        let has = self.ex.on_configure.is_some();
        let ok = self.call(
            root as u32,
            "proxy_on_configure",
            f,
            (root, plugin_config_len as i32),
        )?;
        Ok(!has || ok != 0)
    }

    pub fn on_context_create(&mut self, ctx: u32) -> Result<()> {
        let root = self.store.data().root_id as i32;
        let f: Pick<_, _> = |e| e.on_context_create.as_ref();
        self.call(ctx, "proxy_on_context_create", f, (ctx as i32, root))
    }

    pub fn on_request_headers(&mut self, ctx: u32, n: usize, eos: bool) -> Result<u32> {
        let f: Pick<_, _> = |e| e.on_request_headers.as_ref();
        let args = (ctx as i32, n as i32, eos as i32);
        self.call(ctx, "proxy_on_request_headers", f, args)
            .map(|r| r as u32)
    }

    pub fn on_request_body(&mut self, ctx: u32, len: usize, eos: bool) -> Result<u32> {
        let f: Pick<_, _> = |e| e.on_request_body.as_ref();
        let args = (ctx as i32, len as i32, eos as i32);
        self.call(ctx, "proxy_on_request_body", f, args)
            .map(|r| r as u32)
    }

    pub fn on_response_headers(&mut self, ctx: u32, n: usize, eos: bool) -> Result<u32> {
        let f: Pick<_, _> = |e| e.on_response_headers.as_ref();
        let args = (ctx as i32, n as i32, eos as i32);
        self.call(ctx, "proxy_on_response_headers", f, args)
            .map(|r| r as u32)
    }

    pub fn on_response_body(&mut self, ctx: u32, len: usize, eos: bool) -> Result<u32> {
        let f: Pick<_, _> = |e| e.on_response_body.as_ref();
        let args = (ctx as i32, len as i32, eos as i32);
        self.call(ctx, "proxy_on_response_body", f, args)
            .map(|r| r as u32)
    }

    /// on_done → on_log → on_delete, then forget the stream; false if it was not a stream of
    /// this VM. Runs even on a failed VM's bookkeeping (the host data is dropped either way).
    pub fn destroy_stream(&mut self, ctx: u32) -> bool {
        if !self.store.data().streams.contains_key(&ctx) {
            return false;
        }
        let c = ctx as i32;
        let _ = self.call(ctx, "proxy_on_done", |e: &Exports| e.on_done.as_ref(), c);
        let _ = self.call(ctx, "proxy_on_log", |e: &Exports| e.on_log.as_ref(), c);
        let _ = self.call(
            ctx,
            "proxy_on_delete",
            |e: &Exports| e.on_delete.as_ref(),
            c,
        );
        self.store.data_mut().streams.remove(&ctx);
        true
    }

    pub fn on_tick(&mut self) -> Result<()> {
        let root = self.store.data().root_id;
        self.call(
            root,
            "proxy_on_tick",
            |e: &Exports| e.on_tick.as_ref(),
            root as i32,
        )
    }

    /// Redis reply for `token`: buffer 9 (or the failure status) exists only during the call.
    pub fn on_redis_call_response(&mut self, token: u32, reply: Option<Vec<u8>>) -> Result<()> {
        let root = self.store.data().root_id;
        let (status, size) = match &reply {
            Some(r) => (0, r.len()),
            None => (1, 0),
        };
        {
            let h = self.store.data_mut();
            h.status = if reply.is_some() {
                (0, Vec::new())
            } else {
                (11, b"reset".to_vec())
            };
            h.redis_buf = Some(reply.unwrap_or_default());
        }
        let f: Pick<_, _> = |e| e.on_redis_call_response.as_ref();
        let args = (root as i32, token as i32, status, size as i32);
        let r = self.call(root, "proxy_on_redis_call_response", f, args);
        let h = self.store.data_mut();
        h.redis_buf = None;
        h.status = (0, Vec::new());
        r
    }

    /// HTTP callout result, delivered to the context that dispatched it.
    pub fn on_http_call_response(
        &mut self,
        ctx: u32,
        token: u32,
        resp: Option<HttpCallResp>,
    ) -> Result<()> {
        if !self.store.data().is_live_context(ctx) {
            return Ok(());
        }
        let (nh, nb, nt) = match &resp {
            Some(r) => (r.headers.len(), r.body.len(), r.trailers.len()),
            None => (0, 0, 0),
        };
        {
            let h = self.store.data_mut();
            h.status = if resp.is_some() {
                (0, Vec::new())
            } else {
                (11, b"reset".to_vec())
            };
            h.http_resp = Some(resp.unwrap_or_default());
        }
        let f: Pick<_, _> = |e| e.on_http_call_response.as_ref();
        let args = (ctx as i32, token as i32, nh as i32, nb as i32, nt as i32);
        let r = self.call(ctx, "proxy_on_http_call_response", f, args);
        let h = self.store.data_mut();
        h.http_resp = None;
        h.status = (0, Vec::new());
        r
    }
}

/// Worker-side handle: the VM behind a RefCell so host→guest calls are never re-entrant
/// (a nested borrow would panic instead of silently re-entering).
pub type VmCell = Rc<RefCell<Vm>>;
