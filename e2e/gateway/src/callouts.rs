//! `proxy_http_call` (queued; the worker performs it after the VM call returns) and gRPC
//! stubs (the plugin does not use gRPC; the imports exist so a module importing them loads).

use crate::abi::{self, status};
use crate::host_state::{HostState, C};
use crate::mem::{read_mem, write_u32};
use crate::stream_data::HttpOut;
use anyhow::Result;
use wasmtime::Linker;

pub fn add_to_linker(l: &mut Linker<HostState>) -> Result<()> {
    l.func_wrap(
        "env",
        "proxy_http_call",
        |mut c: C,
         up: i32,
         un: i32,
         hp: i32,
         hn: i32,
         bp: i32,
         bn: i32,
         tp: i32,
         tn: i32,
         timeout: i32,
         tokp: i32|
         -> i32 {
            let cluster = String::from_utf8_lossy(&tryst!(read_mem(&mut c, up, un))).into_owned();
            let hdrs = tryst!(read_mem(&mut c, hp, hn));
            let body = tryst!(read_mem(&mut c, bp, bn));
            tryst!(read_mem(&mut c, tp, tn));
            let Some(headers) = abi::decode_pairs(&hdrs) else {
                return status::BAD_ARGUMENT;
            };
            if !c.data().shared.clusters.contains_key(&cluster) {
                return status::BAD_ARGUMENT;
            }
            // Envoy requires the three pseudo headers.
            for need in [&b":method"[..], b":path", b":authority"] {
                if !headers.iter().any(|(k, _)| k == need) {
                    return status::BAD_ARGUMENT;
                }
            }
            let h = c.data_mut();
            let token = h.next_http_token;
            h.next_http_token = h.next_http_token.wrapping_add(4);
            let context_id = h.target();
            h.http_out.push(HttpOut {
                context_id,
                token,
                cluster,
                headers,
                body,
                timeout_ms: timeout as u32 as u64,
            });
            tryst!(write_u32(&mut c, tokp, token));
            status::OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_grpc_call",
        |_: C,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32|
         -> i32 { status::UNIMPLEMENTED },
    )?;
    l.func_wrap(
        "env",
        "proxy_grpc_stream",
        |_: C, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32| -> i32 {
            status::UNIMPLEMENTED
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_grpc_send",
        |_: C, _: i32, _: i32, _: i32, _: i32| -> i32 { status::UNIMPLEMENTED },
    )?;
    l.func_wrap("env", "proxy_grpc_cancel", |_: C, _: i32| -> i32 {
        status::UNIMPLEMENTED
    })?;
    l.func_wrap("env", "proxy_grpc_close", |_: C, _: i32| -> i32 {
        status::UNIMPLEMENTED
    })?;
    Ok(())
}
