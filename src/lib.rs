//! ai-load-balancer's wasm glue: the Proxy-Wasm exports (`exports`), the context registry
//! (`contexts`), the response-body watch (`body_watch`) and the wasm global it reads
//! (`wasm_global`), the raw host imports (`ffi`), the `Host` built on them (`wasm_host`) and
//! the allocator (`size_classes`). Every decision is made in the `ailb-core` crate, which
//! knows nothing of the ABI.

#[cfg(any(target_arch = "wasm32", test))]
mod body_watch;
#[cfg(any(target_arch = "wasm32", test))]
mod contexts;
#[cfg(target_arch = "wasm32")]
mod exports;
#[cfg(target_arch = "wasm32")]
mod ffi;
#[cfg(any(target_arch = "wasm32", test))]
mod size_classes;
#[cfg(any(target_arch = "wasm32", test))]
mod wasm_global;
#[cfg(target_arch = "wasm32")]
mod wasm_host;

/// Small blocks from free lists, the rest from wasi-libc's malloc (size_classes.rs says why).
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: size_classes::SizeClasses<std::alloc::System> =
    size_classes::SizeClasses::new(std::alloc::System);
