//! Process-wide data host calls: shared data with CAS (across all worker VMs), metrics
//! (same name → same id everywhere) and the unimplemented shared queues.

use crate::abi::status;
use crate::host_state::{HostState, C};
use crate::mem::{read_mem, return_bytes, write_mem, write_u32};
use crate::shared::MetricKind;
use anyhow::Result;
use wasmtime::Linker;

pub fn add_to_linker(l: &mut Linker<HostState>) -> Result<()> {
    l.func_wrap(
        "env",
        "proxy_get_shared_data",
        |mut c: C, kp: i32, kn: i32, pp: i32, sp: i32, casp: i32| -> i32 {
            let _p = crate::instrument::span("proxy_get_shared_data");
            let key = tryst!(read_mem(&mut c, kp, kn));
            let Some((v, cas)) = c.data().shared.get_shared(&key) else {
                return status::NOT_FOUND;
            };
            let s = return_bytes(&mut c, &v, pp, sp);
            if s != status::OK {
                return s;
            }
            tryst!(write_u32(&mut c, casp, cas));
            status::OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_shared_data",
        |mut c: C, kp: i32, kn: i32, vp: i32, vn: i32, cas: i32| -> i32 {
            let _p = crate::instrument::span("proxy_set_shared_data");
            let key = tryst!(read_mem(&mut c, kp, kn));
            let val = tryst!(read_mem(&mut c, vp, vn));
            c.data().shared.set_shared(&key, &val, cas as u32)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_register_shared_queue",
        |_: C, _: i32, _: i32, _: i32| -> i32 { status::UNIMPLEMENTED },
    )?;
    l.func_wrap(
        "env",
        "proxy_resolve_shared_queue",
        |_: C, _: i32, _: i32, _: i32, _: i32, _: i32| -> i32 { status::UNIMPLEMENTED },
    )?;
    l.func_wrap(
        "env",
        "proxy_dequeue_shared_queue",
        |_: C, _: i32, _: i32, _: i32| -> i32 { status::UNIMPLEMENTED },
    )?;
    l.func_wrap(
        "env",
        "proxy_enqueue_shared_queue",
        |_: C, _: i32, _: i32, _: i32| -> i32 { status::UNIMPLEMENTED },
    )?;
    l.func_wrap(
        "env",
        "proxy_define_metric",
        |mut c: C, t: i32, np: i32, nn: i32, idp: i32| -> i32 {
            let _p = crate::instrument::span("proxy_define_metric");
            let name = tryst!(read_mem(&mut c, np, nn));
            let kind = match t {
                0 => MetricKind::Counter,
                1 => MetricKind::Gauge,
                2 => MetricKind::Histogram,
                _ => return status::BAD_ARGUMENT,
            };
            let id = c
                .data()
                .shared
                .define_metric(kind, &String::from_utf8_lossy(&name));
            tryst!(write_u32(&mut c, idp, id));
            status::OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_increment_metric",
        |c: C, id: i32, off: i64| -> i32 {
            let _p = crate::instrument::span("proxy_increment_metric");
            let Some(m) = c.data().shared.metric(id as u32) else {
                return status::NOT_FOUND;
            };
            if m.kind == MetricKind::Histogram {
                return status::BAD_ARGUMENT;
            }
            m.value.fetch_add(off, std::sync::atomic::Ordering::Relaxed);
            status::OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_record_metric",
        |c: C, id: i32, v: i64| -> i32 {
            let _p = crate::instrument::span("proxy_record_metric");
            let Some(m) = c.data().shared.metric(id as u32) else {
                return status::NOT_FOUND;
            };
            match m.kind {
                MetricKind::Histogram => {
                    m.value.fetch_add(v, std::sync::atomic::Ordering::Relaxed);
                    m.count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                _ => m.value.store(v, std::sync::atomic::Ordering::Relaxed),
            }
            status::OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_metric",
        |mut c: C, id: i32, out: i32| -> i32 {
            let _p = crate::instrument::span("proxy_get_metric");
            let Some(m) = c.data().shared.metric(id as u32) else {
                return status::NOT_FOUND;
            };
            let v = m.value.load(std::sync::atomic::Ordering::Relaxed) as u64;
            tryst!(write_mem(&mut c, out, &v.to_le_bytes()));
            status::OK
        },
    )?;
    Ok(())
}
