//! Behaviour is chosen per request by the `x-tp-mode` request header; observations are
//! reported through request headers (echoed by the test upstream), response headers,
//! local replies and process-wide counters (`tp.*` in the admin /stats). `x-tp-target: NAME`
//! writes NAME into `x-higress-target-cluster` (in the headers callback, or at the end of the
//! body in `pause` mode) for `cluster_header` routes.
#![allow(clippy::missing_safety_doc)]

use std::cell::RefCell;
use std::collections::HashMap;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, p: *const u8, n: usize) -> u32;
    fn proxy_get_buffer_bytes(t: u32, start: usize, max: usize, rp: *mut *mut u8, rn: *mut usize) -> u32;
    fn proxy_get_header_map_value(t: u32, k: *const u8, kn: usize, rp: *mut *mut u8, rn: *mut usize) -> u32;
    fn proxy_add_header_map_value(t: u32, k: *const u8, kn: usize, v: *const u8, vn: usize) -> u32;
    fn proxy_replace_header_map_value(t: u32, k: *const u8, kn: usize, v: *const u8, vn: usize) -> u32;
    fn proxy_continue_stream(t: u32) -> u32;
    fn proxy_send_local_response(code: u32, dp: *const u8, dn: usize, bp: *const u8, bn: usize, hp: *const u8, hn: usize, grpc: i32) -> u32;
    fn proxy_set_effective_context(id: u32) -> u32;
    fn proxy_get_status(code: *mut u32, rp: *mut *mut u8, rn: *mut usize) -> u32;
    fn proxy_define_metric(t: u32, p: *const u8, n: usize, id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, off: i64) -> u32;
    fn proxy_redis_init(cp: *const u8, cn: usize, up: *const u8, un: usize, pp: *const u8, pn: usize, timeout: u32) -> u32;
    fn proxy_redis_call(cp: *const u8, cn: usize, qp: *const u8, qn: usize, tok: *mut u32) -> u32;
    fn proxy_get_upstream_hosts(rp: *mut *mut u8, rn: *mut usize) -> u32;
    fn proxy_set_upstream_override_host(p: *const u8, n: usize) -> u32;
    fn proxy_get_property(p: *const u8, n: usize, rp: *mut *mut u8, rn: *mut usize) -> u32;
}

#[cfg(not(feature = "abi100"))]
#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}
#[cfg(feature = "abi100")]
#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_100() {}

#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    let mut v: Vec<u8> = Vec::with_capacity(size.max(1));
    let p = v.as_mut_ptr();
    std::mem::forget(v);
    p
}

#[derive(Default)]
struct Req {
    mode: String,
    override_host: String,
    /// `x-tp-target`: the cluster name to write into `x-higress-target-cluster`.
    target: Option<String>,
    query: Vec<u8>,
    body_calls: u32,
}

#[derive(Default)]
struct State {
    cluster: String,
    reqs: HashMap<u32, Req>,
    tokens: HashMap<u32, u32>,
    metrics: HashMap<&'static str, u32>,
}

thread_local! { static ST: RefCell<State> = RefCell::new(State::default()); }

fn log(msg: &str) {
    unsafe { proxy_log(2, msg.as_ptr(), msg.len()) };
}

fn take(p: *mut u8, n: usize) -> Vec<u8> {
    if p.is_null() { Vec::new() } else { unsafe { Vec::from_raw_parts(p, n, n) } }
}

fn buffer(t: u32) -> (u32, Vec<u8>) {
    let (mut p, mut n) = (std::ptr::null_mut(), 0);
    let s = unsafe { proxy_get_buffer_bytes(t, 0, usize::MAX >> 1, &mut p, &mut n) };
    (s, take(p, n))
}

fn header(name: &str) -> Option<String> {
    let (mut p, mut n) = (std::ptr::null_mut(), 0);
    let s = unsafe { proxy_get_header_map_value(0, name.as_ptr(), name.len(), &mut p, &mut n) };
    (s == 0).then(|| String::from_utf8_lossy(&take(p, n)).into_owned())
}

fn add_header(map: u32, k: &str, v: &str) -> u32 {
    unsafe { proxy_add_header_map_value(map, k.as_ptr(), k.len(), v.as_ptr(), v.len()) }
}

