//! The proxy-wasm context shells: they forward each callback to the VM's [`Balancer`] and map
//! its verdict. The Redis reply export lives here too: the host delivers it to the root
//! context, outside the SDK's dispatcher (spec/higress-abi.md §2.4, §9).

use crate::ffi::{self, WasmHost};
use ailb_core::balancer::{Balancer, Verdict};
use ailb_core::config::PluginConfig;
use ailb_core::host::{Host, LogLevel};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

thread_local! {
    /// One engine per root context (several plugin configs may share a VM).
    static ENGINES: RefCell<HashMap<u32, Balancer>> = RefCell::new(HashMap::new());
}

/// Runs `f` on the engine of `root`. A re-entrant call (which the host never makes) or an
/// unknown root is a no-op instead of a panic.
fn with_engine<R>(root: u32, f: impl FnOnce(&mut Balancer, &mut WasmHost) -> R) -> Option<R> {
    ENGINES.with(|engines| {
        let mut engines = engines.try_borrow_mut().ok()?;
        let engine = engines.get_mut(&root)?;
        Some(f(engine, &mut WasmHost))
    })
}

fn action(v: Verdict) -> Action {
    match v {
        Verdict::Continue => Action::Continue,
        Verdict::Pause => Action::Pause,
    }
}

pub struct Root {
    id: u32,
}

impl Root {
    pub fn new(id: u32) -> Root {
        Root { id }
    }
}

impl Context for Root {
    /// A scrape callout answered (the SDK routes it here: the root context dispatched it).
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        with_engine(self.id, |e, h| e.on_http_response(h, token_id, body_size));
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let host = &mut WasmHost;
        let raw = ffi::plugin_configuration().unwrap_or_default();
        match PluginConfig::parse(&raw) {
            Ok(config) => {
                let level = ffi::log_level();
                host.log(
                    LogLevel::Info,
                    &format!(
                        "[ai-load-balancer] {} config accepted: {}",
                        env!("CARGO_PKG_VERSION"),
                        config.summary()
                    ),
                );
                let engine = Balancer::configure(host, config, entropy(), level);
                ENGINES.with(|e| {
                    e.try_borrow_mut()
                        .map(|mut m| m.insert(self.id, engine))
                        .is_ok()
                })
            }
            Err(e) => {
                host.log(LogLevel::Error, &format!("[ai-load-balancer] {e}"));
                false
            }
        }
    }

    fn on_tick(&mut self) {
        with_engine(self.id, |e, h| e.on_tick(h));
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Filter {
            ctx: context_id,
            root: self.id,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Filter {
    ctx: u32,
    root: u32,
}

impl Context for Filter {
    fn on_done(&mut self) -> bool {
        let ctx = self.ctx;
        with_engine(self.root, |e, h| e.on_done(h, ctx));
        true
    }
}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let ctx = self.ctx;
        with_engine(self.root, |e, h| {
            action(e.on_request_headers(h, ctx, end_of_stream))
        })
        .unwrap_or(Action::Continue)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let ctx = self.ctx;
        with_engine(self.root, |e, h| {
            action(e.on_request_body(h, ctx, body_size, end_of_stream))
        })
        .unwrap_or(Action::Continue)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let ctx = self.ctx;
        with_engine(self.root, |e, h| e.on_response_headers(h, ctx));
        Action::Continue
    }

    fn on_http_response_body(&mut self, _body_size: usize, _end_of_stream: bool) -> Action {
        // cluster_metrics times the first response-body chunk (its TTFT).
        let ctx = self.ctx;
        with_engine(self.root, |e, h| action(e.on_response_body(h, ctx)))
            .unwrap_or(Action::Continue)
    }

    fn on_log(&mut self) {
        // Backstop for hosts that skip on_done: releasing twice is a no-op.
        let ctx = self.ctx;
        with_engine(self.root, |e, h| e.on_done(h, ctx));
    }
}

/// Higress delivers every Redis reply here, on the root context that made the call.
#[cfg(not(feature = "envoy"))]
#[no_mangle]
pub extern "C" fn proxy_on_redis_call_response(root_id: u32, token: u32, status: u32, size: u32) {
    // Higress: status 0 = the reply is readable; anything else = timeout or connection failure.
    let status = if status == 0 {
        ailb_core::balancer::CallStatus::Ok
    } else {
        ailb_core::balancer::CallStatus::Failed
    };
    with_engine(root_id, |e, h| {
        e.on_redis_reply(h, token, status, size as usize)
    });
}

/// Per-VM randomness (request ids, tie-break seeds) from WASI's random_get via std's hasher keys.
fn entropy() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x5eed);
    h.finish()
}
