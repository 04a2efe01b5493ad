//! Standard proxy-wasm 0.2.1 host calls (module "env"), with the status codes Envoy returns.
//! Stream calls act on the effective context if one is set, else on the context of the
//! current VM entry; on the root context they fail.

use crate::abi::{self, buffer, map, status, stream_type};
use crate::host_state::{HostState, C};
use crate::mem::{read_mem, return_bytes, write_mem, write_u32};
use crate::shared::level_name;
use crate::stream_data::{LocalReply, Pairs};
use anyhow::Result;
use wasmtime::Linker;

fn header_map(h: &mut HostState, t: i32) -> Option<&mut Pairs> {
    if t == map::HTTP_CALL_RESPONSE_HEADERS {
        return h.http_resp.as_mut().map(|r| &mut r.headers);
    }
    if t == map::HTTP_CALL_RESPONSE_TRAILERS {
        return h.http_resp.as_mut().map(|r| &mut r.trailers);
    }
    let s = h.stream()?;
    match t {
        map::REQUEST_HEADERS => Some(&mut s.req_headers),
        map::REQUEST_TRAILERS => Some(&mut s.req_trailers),
        map::RESPONSE_HEADERS => Some(&mut s.resp_headers),
        map::RESPONSE_TRAILERS => Some(&mut s.resp_trailers),
        _ => None,
    }
}

fn lower(k: &[u8]) -> Vec<u8> {
    k.to_ascii_lowercase()
}