/// Route by Envoy's `cluster_header`: name the cluster in `x-higress-target-cluster`.
fn set_target(target: &Option<String>) {
    if let Some(t) = target {
        let k = "x-higress-target-cluster";
        unsafe { proxy_replace_header_map_value(0, k.as_ptr(), k.len(), t.as_ptr(), t.len()) };
    }
}

fn property(name: &str) -> Option<String> {
    let (mut p, mut n) = (std::ptr::null_mut(), 0);
    let s = unsafe { proxy_get_property(name.as_ptr(), name.len(), &mut p, &mut n) };
    (s == 0).then(|| String::from_utf8_lossy(&take(p, n)).into_owned())
}

fn local(code: u32, body: &str) {
    let empty = 0u32.to_le_bytes();
    unsafe { proxy_send_local_response(code, std::ptr::null(), 0, body.as_ptr(), body.len(), empty.as_ptr(), 4, -1) };
}

fn count(name: &'static str) {
    ST.with(|s| {
        let mut s = s.borrow_mut();
        let id = *s.metrics.entry(name).or_insert_with(|| {
            let mut id = 0;
            unsafe { proxy_define_metric(0, name.as_ptr(), name.len(), &mut id) };
            id
        });
        unsafe { proxy_increment_metric(id, 1) };
    });
}

fn set_override(addr: &str) {
    if !addr.is_empty() {
        unsafe { proxy_set_upstream_override_host(addr.as_ptr(), addr.len()) };
    }
}

/// Find `"key":"value"` in the config JSON (enough for test configs).
fn cfg_str(cfg: &str, key: &str) -> Option<String> {
    let pat = format!("\"{key}\":\"");
    let i = cfg.find(&pat)? + pat.len();
    Some(cfg[i..].split('"').next()?.to_string())
}

