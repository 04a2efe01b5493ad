//! Higress host emulator: loads a Proxy-Wasm plugin unchanged and runs it the way Higress's
//! Envoy host does (ABI detection, Higress Redis/upstream extensions, stream lifecycle), in
//! front of real HTTP upstreams and a real Redis. See README.md.

/// Host-call helper: unwrap a `Result<T, i32>` or return the status code to the guest.
macro_rules! tryst {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(s) => return s,
        }
    };
}

pub mod abi;
pub mod admin;
pub mod callouts;
pub mod cli;
pub mod config;
pub mod gateway;
pub mod health;
pub mod higress;
pub mod host_state;
pub mod hostcalls;
pub mod hostcalls_data;
pub mod instrument;
pub mod mem;
mod module_cache;
pub mod redis;
pub mod response;
pub mod retry_policy;
pub mod router;
pub mod shared;
pub mod stream;
pub mod stream_data;
pub mod upstream;
pub mod vm;
pub mod wasi;
pub mod worker;