pub fn add_to_linker(l: &mut Linker<HostState>) -> Result<()> {
    l.func_wrap(
        "env",
        "proxy_log",
        |mut c: C, level: i32, p: i32, n: i32| -> i32 {
            let _p = crate::instrument::span("proxy_log");
            let msg = tryst!(read_mem(&mut c, p, n));
            let h = c.data_mut();
            let line = format!(
                "[gw {}][worker {}][{}] {}",
                h.shared.cfg.gateway_id,
                h.worker,
                level_name(level),
                String::from_utf8_lossy(&msg)
            );
            if level >= h.shared.log_level {
                eprintln!("{line}");
            } else if let Some(buf) = h.startup_log.as_mut() {
                buf.push(line);
            }
            status::OK
        },
    )?;
    l.func_wrap("env", "proxy_get_log_level", |mut c: C, out: i32| -> i32 {
        let _p = crate::instrument::span("proxy_get_log_level");
        let lvl = c.data().shared.log_level as u32;
        tryst!(write_u32(&mut c, out, lvl));
        status::OK
    })?;
    l.func_wrap(
        "env",
        "proxy_get_current_time_nanoseconds",
        |mut c: C, out: i32| -> i32 {
            let _p = crate::instrument::span("proxy_get_current_time_nanoseconds");
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            tryst!(write_mem(&mut c, out, &now.to_le_bytes()));
            status::OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_tick_period_milliseconds",
        |mut c: C, ms: i32| -> i32 {
            let _p = crate::instrument::span("proxy_set_tick_period_milliseconds");
            c.data_mut().tick_period_ms = Some(ms as u32);
            status::OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_buffer_bytes",
        |mut c: C, t: i32, start: i32, max: i32, pp: i32, sp: i32| -> i32 {
            let _p = crate::instrument::span("proxy_get_buffer_bytes");
            if !(0..=buffer::MAX).contains(&t) {
                return status::BAD_ARGUMENT;
            }
            let h = c.data_mut();
            let data: Vec<u8> = match t {
                buffer::HTTP_REQUEST_BODY => match h.stream() {
                    Some(s) => s.req_body.clone(),
                    None => return status::NOT_FOUND,
                },
                buffer::HTTP_RESPONSE_BODY => match h.stream() {
                    Some(s) => s.resp_body.clone(),
                    None => return status::NOT_FOUND,
                },
                buffer::HTTP_CALL_RESPONSE_BODY => match &h.http_resp {
                    Some(r) => r.body.clone(),
                    None => return status::NOT_FOUND,
                },
                buffer::VM_CONFIGURATION => h.vm_config.clone(),
                buffer::PLUGIN_CONFIGURATION => h.shared.plugin_config.clone(),
                // Outside the callback Higress's getBuffer yields an empty string.
                buffer::REDIS_CALL_RESPONSE => h.redis_buf.clone().unwrap_or_default(),
                _ => return status::NOT_FOUND,
            };
            let (start, max) = (start as u32 as usize, max as u32 as usize);
            let end = start.saturating_add(max).min(data.len());
            let slice = if start < end {
                &data[start..end]
            } else {
                &[][..]
            };
            return_bytes(&mut c, slice, pp, sp)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_buffer_bytes",
        |mut c: C, t: i32, start: i32, size: i32, p: i32, n: i32| -> i32 {
            let _p = crate::instrument::span("proxy_set_buffer_bytes");
            let data = tryst!(read_mem(&mut c, p, n));
            let h = c.data_mut();
            let Some(s) = h.stream() else {
                return status::NOT_FOUND;
            };
            if t == buffer::HTTP_REQUEST_BODY {
                s.req_body_set = true;
            }
            let buf = match t {
                buffer::HTTP_REQUEST_BODY => &mut s.req_body,
                buffer::HTTP_RESPONSE_BODY => &mut s.resp_body,
                _ => return status::BAD_ARGUMENT,
            };
            // Envoy: start 0 + size >= len replaces; start == len appends; start 0 size 0 prepends.
            let (start, size) = (start as u32 as usize, size as u32 as usize);
            if start == 0 && size >= buf.len() {
                *buf = data;
            } else if start >= buf.len() {
                buf.extend_from_slice(&data);
            } else if start == 0 && size == 0 {
                let mut v = data;
                v.extend_from_slice(buf);
                *buf = v;
            } else {
                let end = (start + size).min(buf.len());
                buf.splice(start..end, data);
            }
            status::OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_header_map_pairs",
        |mut c: C, t: i32, pp: i32, sp: i32| -> i32 {
            let _p = crate::instrument::span("proxy_get_header_map_pairs");
            let Some(m) = header_map(c.data_mut(), t) else {
                return status::NOT_FOUND;
            };
            let enc = abi::encode_pairs(m);
            return_bytes(&mut c, &enc, pp, sp)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_header_map_pairs",
        |mut c: C, t: i32, p: i32, n: i32| -> i32 {
            let _p = crate::instrument::span("proxy_set_header_map_pairs");
            let data = tryst!(read_mem(&mut c, p, n));
            let Some(pairs) = abi::decode_pairs(&data) else {
                return status::BAD_ARGUMENT;
            };
            let Some(m) = header_map(c.data_mut(), t) else {
                return status::NOT_FOUND;
            };
            *m = pairs.into_iter().map(|(k, v)| (lower(&k), v)).collect();
            status::OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_header_map_value",
        |mut c: C, t: i32, kp: i32, kn: i32, pp: i32, sp: i32| -> i32 {
            let _p = crate::instrument::span("proxy_get_header_map_value");
            let key = lower(&tryst!(read_mem(&mut c, kp, kn)));
            let Some(m) = header_map(c.data_mut(), t) else {
                return status::NOT_FOUND;
            };
            let vals: Vec<&[u8]> = m
                .iter()
                .filter(|(k, _)| *k == key)
                .map(|(_, v)| &v[..])
                .collect();
            if vals.is_empty() {
                return status::NOT_FOUND;
            }
            // Envoy joins repeated headers with ','.
            let v = vals.join(&b","[..]);
            return_bytes(&mut c, &v, pp, sp)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_replace_header_map_value",
        |mut c: C, t: i32, kp: i32, kn: i32, vp: i32, vn: i32| -> i32 {
            let _p = crate::instrument::span("proxy_replace_header_map_value");
            let key = lower(&tryst!(read_mem(&mut c, kp, kn)));
            let val = tryst!(read_mem(&mut c, vp, vn));
            let Some(m) = header_map(c.data_mut(), t) else {
                return status::NOT_FOUND;
            };
            match m.iter().position(|(k, _)| *k == key) {
                Some(i) => {
                    m[i].1 = val;
                    let mut j = 0;
                    m.retain(|(k, _)| {
                        j += 1;
                        j - 1 == i || *k != key
                    });
                }
                None => m.push((key, val)),
            }
            status::OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_remove_header_map_value",
        |mut c: C, t: i32, kp: i32, kn: i32| -> i32 {
            let _p = crate::instrument::span("proxy_remove_header_map_value");
            let key = lower(&tryst!(read_mem(&mut c, kp, kn)));
            let Some(m) = header_map(c.data_mut(), t) else {
                return status::NOT_FOUND;
            };
            m.retain(|(k, _)| *k != key);
            status::OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_add_header_map_value",
        |mut c: C, t: i32, kp: i32, kn: i32, vp: i32, vn: i32| -> i32 {
            let _p = crate::instrument::span("proxy_add_header_map_value");
            let key = lower(&tryst!(read_mem(&mut c, kp, kn)));
            let val = tryst!(read_mem(&mut c, vp, vn));
            let Some(m) = header_map(c.data_mut(), t) else {
                return status::NOT_FOUND;
            };
            m.push((key, val));
            status::OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_property",
        |mut c: C, p: i32, n: i32, pp: i32, sp: i32| -> i32 {
            let _p = crate::instrument::span("proxy_get_property");
            let path = tryst!(read_mem(&mut c, p, n));
            let parts: Vec<&[u8]> = path.split(|b| *b == 0).collect();
            match c.data_mut().property(&parts) {
                Some(v) => return_bytes(&mut c, &v, pp, sp),
                None => status::NOT_FOUND,
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_property",
        |mut c: C, p: i32, n: i32, vp: i32, vn: i32| -> i32 {
            let _p = crate::instrument::span("proxy_set_property");
            tryst!(read_mem(&mut c, p, n));
            tryst!(read_mem(&mut c, vp, vn));
            // clear_route_cache and buffer limits are accepted; routes here depend on :path only.
            status::OK
        },
    )?;
    l.func_wrap("env", "proxy_continue_stream", |mut c: C, t: i32| -> i32 {
        let _p = crate::instrument::span("proxy_continue_stream");
        let Some(s) = c.data_mut().stream() else {
            return status::BAD_ARGUMENT;
        };
        let mut f = s.signals.flags.borrow_mut();
        match t {
            stream_type::HTTP_REQUEST => f.resume_request = true,
            stream_type::HTTP_RESPONSE => f.resume_response = true,
            _ => return status::BAD_ARGUMENT,
        }
        drop(f);
        s.signals.notify.notify_one();
        status::OK
    })?;
    l.func_wrap("env", "proxy_close_stream", |mut c: C, t: i32| -> i32 {
        let _p = crate::instrument::span("proxy_close_stream");
        let Some(s) = c.data_mut().stream() else {
            return status::BAD_ARGUMENT;
        };
        if t != stream_type::HTTP_REQUEST && t != stream_type::HTTP_RESPONSE {
            return status::BAD_ARGUMENT;
        }
        s.signals.flags.borrow_mut().close = true;
        s.signals.notify.notify_one();
        status::OK
    })?;
    l.func_wrap(
        "env",
        "proxy_send_local_response",
        |mut c: C,
         code: i32,
         dp: i32,
         dn: i32,
         bp: i32,
         bn: i32,
         hp: i32,
         hn: i32,
         _grpc: i32|
         -> i32 {
            let details = tryst!(read_mem(&mut c, dp, dn));
            let body = tryst!(read_mem(&mut c, bp, bn));
            let hdrs = tryst!(read_mem(&mut c, hp, hn));
            let Some(headers) = abi::decode_pairs(&hdrs) else {
                return status::BAD_ARGUMENT;
            };
            let Some(s) = c.data_mut().stream() else {
                return status::BAD_ARGUMENT;
            };
            let reply = LocalReply {
                status: code as u16,
                details: String::from_utf8_lossy(&details).into_owned(),
                body,
                headers,
            };
            s.signals.flags.borrow_mut().local_reply = Some(reply);
            s.signals.notify.notify_one();
            status::OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_status",
        |mut c: C, codep: i32, pp: i32, sp: i32| -> i32 {
            let _p = crate::instrument::span("proxy_get_status");
            let (code, msg) = c.data().status.clone();
            tryst!(write_u32(&mut c, codep, code));
            return_bytes(&mut c, &msg, pp, sp)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_effective_context",
        |mut c: C, id: i32| -> i32 {
            let _p = crate::instrument::span("proxy_set_effective_context");
            let h = c.data_mut();
            if !h.is_live_context(id as u32) {
                return status::BAD_ARGUMENT;
            }
            h.effective = Some(id as u32);
            status::OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_call_foreign_function",
        |mut c: C, np: i32, nn: i32, _ap: i32, _an: i32, pp: i32, sp: i32| -> i32 {
            let _p = crate::instrument::span("proxy_call_foreign_function");
            let name = tryst!(read_mem(&mut c, np, nn));
            match &name[..] {
                b"get_log_level" => {
                    let lvl = (c.data().shared.log_level as u32).to_le_bytes();
                    return_bytes(&mut c, &lvl, pp, sp)
                }
                _ => status::NOT_FOUND,
            }
        },
    )?;
    l.func_wrap("env", "proxy_done", |_: C| -> i32 { status::OK })?;
    crate::hostcalls_data::add_to_linker(l)?;
    crate::callouts::add_to_linker(l)?;
    Ok(())
}
