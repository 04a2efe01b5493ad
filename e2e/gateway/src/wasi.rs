//! The few WASI preview1 calls a Rust wasm32-wasip1 cdylib makes (stdio writes, clocks,
//! randomness, args/environ, proc_exit, and poll_oneoff as Higress answers it). Implemented here rather than with wasmtime-wasi
//! because its sync adapter blocks on a Tokio runtime, which panics inside our worker loops.
//! Any other WASI import the module declares answers ENOSYS instead of failing the load.

use crate::host_state::{HostState, C};
use crate::mem::{read_mem, write_mem, write_u32};
use anyhow::Result;
use std::io::Write;
use wasmtime::{Linker, Module, Val};

const ERRNO_SUCCESS: i32 = 0;
const ERRNO_BADF: i32 = 8;
const ERRNO_FAULT: i32 = 21;
const ERRNO_NOSYS: i32 = 52;

fn strings_sizes(v: &[String]) -> (u32, u32) {
    (v.len() as u32, v.iter().map(|s| s.len() as u32 + 1).sum())
}

fn strings_write(c: &mut C, v: Vec<String>, ptrs: i32, buf: i32) -> i32 {
    let mut at = buf as u32;
    for (i, s) in v.iter().enumerate() {
        if write_u32(c, ptrs + 4 * i as i32, at).is_err() {
            return ERRNO_FAULT;
        }
        let mut b = s.as_bytes().to_vec();
        b.push(0);
        if write_mem(c, at as i32, &b).is_err() {
            return ERRNO_FAULT;
        }
        at += b.len() as u32;
    }
    ERRNO_SUCCESS
}

pub fn add_to_linker(l: &mut Linker<HostState>, module: &Module) -> Result<()> {
    for m in ["wasi_snapshot_preview1", "wasi_unstable"] {
        l.func_wrap(
            m,
            "fd_write",
            |mut c: C, fd: i32, iovs: i32, n: i32, outp: i32| -> i32 {
                if fd != 1 && fd != 2 {
                    return ERRNO_BADF;
                }
                let mut total = 0u32;
                let mut out = Vec::new();
                for i in 0..n {
                    let Ok(iov) = read_mem(&mut c, iovs + 8 * i, 8) else {
                        return ERRNO_FAULT;
                    };
                    let p = i32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
                    let len = i32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
                    let Ok(data) = read_mem(&mut c, p, len) else {
                        return ERRNO_FAULT;
                    };
                    total += data.len() as u32;
                    out.extend_from_slice(&data);
                }
                // Plugin stdout/stderr both go to our stderr: stdout carries the READY line.
                let _ = std::io::stderr().write_all(&out);
                match write_u32(&mut c, outp, total) {
                    Ok(()) => ERRNO_SUCCESS,
                    Err(_) => ERRNO_FAULT,
                }
            },
        )?;
        l.func_wrap(m, "random_get", |mut c: C, p: i32, n: i32| -> i32 {
            let _p = crate::instrument::span("random_get");
            let mut buf = vec![0u8; n as u32 as usize];
            rand::fill(&mut buf[..]);
            match write_mem(&mut c, p, &buf) {
                Ok(()) => ERRNO_SUCCESS,
                Err(_) => ERRNO_FAULT,
            }
        })?;
        l.func_wrap(
            m,
            "clock_time_get",
            |mut c: C, id: i32, _prec: i64, out: i32| -> i32 {
                let _p = crate::instrument::span("clock_time_get");
                let ns = if id == 0 {
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_nanos() as u64)
                        .unwrap_or(0)
                } else {
                    monotonic_ns()
                };
                match write_mem(&mut c, out, &ns.to_le_bytes()) {
                    Ok(()) => ERRNO_SUCCESS,
                    Err(_) => ERRNO_FAULT,
                }
            },
        )?;
        l.func_wrap(m, "clock_res_get", |mut c: C, _id: i32, out: i32| -> i32 {
            match write_mem(&mut c, out, &1u64.to_le_bytes()) {
                Ok(()) => ERRNO_SUCCESS,
                Err(_) => ERRNO_FAULT,
            }
        })?;
        l.func_wrap(
            m,
            "environ_sizes_get",
            |mut c: C, np: i32, sp: i32| -> i32 {
                let (n, s) = strings_sizes(&c.data().wasi_env);
                match write_u32(&mut c, np, n).and_then(|_| write_u32(&mut c, sp, s)) {
                    Ok(()) => ERRNO_SUCCESS,
                    Err(_) => ERRNO_FAULT,
                }
            },
        )?;
        l.func_wrap(m, "environ_get", |mut c: C, ptrs: i32, buf: i32| -> i32 {
            let v = c.data().wasi_env.clone();
            strings_write(&mut c, v, ptrs, buf)
        })?;
        l.func_wrap(m, "args_sizes_get", |mut c: C, np: i32, sp: i32| -> i32 {
            let (n, s) = strings_sizes(&c.data().wasi_args);
            match write_u32(&mut c, np, n).and_then(|_| write_u32(&mut c, sp, s)) {
                Ok(()) => ERRNO_SUCCESS,
                Err(_) => ERRNO_FAULT,
            }
        })?;
        l.func_wrap(m, "args_get", |mut c: C, ptrs: i32, buf: i32| -> i32 {
            let v = c.data().wasi_args.clone();
            strings_write(&mut c, v, ptrs, buf)
        })?;
        l.func_wrap(
            m,
            "proc_exit",
            |mut c: C, code: i32| -> wasmtime::Result<()> {
                c.data_mut().exit_code = Some(code);
                Err(wasmtime::Error::msg(format!("proc_exit({code})")))
            },
        )?;
        l.func_wrap(m, "sched_yield", |_: C| -> i32 { ERRNO_SUCCESS })?;
        // Higress's host answers poll_oneoff with success and zero events, without waiting
        // (docs/higress-abi.md §3): the Go runtime polls a clock subscription to sleep and
        // aborts the VM on any error (its first garbage collection, in practice).
        l.func_wrap(
            m,
            "poll_oneoff",
            |mut c: C, _in: i32, _out: i32, _n: i32, nevents: i32| -> i32 {
                match write_u32(&mut c, nevents, 0) {
                    Ok(()) => ERRNO_SUCCESS,
                    Err(_) => ERRNO_FAULT,
                }
            },
        )?;
        l.func_wrap(m, "fd_prestat_get", |_: C, _: i32, _: i32| -> i32 {
            ERRNO_BADF
        })?;
    }
    const DEFINED: &[&str] = &[
        "fd_write",
        "random_get",
        "clock_time_get",
        "clock_res_get",
        "environ_sizes_get",
        "environ_get",
        "args_sizes_get",
        "args_get",
        "proc_exit",
        "sched_yield",
        "fd_prestat_get",
        "poll_oneoff",
    ];
    for imp in module.imports() {
        let wasi = imp.module() == "wasi_snapshot_preview1" || imp.module() == "wasi_unstable";
        let Some(fty) = imp.ty().func().cloned() else {
            continue;
        };
        if !wasi || DEFINED.contains(&imp.name()) {
            continue;
        }
        let (m, n) = (imp.module().to_string(), imp.name().to_string());
        l.func_new(&m, &n, fty, |_c: C, _args: &[Val], results: &mut [Val]| {
            if let Some(r) = results.first_mut() {
                *r = Val::I32(ERRNO_NOSYS);
            }
            Ok(())
        })?;
    }
    Ok(())
}

fn monotonic_ns() -> u64 {
    use std::sync::OnceLock;
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
        + 1
}
