//! One plugin VM (wasmtime Store + Instance) per worker, with the host-side state its host
//! calls read and write. Every host→guest entry goes through `Vm::enter`, which sets the
//! current context and resets the effective context (cpp-host `SaveRestoreContext`).

use crate::abi::{self, AbiVersion};
use crate::shared::Shared;
use anyhow::{anyhow, bail, Context as _, Result};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use tokio::sync::Notify;
use wasmtime::{Engine, Instance, Linker, Memory, Module, Store, TypedFunc};

pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// A local reply requested by `proxy_send_local_response`.
#[derive(Clone, Debug)]
pub struct LocalReply {
    pub status: u16,
    pub details: String,
    pub body: Vec<u8>,
    pub headers: Pairs,
}

/// What the plugin asked for on a stream. Host calls only set these flags; the stream task
/// acts on them after the VM call returns, which gives Envoy's "after VM call action" order.
#[derive(Default, Debug)]
pub struct Signals {
    pub resume_request: bool,
    pub resume_response: bool,
    pub local_reply: Option<LocalReply>,
    pub close: bool,
}

#[derive(Default)]
pub struct StreamSignals {
    pub flags: RefCell<Signals>,
    pub notify: Notify,
}

/// Host-side data of one HTTP stream context.
pub struct StreamData {
    pub req_headers: Pairs,
    pub req_trailers: Pairs,
    pub resp_headers: Pairs,
    pub resp_trailers: Pairs,
    pub req_body: Vec<u8>,
    pub resp_body: Vec<u8>,
    pub override_host: Option<String>,
    /// Set once the request headers went to the router; a later override is ignored.
    pub headers_released: bool,
    pub route_name: Option<String>,
    pub cluster_name: Option<String>,
    pub signals: Rc<StreamSignals>,
}

impl StreamData {
    pub fn new(req_headers: Pairs, route: Option<(String, String)>) -> StreamData {
        let (route_name, cluster_name) = match route {
            Some((r, c)) => (Some(r), Some(c)),
            None => (None, None),
        };
        StreamData {
            req_headers,
            req_trailers: Vec::new(),
            resp_headers: Vec::new(),
            resp_trailers: Vec::new(),
            req_body: Vec::new(),
            resp_body: Vec::new(),
            override_host: None,
            headers_released: false,
            route_name,
            cluster_name,
            signals: Rc::new(StreamSignals::default()),
        }
    }
}

/// A Redis command queued by `proxy_redis_call`, sent by the worker after the VM call.
pub struct RedisOut {
    pub cluster: String,
    pub token: u32,
    pub query: Vec<u8>,
}

/// Per-cluster settings from `proxy_redis_init` (last init wins, as with Envoy's shared client).
#[derive(Clone, Debug, PartialEq)]
pub struct RedisInit {
    pub username: String,
    pub password: String,
    pub timeout_ms: u64,
    pub db: Option<u32>,
    pub flush_timeout_ms: u64,
    pub flush_size: usize,
}

impl Default for RedisInit {
    fn default() -> Self {
        RedisInit {
            username: String::new(),
            password: String::new(),
            timeout_ms: 1000,
            db: None,
            flush_timeout_ms: 3,
            flush_size: 1024,
        }
    }
}

/// An HTTP callout queued by `proxy_http_call`.
pub struct HttpOut {
    pub context_id: u32,
    pub token: u32,
    pub cluster: String,
    pub headers: Pairs,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
}

/// Response of an HTTP callout, readable during `proxy_on_http_call_response`.
#[derive(Default)]
pub struct HttpCallResp {
    pub headers: Pairs,
    pub body: Vec<u8>,
    pub trailers: Pairs,
}

pub struct HostState {
    pub shared: Arc<Shared>,
    pub worker: usize,
    pub abi: AbiVersion,
    pub memory: Option<Memory>,
    pub alloc: Option<TypedFunc<i32, i32>>,
    pub root_id: u32,
    pub root_name: String,
    pub vm_config: Vec<u8>,
    /// Context of the current host→guest entry (0 = none).
    pub current: u32,
    pub effective: Option<u32>,
    pub streams: HashMap<u32, StreamData>,
    pub redis_buf: Option<Vec<u8>>,
    pub http_resp: Option<HttpCallResp>,
    pub status: (u32, Vec<u8>),
    pub next_redis_token: u32,
    pub next_http_token: u32,
    pub redis_init: HashMap<String, RedisInit>,
    pub redis_out: Vec<RedisOut>,
    pub http_out: Vec<HttpOut>,
    pub tick_period_ms: Option<u32>,
    pub wasi_args: Vec<String>,
    pub wasi_env: Vec<String>,
    pub exit_code: Option<i32>,
    /// During startup, log lines below the threshold are kept so a rejected configuration
    /// can show everything the plugin said.
    pub startup_log: Option<Vec<String>>,
}

