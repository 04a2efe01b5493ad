//! `wasi-run MODULE.wasm [ARGS]...`: run a WASI preview1 command (`_start`) — e.g. the
//! plugin's unit tests built for wasm32-wasip1, via
//! `CARGO_TARGET_WASM32_WASIP1_RUNNER=/path/to/wasi-run`. Stdio and environment are
//! inherited, `.` and `/` are preopened, imports the host does not provide trap when called,
//! and the guest's exit code becomes ours.

use anyhow::{Context, Result};
use wasmtime::{Engine, Linker, Module, Store};
use wasmtime_wasi::p1::{self, WasiP1Ctx};
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

fn run() -> Result<i32> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: wasi-run MODULE.wasm [ARGS]...");
        return Ok(64);
    };
    let engine = Engine::default();
    let module = Module::from_file(&engine, path)
        .map_err(anyhow::Error::from)
        .with_context(|| format!("loading {path}"))?;
    let mut linker: Linker<WasiP1Ctx> = Linker::new(&engine);
    p1::add_to_linker_sync(&mut linker, |t| t)?;
    linker.define_unknown_imports_as_traps(&module)?;
    let mut b = WasiCtxBuilder::new();
    b.inherit_stdio().inherit_env().args(&args);
    b.preopened_dir(".", ".", FsPerms::ReadWrite)?;
    b.preopened_dir("/", "/", FsPerms::ReadWrite)?;
    let mut store = Store::new(&engine, b.build_p1());
    let instance = linker.instantiate(&mut store, &module)?;
    let start = instance.get_typed_func::<(), ()>(&mut store, "_start")?;
    match start.call(&mut store, ()) {
        Ok(()) => Ok(0),
        Err(e) => match e.downcast_ref::<I32Exit>() {
            Some(I32Exit(code)) => Ok(*code),
            None => {
                eprintln!("wasi-run: trap: {e:?}");
                Ok(101)
            }
        },
    }
}

fn main() {
    match run() {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("wasi-run: {e:#}");
            std::process::exit(1);
        }
    }
}
