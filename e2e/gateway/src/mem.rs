//! Guest memory access for host calls; errors are the ABI status to return.

use crate::abi;
use crate::host_state::HostState;

/// Copy guest memory `[ptr, ptr+len)`.
pub fn read_mem(
    caller: &mut wasmtime::Caller<'_, HostState>,
    ptr: i32,
    len: i32,
) -> Result<Vec<u8>, i32> {
    let mem = caller
        .data()
        .memory
        .ok_or(abi::status::INVALID_MEMORY_ACCESS)?;
    let (p, l) = (ptr as u32 as usize, len as u32 as usize);
    mem.data(&*caller)
        .get(p..p.checked_add(l).ok_or(abi::status::INVALID_MEMORY_ACCESS)?)
        .map(|s| s.to_vec())
        .ok_or(abi::status::INVALID_MEMORY_ACCESS)
}

pub fn write_mem(
    caller: &mut wasmtime::Caller<'_, HostState>,
    ptr: i32,
    data: &[u8],
) -> Result<(), i32> {
    let mem = caller
        .data()
        .memory
        .ok_or(abi::status::INVALID_MEMORY_ACCESS)?;
    mem.write(&mut *caller, ptr as u32 as usize, data)
        .map_err(|_| abi::status::INVALID_MEMORY_ACCESS)
}

pub fn write_u32(
    caller: &mut wasmtime::Caller<'_, HostState>,
    ptr: i32,
    v: u32,
) -> Result<(), i32> {
    write_mem(caller, ptr, &v.to_le_bytes())
}

/// Allocate `data` in guest memory (guest `malloc`, else `proxy_on_memory_allocate`) and
/// write pointer and size to the out-pointers. Empty data gives pointer 0, size 0, like
/// cpp-host `copyToPointerSize`.
pub fn return_bytes(
    caller: &mut wasmtime::Caller<'_, HostState>,
    data: &[u8],
    ptr_ptr: i32,
    size_ptr: i32,
) -> i32 {
    let mut addr = 0u32;
    if !data.is_empty() {
        let Some(alloc) = caller.data().alloc.clone() else {
            return abi::status::INVALID_MEMORY_ACCESS;
        };
        match alloc.call(&mut *caller, data.len() as i32) {
            Ok(p) if p != 0 => addr = p as u32,
            _ => return abi::status::INVALID_MEMORY_ACCESS,
        }
        if let Err(s) = write_mem(caller, addr as i32, data) {
            return s;
        }
    }
    match write_u32(caller, ptr_ptr, addr)
        .and_then(|_| write_u32(caller, size_ptr, data.len() as u32))
    {
        Ok(()) => abi::status::OK,
        Err(s) => s,
    }
}
