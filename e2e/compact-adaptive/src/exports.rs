//! The Proxy-Wasm callbacks over [`crate::stats`], one VM's state in a static (a wasm VM is
//! single-threaded). Raw host imports; every status other than Ok is handled, none panics.

use crate::stats::{self, Record, NAMES, RECORD_LEN};
use std::cell::UnsafeCell;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_get_current_time_nanoseconds(t: *mut u64) -> u32;
    fn proxy_get_shared_data(
        k: *const u8,
        ks: usize,
        v: *mut *mut u8,
        vs: *mut usize,
        cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(k: *const u8, ks: usize, v: *const u8, vs: usize, cas: u32) -> u32;
    fn proxy_get_header_map_value(
        m: u32,
        k: *const u8,
        ks: usize,
        v: *mut *mut u8,
        vs: *mut usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        m: u32,
        k: *const u8,
        ks: usize,
        v: *const u8,
        vs: usize,
    ) -> u32;
    fn proxy_define_metric(t: u32, n: *const u8, ns: usize, id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, delta: i64) -> u32;
}

const OK: u32 = 0;
const CAS_MISMATCH: u32 = 8;
const REQUEST_HEADERS: u32 = 0;
const RESPONSE_HEADERS: u32 = 2;
const KEY: &[u8] = b"ailb.compact-adaptive";
const CLUSTER_HEADER: &[u8] = b"x-higress-target-cluster";
/// Streams in flight per worker are far fewer; two in one slot only mix their samples.
const SLOTS: usize = 1024;

/// A stream's request, from its decision to its end.
#[derive(Clone, Copy)]
struct Stream {
    live: bool,
    service: u8,
    ok: bool,
    start_ms: i64,
    ttft_ms: Option<i64>,
}

const IDLE: Stream = Stream {
    live: false,
    service: 0,
    ok: false,
    start_ms: 0,
    ttft_ms: None,
};

struct Vm {
    streams: [Stream; SLOTS],
    counter: u32,
}

struct Static(UnsafeCell<Vm>);
// SAFETY: a wasm VM runs one callback at a time on one thread.
unsafe impl Sync for Static {}
static VM: Static = Static(UnsafeCell::new(Vm {
    streams: [IDLE; SLOTS],
    counter: 0,
}));

fn vm() -> &'static mut Vm {
    // SAFETY: callbacks never nest, so no two of these borrows are alive at once.
    unsafe { &mut *VM.0.get() }
}

fn stream(id: u32) -> &'static mut Stream {
    &mut vm().streams[id as usize % SLOTS]
}

fn now_ms() -> i64 {
    let mut ns = 0u64;
    // SAFETY: the host writes one u64 through the pointer.
    match unsafe { proxy_get_current_time_nanoseconds(&mut ns) } {
        OK => (ns / 1_000_000) as i64,
        _ => 0,
    }
}

/// Takes ownership of a buffer the host allocated through `proxy_on_memory_allocate`.
fn owned(ptr: *mut u8, len: usize) -> Vec<u8> {
    if ptr.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: allocated by `proxy_on_memory_allocate(len)` with a Vec<u8>'s layout.
    unsafe { Vec::from_raw_parts(ptr, len, len) }
}

/// Read, change and compare-and-swap the record, at most four times.
fn update<T>(mut change: impl FnMut(&mut Record) -> T) -> Option<T> {
    for _ in 0..4 {
        let (mut ptr, mut len, mut cas) = (std::ptr::null_mut(), 0, 0);
        // SAFETY: the host writes a pointer, a length and a token through the pointers.
        let status =
            unsafe { proxy_get_shared_data(KEY.as_ptr(), KEY.len(), &mut ptr, &mut len, &mut cas) };
        let mut record = match status {
            OK => stats::decode(&owned(ptr, len)),
            _ => {
                cas = 0;
                Record::default()
            }
        };
        let out = change(&mut record);
        let bytes: [u8; RECORD_LEN] = stats::encode(&record);
        // SAFETY: key and value are live slices.
        match unsafe {
            proxy_set_shared_data(KEY.as_ptr(), KEY.len(), bytes.as_ptr(), bytes.len(), cas)
        } {
            OK => return Some(out),
            CAS_MISMATCH => continue,
            _ => return None,
        }
    }
    None
}