fn cfg_num(cfg: &str, key: &str) -> Option<u32> {
    let pat = format!("\"{key}\":");
    let i = cfg.find(&pat)? + pat.len();
    cfg[i..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_root: u32, _n: usize) -> u32 { 1 }

#[no_mangle]
pub extern "C" fn proxy_on_configure(_root: u32, _n: usize) -> u32 {
    let cfg = String::from_utf8_lossy(&buffer(7).1).into_owned();
    log(&format!("testplugin configured: {cfg}"));
    if cfg.contains("\"reject\":true") {
        log("testplugin: rejecting config");
        return 0;
    }
    if let Some(cluster) = cfg_str(&cfg, "redis") {
        let init = cfg_str(&cfg, "redis_init").unwrap_or_else(|| cluster.clone());
        let timeout = cfg_num(&cfg, "timeout").unwrap_or(1000);
        let s = unsafe { proxy_redis_init(init.as_ptr(), init.len(), b"".as_ptr(), 0, b"".as_ptr(), 0, timeout) };
        log(&format!("redis_init status {s}"));
        ST.with(|st| st.borrow_mut().cluster = cluster);
    }
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(ctx: u32, root: u32) {
    if root != 0 {
        count("tp.ctx_created");
        ST.with(|s| s.borrow_mut().reqs.insert(ctx, Req::default()));
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(ctx: u32, _n: usize, eos: u32) -> u32 {
    let mode = header("x-tp-mode").unwrap_or_default();
    let ovr = header("x-tp-override").unwrap_or_default();
    let target = header("x-tp-target");
    let query = header("x-tp-query").map(|q| q.replace("\\r\\n", "\r\n").into_bytes())
        .unwrap_or_else(|| b"*1\r\n$4\r\nPING\r\n".to_vec());
    ST.with(|s| {
        if let Some(r) = s.borrow_mut().reqs.get_mut(&ctx) {
            r.mode = mode.clone();
            r.override_host = ovr.clone();
            r.target = target.clone();
            r.query = query.clone();
        }
    });
    add_header(0, "x-tp-route", &property("route_name").unwrap_or_else(|| "none".into()));
    add_header(0, "x-tp-cluster", &property("cluster_name").unwrap_or_else(|| "none".into()));
    // "pause" names the cluster only at the end of the body, while the headers are held.
    if mode != "pause" {
        set_target(&target);
    }
    match mode.as_str() {
        "pause" => 1,
        "pause_end" if eos != 0 => 1,
        "override" => { set_override(&ovr); 0 }
        "local" => { local(418, "teapot"); 1 }
        // Kills the VM (a wasm trap), as a Go plugin's runtime abort does.
        "trap" => core::arch::wasm32::unreachable(),
        "hosts" => {
            let (mut p, mut n) = (std::ptr::null_mut(), 0);
            let s = unsafe { proxy_get_upstream_hosts(&mut p, &mut n) };
            let raw = take(p, n);
            let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
            let cluster = property("cluster_name").unwrap_or_else(|| "none".into());
            local(200, &format!("status={s} ptr_null={} hex={hex} cluster={cluster}", p.is_null()));
            1
        }
        "effective" => {
            let bad = unsafe { proxy_set_effective_context(99999) };
            let me = unsafe { proxy_set_effective_context(ctx) };
            local(200, &format!("bad={bad} self={me}"));
            1
        }
        "redis" => {
            let cluster = ST.with(|s| s.borrow().cluster.clone());
            let mut tok = 0u32;
            let s = unsafe { proxy_redis_call(cluster.as_ptr(), cluster.len(), query.as_ptr(), query.len(), &mut tok) };
            add_header(0, "x-tp-call-status", &s.to_string());
            if s != 0 { return 0; }
            ST.with(|st| st.borrow_mut().tokens.insert(tok, ctx));
            1
        }
        _ => 0,
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_request_body(ctx: u32, len: usize, eos: u32) -> u32 {
    count("tp.body_calls");
    let mode = ST.with(|s| {
        let mut s = s.borrow_mut();
        let r = s.reqs.get_mut(&ctx);
        r.map(|r| { r.body_calls += 1; (r.mode.clone(), r.override_host.clone(), r.target.clone()) }).unwrap_or_default()
    });
    match mode.0.as_str() {
        "pause" if eos != 0 => {
            add_header(0, "x-tp-body-len", &len.to_string());
            set_override(&mode.1);
            set_target(&mode.2);
            unsafe { proxy_continue_stream(0) };
            1
        }
        "pause" => 1,
        "late_override" => { set_override(&mode.1); 0 }
        _ => 0,
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_redis_call_response(root: u32, token: u32, status: u32, size: usize) {
    count(if status == 0 { "tp.redis_ok" } else { "tp.redis_fail" });
    let (bs, reply) = buffer(9);
    let (mut code, mut p, mut n) = (0u32, std::ptr::null_mut(), 0);
    unsafe { proxy_get_status(&mut code, &mut p, &mut n) };
    let msg = String::from_utf8_lossy(&take(p, n)).into_owned();
    // A stream call on the root context must fail.
    let root_call = unsafe { proxy_continue_stream(0) };
    let Some(ctx) = ST.with(|s| s.borrow_mut().tokens.remove(&token)) else { return };
    if unsafe { proxy_set_effective_context(ctx) } != 0 {
        count("tp.redis_dead_ctx");
        return;
    }
    let ovr = ST.with(|s| s.borrow().reqs.get(&ctx).map(|r| r.override_host.clone()).unwrap_or_default());
    set_override(&ovr);
    let esc = String::from_utf8_lossy(&reply).replace('\r', "\\r").replace('\n', "\\n");
    add_header(0, "x-tp-redis", &format!("root={root} token={token} status={status} size={size} buf_status={bs} len={} code={code} msg={msg} root_call={root_call}", reply.len()));
    add_header(0, "x-tp-reply", &esc);
    unsafe { proxy_continue_stream(0) };
}

#[no_mangle]
pub extern "C" fn proxy_on_response_headers(_ctx: u32, _n: usize, _eos: u32) -> u32 {
    count("tp.response_headers");
    let (s, b) = buffer(9);
    add_header(2, "x-tp-buf9-outside", &format!("{s}:{}", b.len()));
    let upstream = property("upstream\0address").unwrap_or_else(|| "none".into());
    add_header(2, "x-tp-upstream", &upstream);
    0
}

#[no_mangle]
pub extern "C" fn proxy_on_done(_ctx: u32) -> u32 { count("tp.on_done"); 1 }
#[no_mangle]
pub extern "C" fn proxy_on_log(_ctx: u32) { count("tp.on_log"); }
#[no_mangle]
pub extern "C" fn proxy_on_delete(ctx: u32) {
    count("tp.on_delete");
    ST.with(|s| s.borrow_mut().reqs.remove(&ctx));
}