impl HostState {
    pub fn new(shared: Arc<Shared>, worker: usize, abi: AbiVersion) -> HostState {
        HostState {
            shared,
            worker,
            abi,
            memory: None,
            alloc: None,
            root_id: 1,
            root_name: String::new(),
            vm_config: Vec::new(),
            current: 0,
            effective: None,
            streams: HashMap::new(),
            redis_buf: None,
            http_resp: None,
            status: (0, Vec::new()),
            next_redis_token: 7,
            next_http_token: 4,
            redis_init: HashMap::new(),
            redis_out: Vec::new(),
            http_out: Vec::new(),
            tick_period_ms: None,
            wasi_args: vec!["plugin".into()],
            wasi_env: Vec::new(),
            exit_code: None,
            startup_log: Some(Vec::new()),
        }
    }

    /// The context stream host calls act on: the effective one if set, else the current one.
    pub fn target(&self) -> u32 {
        self.effective.unwrap_or(self.current)
    }

    /// The stream the current host call acts on; `None` on the root context.
    pub fn stream(&mut self) -> Option<&mut StreamData> {
        let id = self.target();
        self.streams.get_mut(&id)
    }

    pub fn is_live_context(&self, id: u32) -> bool {
        id == self.root_id || self.streams.contains_key(&id)
    }
}

type F1 = TypedFunc<i32, ()>;
type F1R = TypedFunc<i32, i32>;
type F2 = TypedFunc<(i32, i32), ()>;
type F2R = TypedFunc<(i32, i32), i32>;
type F3R = TypedFunc<(i32, i32, i32), i32>;
type F4 = TypedFunc<(i32, i32, i32, i32), ()>;
type F5 = TypedFunc<(i32, i32, i32, i32, i32), ()>;

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
}

/// The compiled plugin, shared by every worker (one compilation per process).
pub struct Plugin {
    pub engine: Engine,
    pub module: Module,
    pub abi: AbiVersion,
}

impl Plugin {
    pub fn load(wasm: &[u8]) -> Result<Plugin> {
        let engine = Engine::default();
        let module = Module::new(&engine, wasm)
            .map_err(anyhow::Error::from)
            .context("compiling plugin wasm")?;
        let abi = AbiVersion::detect(module.exports().map(|e| e.name()))
            .ok_or_else(|| anyhow!("module exports no proxy_abi_version_* function"))?;
        Ok(Plugin {
            engine,
            module,
            abi,
        })
    }
}

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
        store.data_mut().alloc = alloc;
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
        Ok(Vm {
            store,
            ex,
            failed: false,
        })
    }

    fn enter(&mut self, ctx: u32) {
        let h = self.store.data_mut();
        h.current = ctx;
        h.effective = None;
    }

    fn leave(&mut self) {
        let h = self.store.data_mut();
        h.current = 0;
        h.effective = None;
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

    fn call<P: wasmtime::WasmParams, R: wasmtime::WasmResults + Default>(
        &mut self,
        ctx: u32,
        what: &str,
        f: Option<TypedFunc<P, R>>,
        args: P,
    ) -> Result<R> {
        if self.failed {
            bail!("VM failed earlier");
        }
        let Some(f) = f else { return Ok(R::default()) };
        self.enter(ctx);
        let r = f.call(&mut self.store, args);
        self.leave();
        r.map_err(|e| self.trap(what, e.into()))
    }

    /// `_initialize` done; create the root context, then vm_start and configure.
    pub fn start(&mut self, plugin_config_len: usize) -> Result<bool> {
        let root = self.store.data().root_id as i32;
        let vm_len = self.store.data().vm_config.len() as i32;
        // cpp-host creates the root context before vm_start (the SDK panics otherwise).
        let create = self.ex.on_context_create.clone();
        self.call(0, "proxy_on_context_create", create, (root, 0))?;
        let f = self.ex.on_vm_start.clone();
        let ok = self.call(root as u32, "proxy_on_vm_start", f, (root, vm_len))?;
        if self.ex.on_vm_start.is_some() && ok == 0 {
            return Ok(false);
        }
        let f = self.ex.on_configure.clone();
        let has = f.is_some();
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
        let f = self.ex.on_context_create.clone();
        self.call(ctx, "proxy_on_context_create", f, (ctx as i32, root))
    }

    pub fn on_request_headers(&mut self, ctx: u32, n: usize, eos: bool) -> Result<u32> {
        let f = self.ex.on_request_headers.clone();
        let args = (ctx as i32, n as i32, eos as i32);
        self.call(ctx, "proxy_on_request_headers", f, args)
            .map(|r| r as u32)
    }

    pub fn on_request_body(&mut self, ctx: u32, len: usize, eos: bool) -> Result<u32> {
        let f = self.ex.on_request_body.clone();
        let args = (ctx as i32, len as i32, eos as i32);
        self.call(ctx, "proxy_on_request_body", f, args)
            .map(|r| r as u32)
    }

    pub fn on_response_headers(&mut self, ctx: u32, n: usize, eos: bool) -> Result<u32> {
        let f = self.ex.on_response_headers.clone();
        let args = (ctx as i32, n as i32, eos as i32);
        self.call(ctx, "proxy_on_response_headers", f, args)
            .map(|r| r as u32)
    }

    pub fn on_response_body(&mut self, ctx: u32, len: usize, eos: bool) -> Result<u32> {
        let f = self.ex.on_response_body.clone();
        let args = (ctx as i32, len as i32, eos as i32);
        self.call(ctx, "proxy_on_response_body", f, args)
            .map(|r| r as u32)
    }

    /// on_done → on_log → on_delete, then forget the stream. Runs even on a failed VM's
    /// bookkeeping (the host data is dropped either way).
    pub fn destroy_stream(&mut self, ctx: u32) {
        if !self.store.data().streams.contains_key(&ctx) {
            return;
        }
        let c = ctx as i32;
        let _ = self.call(ctx, "proxy_on_done", self.ex.on_done.clone(), c);
        let _ = self.call(ctx, "proxy_on_log", self.ex.on_log.clone(), c);
        let _ = self.call(ctx, "proxy_on_delete", self.ex.on_delete.clone(), c);
        self.store.data_mut().streams.remove(&ctx);
    }

    pub fn on_tick(&mut self) -> Result<()> {
        let root = self.store.data().root_id;
        self.call(root, "proxy_on_tick", self.ex.on_tick.clone(), root as i32)
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
        let f = self.ex.on_redis_call_response.clone();
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
        let f = self.ex.on_http_call_response.clone();
        let args = (ctx as i32, token as i32, nh as i32, nb as i32, nt as i32);
        let r = self.call(ctx, "proxy_on_http_call_response", f, args);
        let h = self.store.data_mut();
        h.http_resp = None;
        h.status = (0, Vec::new());
        r
    }
}