#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    match std::alloc::Layout::array::<u8>(size) {
        // SAFETY: the layout has a non-zero size.
        Ok(layout) if size > 0 => unsafe { std::alloc::alloc(layout) },
        Ok(_) => std::ptr::NonNull::dangling().as_ptr(),
        Err(_) => std::ptr::null_mut(),
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_root: u32, _size: usize) -> bool {
    true
}

#[no_mangle]
pub extern "C" fn proxy_on_configure(_root: u32, _size: usize) -> bool {
    let name = b"compact.routed";
    // SAFETY: the host writes the id through the pointer.
    unsafe { proxy_define_metric(0, name.as_ptr(), name.len(), &mut vm().counter) == OK }
}

// The callbacks it has no use for are exported all the same, as the empty module exports them
// (e2e/suite/src/empty_plugin.rs): the same VM entries per request, so the floor subtracted is
// the host's share of this module too.
#[no_mangle]
pub extern "C" fn proxy_on_context_create(_id: u32, _parent: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(id: u32, _headers: usize, _eos: u32) -> u32 {
    let now = now_ms();
    let chosen = update(|record| {
        let i = stats::choose(record, now);
        if let Some(s) = record.get_mut(i) {
            s.ongoing = s.ongoing.saturating_add(1);
        }
        i
    });
    // Record trouble: a fresh table's choice, and no count to give back.
    let service = chosen.unwrap_or_else(|| stats::choose(&Record::default(), now));
    let name = NAMES.get(service).copied().unwrap_or_default();
    // SAFETY: live slices; the statuses change nothing here (the route falls back). The
    // replace drops the client's copies of the header too, as the plugin relies on.
    unsafe {
        proxy_replace_header_map_value(
            REQUEST_HEADERS,
            CLUSTER_HEADER.as_ptr(),
            CLUSTER_HEADER.len(),
            name.as_ptr(),
            name.len(),
        );
        proxy_increment_metric(vm().counter, 1);
    }
    *stream(id) = Stream {
        live: chosen.is_some(),
        service: service as u8,
        ok: false,
        start_ms: now,
        ttft_ms: None,
    };
    0
}

#[no_mangle]
pub extern "C" fn proxy_on_request_body(_id: u32, _size: usize, _eos: u32) -> u32 {
    0
}

#[no_mangle]
pub extern "C" fn proxy_on_response_headers(id: u32, _headers: usize, _eos: u32) -> u32 {
    let s = stream(id);
    if s.live {
        let (key, mut ptr, mut len) = (b":status", std::ptr::null_mut(), 0);
        // SAFETY: the host writes a pointer and a length through the pointers.
        let status = unsafe {
            proxy_get_header_map_value(
                RESPONSE_HEADERS,
                key.as_ptr(),
                key.len(),
                &mut ptr,
                &mut len,
            )
        };
        s.ok = status == OK && owned(ptr, len) == b"200";
    }
    0
}

#[no_mangle]
pub extern "C" fn proxy_on_response_body(id: u32, _size: usize, _eos: u32) -> u32 {
    let s = stream(id);
    if s.live && s.ttft_ms.is_none() {
        s.ttft_ms = Some(now_ms() - s.start_ms);
    }
    0
}

/// Stream end: the count back and the samples in, once (`live` is cleared first).
#[no_mangle]
pub extern "C" fn proxy_on_done(id: u32) -> bool {
    let s = stream(id);
    if s.live {
        s.live = false;
        let done = *s;
        let now = now_ms();
        update(|record| {
            let total = now - done.start_ms;
            stats::on_end(
                record,
                usize::from(done.service),
                done.ttft_ms,
                total,
                done.ok,
                now,
            );
        });
    }
    true
}

#[no_mangle]
pub extern "C" fn proxy_on_log(_id: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_delete(_id: u32) {}
