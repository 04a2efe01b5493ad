//! Compiled plugin modules kept on disk beside the emulator's binary (`module-cache/`), so the
//! hundreds of gateway processes a test run starts compile each distinct `.wasm` once: a
//! compile costs a gateway about 1.4 s of CPU (cranelift, one thread), a cached load a few ms.
//! Keyed by the module's bytes and the engine's compatibility hash; wasmtime itself refuses a
//! file compiled by another version or configuration, and a refused or unreadable file is
//! compiled again. Off under the bench's instruments (their engine settings and code maps
//! want a fresh compile).

use anyhow::{Context as _, Result};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use wasmtime::{Engine, Module};

/// `wasm` compiled for `engine`, from the cache when it holds it.
pub fn module(engine: &Engine, wasm: &[u8], cacheable: bool) -> Result<Module> {
    let Some(path) = cacheable.then(|| path_for(engine, wasm)).flatten() else {
        return compile(engine, wasm);
    };
    if path.exists() {
        // SAFETY: the file is one this emulator wrote from a module it compiled itself
        // (`Module::serialize` below, into a directory of its own build); wasmtime checks
        // its version and configuration before use, and any error falls back to compiling.
        if let Ok(m) = unsafe { Module::deserialize_file(engine, &path) } {
            return Ok(m);
        }
    }
    let module = compile(engine, wasm)?;
    if let Ok(bytes) = module.serialize() {
        // Write then rename: a gateway starting meanwhile never reads half a file.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, &path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(module)
}

fn compile(engine: &Engine, wasm: &[u8]) -> Result<Module> {
    Module::new(engine, wasm)
        .map_err(anyhow::Error::from)
        .context("compiling plugin wasm")
}

/// `<binary's dir>/module-cache/<hash>.cwasm` (None when the directory cannot be made).
fn path_for(engine: &Engine, wasm: &[u8]) -> Option<PathBuf> {
    let dir = std::env::current_exe().ok()?.parent()?.join("module-cache");
    std::fs::create_dir_all(&dir).ok()?;
    let mut h = DefaultHasher::new();
    wasm.hash(&mut h);
    engine.precompile_compatibility_hash().hash(&mut h);
    Some(dir.join(format!("{:016x}.cwasm", h.finish())))
}