/// Copy guest memory `[ptr, ptr+len)`.
pub fn read_mem(
    caller: &mut wasmtime::Caller<'_, HostState>,
    ptr: i32,
    len: i32,
) -> Result<Vec<u8>, i32> {
    let mem = caller
        .data()
        .memory
        .ok_or(abi::status::INVALID_MEMORY_ACCESS)?;
    let (p, l) = (ptr as u32 as usize, len as u32 as usize);
    mem.data(&*caller)
        .get(p..p.checked_add(l).ok_or(abi::status::INVALID_MEMORY_ACCESS)?)
        .map(|s| s.to_vec())
        .ok_or(abi::status::INVALID_MEMORY_ACCESS)
}

pub fn write_mem(
    caller: &mut wasmtime::Caller<'_, HostState>,
    ptr: i32,
    data: &[u8],
) -> Result<(), i32> {
    let mem = caller
        .data()
        .memory
        .ok_or(abi::status::INVALID_MEMORY_ACCESS)?;
    mem.write(&mut *caller, ptr as u32 as usize, data)
        .map_err(|_| abi::status::INVALID_MEMORY_ACCESS)
}

pub fn write_u32(
    caller: &mut wasmtime::Caller<'_, HostState>,
    ptr: i32,
    v: u32,
) -> Result<(), i32> {
    write_mem(caller, ptr, &v.to_le_bytes())
}

/// Allocate `data` in guest memory (guest `malloc`, else `proxy_on_memory_allocate`) and
/// write pointer and size to the out-pointers. Empty data gives pointer 0, size 0, like
/// cpp-host `copyToPointerSize`.
pub fn return_bytes(
    caller: &mut wasmtime::Caller<'_, HostState>,
    data: &[u8],
    ptr_ptr: i32,
    size_ptr: i32,
) -> i32 {
    let mut addr = 0u32;
    if !data.is_empty() {
        let Some(alloc) = caller.data().alloc.clone() else {
            return abi::status::INVALID_MEMORY_ACCESS;
        };
        match alloc.call(&mut *caller, data.len() as i32) {
            Ok(p) if p != 0 => addr = p as u32,
            _ => return abi::status::INVALID_MEMORY_ACCESS,
        }
        if let Err(s) = write_mem(caller, addr as i32, data) {
            return s;
        }
    }
    match write_u32(caller, ptr_ptr, addr)
        .and_then(|_| write_u32(caller, size_ptr, data.len() as u32))
    {
        Ok(()) => abi::status::OK,
        Err(s) => s,
    }
}

/// Worker-side handle: the VM behind a RefCell so host→guest calls are never re-entrant
/// (a nested borrow would panic instead of silently re-entering).
pub type VmCell = Rc<RefCell<Vm>>;
