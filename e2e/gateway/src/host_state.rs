//! The host-side state of one plugin VM, which every host call reads and writes through its
//! wasmtime `Caller`. Below `vm.rs` and the host-call modules, which all build on it.

use crate::abi::AbiVersion;
use crate::shared::Shared;
use crate::stream_data::{HttpCallResp, HttpOut, RedisInit, RedisOut, StreamData};
use std::collections::HashMap;
use std::sync::Arc;
use wasmtime::{Caller, Memory, TypedFunc};

/// The wasmtime caller every host call receives.
pub type C<'a> = Caller<'a, HostState>;

pub struct HostState {
    pub shared: Arc<Shared>,
    pub worker: usize,
    pub abi: AbiVersion,
    pub memory: Option<Memory>,
    /// Behind an `Rc`: a `TypedFunc` clone per host call that returns bytes would take
    /// references on the engine's shared type registry inside the VM time (see `Vm::call`).
    pub alloc: Option<std::rc::Rc<TypedFunc<i32, i32>>>,
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

    /// `proxy_get_property`'s answer for the path `parts` (docs/higress-abi.md §9); `None`:
    /// NotFound.
    pub fn property(&mut self, parts: &[&[u8]]) -> Option<Vec<u8>> {
        let stream = |h: &mut HostState, f: fn(&StreamData) -> Option<String>| {
            h.stream().and_then(|s| f(s)).map(String::into_bytes)
        };
        match parts {
            [b"route_name"] => stream(self, |s| s.route_name.clone()),
            [b"cluster_name"] => stream(self, StreamData::current_cluster),
            // The host of the router's latest try: NotFound until the router picked one.
            [b"upstream", b"address"] => stream(self, |s| s.upstream_host.clone()),
            [b"plugin_root_id"] => Some(self.root_name.clone().into_bytes()),
            [b"plugin_name"] => Some(b"ai-load-balancer".to_vec()),
            [b"node", b"id"] => Some(self.shared.cfg.gateway_id.clone().into_bytes()),
            _ => None,
        }
    }
}
