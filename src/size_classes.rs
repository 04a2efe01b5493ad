//! The plugin's global allocator on wasm: small blocks from per-size free lists, everything
//! else from the system allocator (wasi-libc's dlmalloc).
//!
//! Why: an idle worker runs each callback with cold caches, so a request costs what code
//! and data it touches (docs/plugin-cpu.md, `ailb-bench footprint`). A cluster request makes
//! a handful of small allocations (the host's buffers for shared data and a header, a
//! service name, a candidate list), and dlmalloc's general paths for them were ~50 distinct
//! 64-byte lines of compiled code per request, plus its bin and boundary-tag data. A free
//! list per power-of-two class is a few lines: pop on alloc, push on free.
//!
//! Blocks of class `s` (16 B to [`MAX_CLASS`]) are carved from slabs of [`SLAB`] bytes,
//! aligned to [`MAX_CLASS`]. Every class carves from the one current slab, each block at its
//! size's alignment, so any layout with `align <= size` fits its class; the bytes skipped to
//! reach that alignment, and a slab's tail too small for the next block, go to the smaller
//! classes' free lists. One slab for all classes, not one per class, because a request's
//! blocks of different sizes then share a page or two instead of one page each: for a worker
//! idle between requests every page is a page walk (docs/plugin-cpu.md "Data pages": an
//! AdaptiveScore request's pages of linear memory went from 12 to 8). Freed blocks keep
//! their class forever (a plugin's small allocations are bounded by its live requests); slabs
//! are never returned. A layout larger than [`MAX_CLASS`] or aligned beyond its size class
//! goes to the system allocator, as does everything freed in that class.
//!
//! Not thread-safe, and needs not be: a wasm VM is single-threaded. Native builds (tests)
//! use it only through an owned [`SizeClasses`], never as the global allocator.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::UnsafeCell;
use std::ptr::null_mut;

/// Classes 16, 32, …, 2048 bytes.
const MIN_SHIFT: u32 = 4;
const MAX_SHIFT: u32 = 11;
pub const MAX_CLASS: usize = 1 << MAX_SHIFT;
const CLASSES: usize = (MAX_SHIFT - MIN_SHIFT + 1) as usize;
/// Bytes per slab: 8 blocks of the largest class, 1024 of the smallest.
pub const SLAB: usize = 16 * 1024;

struct Lists {
    /// Each class's freed blocks; a free block holds the next one's address.
    free: [*mut u8; CLASSES],
    /// The current slab, shared by every class: next unused byte and bytes left.
    carve: (*mut u8, usize),
}

/// The allocator state, over `backing` (the system allocator on wasm).
pub struct SizeClasses<B: GlobalAlloc> {
    lists: UnsafeCell<Lists>,
    backing: B,
}

// SAFETY: only ever used from one thread (a wasm VM; a native test owns its instance).
unsafe impl<B: GlobalAlloc> Sync for SizeClasses<B> {}

impl<B: GlobalAlloc> SizeClasses<B> {
    pub const fn new(backing: B) -> Self {
        SizeClasses {
            lists: UnsafeCell::new(Lists {
                free: [null_mut(); CLASSES],
                carve: (null_mut(), 0),
            }),
            backing,
        }
    }
}

/// Hands the unused bytes `[at, at + len)` of a slab to the free lists, as the largest
/// blocks each address is aligned to: a carve that skips to a bigger block's alignment, or
/// leaves a slab, loses nothing.
///
/// # Safety
/// The range is unused slab memory; `at` is aligned to 16 and `len` a multiple of 16 (every
/// slab starts aligned to [`MAX_CLASS`] and every block is a multiple of 16 bytes).
unsafe fn recycle(lists: &mut Lists, mut at: *mut u8, mut len: usize) {
    while len >= 1 << MIN_SHIFT {
        let aligned = (at as usize).trailing_zeros().min(MAX_SHIFT);
        let fits = usize::BITS - 1 - len.leading_zeros();
        let shift = aligned.min(fits);
        let Some(head) = lists.free.get_mut((shift - MIN_SHIFT) as usize) else {
            return;
        };
        // SAFETY: an unused block of this class inside the range; it now holds the list's
        // next address.
        unsafe { at.cast::<*mut u8>().write(*head) };
        *head = at;
        // SAFETY: the block is inside the range, so one past it is inside or one past.
        at = unsafe { at.add(1 << shift) };
        len -= 1 << shift;
    }
}

/// The class of `layout`, or None for the system allocator.
fn class(layout: Layout) -> Option<usize> {
    let size = layout.size().max(layout.align());
    if size > MAX_CLASS {
        return None;
    }
    let shift = size
        .max(1 << MIN_SHIFT)
        .next_power_of_two()
        .trailing_zeros();
    Some((shift - MIN_SHIFT) as usize)
}

unsafe impl<B: GlobalAlloc> GlobalAlloc for SizeClasses<B> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(c) = class(layout) else {
            // SAFETY: the caller's contract, passed on.
            return unsafe { self.backing.alloc(layout) };
        };
        // SAFETY: single-threaded (see the type), and no reference into `lists` outlives this
        // call; the allocator never re-enters itself except through `backing`, which does not
        // touch `lists`.
        let lists = unsafe { &mut *self.lists.get() };
        let Some(head) = lists.free.get_mut(c) else {
            return null_mut();
        };
        if !head.is_null() {
            let block = *head;
            // SAFETY: a free block of this class, at least 16 bytes and aligned to its size,
            // holding the next free block's address (written by `dealloc`).
            *head = unsafe { block.cast::<*mut u8>().read() };
            return block;
        }
        let size = 1usize << (c as u32 + MIN_SHIFT);
        let (mut at, mut left) = lists.carve;
        let mut skip = (at as usize).wrapping_neg() & (size - 1);
        if left < skip + size {
            // SAFETY: a valid non-zero layout.
            let slab = unsafe {
                self.backing
                    .alloc(Layout::from_size_align_unchecked(SLAB, MAX_CLASS))
            };
            if slab.is_null() {
                return null_mut();
            }
            // SAFETY: the rest of the current slab, unused.
            unsafe { recycle(lists, at, left) };
            (at, left, skip) = (slab, SLAB, 0);
        }
        // SAFETY: the `skip` bytes up to the block's alignment, unused; `skip + size` bytes
        // are left in the slab, so the pointers stay inside it or one past.
        let block = unsafe {
            recycle(lists, at, skip);
            at.add(skip)
        };
        lists.carve = (unsafe { block.add(size) }, left - skip - size);
        block
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some(c) = class(layout) else {
            // SAFETY: allocated by `backing` with this layout (same class test as `alloc`).
            return unsafe { self.backing.dealloc(ptr, layout) };
        };
        // SAFETY: as in `alloc`.
        let lists = unsafe { &mut *self.lists.get() };
        if let Some(head) = lists.free.get_mut(c) {
            // SAFETY: `ptr` is a block of this class (at least 16 bytes, aligned to its size)
            // that the caller gives up; it now holds the list's next address.
            unsafe { ptr.cast::<*mut u8>().write(*head) };
            *head = ptr;
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.resize(ptr, layout, new_size) }
    }
}

impl<B: GlobalAlloc> SizeClasses<B> {
    /// The default `realloc` (alloc, copy, free) unless the block keeps its class (then it is
    /// the same block) or both sizes are the system allocator's (then it reallocates).
    ///
    /// # Safety
    /// `GlobalAlloc::realloc`'s contract.
    unsafe fn resize(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract makes this a valid layout.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (class(layout), class(new)) {
            (Some(a), Some(b)) if a == b => return ptr,
            // SAFETY: allocated by `backing` with `layout`.
            (None, None) => return unsafe { self.backing.realloc(ptr, layout, new_size) },
            _ => {}
        }
        // SAFETY: the caller's contract, passed on.
        let moved = unsafe { self.alloc(new) };
        if !moved.is_null() {
            // SAFETY: both blocks hold at least the smaller size and are distinct.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::System;

    #[test]
    fn realloc_keeps_the_bytes_and_the_block_within_a_class() {
        let a = SizeClasses::new(System);
        let l = Layout::from_size_align(20, 1).unwrap();
        unsafe {
            let p = a.alloc(l);
            std::ptr::copy_nonoverlapping(b"0123456789abcdefghij".as_ptr(), p, 20);
            assert_eq!(a.realloc(p, l, 32), p, "20 and 32 bytes share a class");
            let l32 = Layout::from_size_align(32, 1).unwrap();
            let q = a.realloc(p, l32, 5000);
            assert_ne!(q, p);
            assert_eq!(std::slice::from_raw_parts(q, 20), b"0123456789abcdefghij");
            let l5000 = Layout::from_size_align(5000, 1).unwrap();
            let r = a.realloc(q, l5000, 9000);
            assert_eq!(std::slice::from_raw_parts(r, 20), b"0123456789abcdefghij");
            let l9000 = Layout::from_size_align(9000, 1).unwrap();
            let s = a.realloc(r, l9000, 3);
            assert_eq!(std::slice::from_raw_parts(s, 3), b"012");
            a.dealloc(s, Layout::from_size_align(3, 1).unwrap());
        }
    }

    /// A request's small blocks of different sizes are neighbours, not one slab per size
    /// apart: every page they spread over is one more page walk for an idle worker.
    #[test]
    fn classes_carve_from_one_slab_and_alignment_gaps_are_handed_out() {
        let a = SizeClasses::new(System);
        let at = |size: usize| unsafe { a.alloc(Layout::from_size_align(size, 1).unwrap()) };
        let first = at(16);
        assert_eq!(first as usize % MAX_CLASS, 0, "a fresh slab");
        let big = at(2048);
        assert_eq!(big as usize - first as usize, 2048, "aligned to its size");
        // The 2032 bytes skipped went to the free lists, each at its own alignment.
        for (size, offset) in [(1024, 1024), (512, 512), (256, 256), (128, 128), (64, 64)] {
            assert_eq!(at(size) as usize - first as usize, offset, "{size} B");
        }
        for (size, offset) in [(32, 32), (16, 16)] {
            assert_eq!(at(size) as usize - first as usize, offset, "{size} B");
        }
        assert_eq!(
            at(16) as usize - first as usize,
            4096,
            "then on past the big block"
        );
        // The rest of a slab is not lost when a block no longer fits in it.
        let b = SizeClasses::new(System);
        let at_b = |size: usize| unsafe { b.alloc(Layout::from_size_align(size, 1).unwrap()) };
        let start = at_b(2048);
        for _ in 0..6 {
            at_b(2048);
        }
        let last16 = at_b(16);
        assert_eq!(last16 as usize - start as usize, 7 * 2048);
        let next_slab = at_b(2048);
        let old = start as usize..start as usize + SLAB;
        assert!(!old.contains(&(next_slab as usize)), "a new slab");
        let tail = at_b(1024);
        assert_eq!(
            tail as usize - start as usize,
            7 * 2048 + 1024,
            "the old slab's tail serves the next 1024 B"
        );
    }

    #[test]
    fn layouts_take_the_smallest_class_that_fits_size_and_alignment() {
        let l = |size, align| Layout::from_size_align(size, align).ok().and_then(class);
        assert_eq!(l(0, 1), Some(0));
        assert_eq!(l(1, 1), Some(0));
        assert_eq!(l(16, 8), Some(0));
        assert_eq!(l(17, 1), Some(1));
        assert_eq!(
            l(8, 64),
            Some(2),
            "alignment beyond the size picks a bigger class"
        );
        assert_eq!(l(2048, 8), Some(CLASSES - 1));
        assert_eq!(l(2049, 1), None);
        assert_eq!(l(16, 4096), None);
    }

    #[test]
    fn blocks_never_overlap_keep_their_bytes_and_are_reused() {
        let a = SizeClasses::new(System);
        let mut rng = ailb_core::hash::SplitMix64(3);
        // Live blocks: (pointer, layout, fill byte).
        let mut live: Vec<(*mut u8, Layout, u8)> = Vec::new();
        let mut reused = 0;
        let mut freed: Vec<usize> = Vec::new();
        for step in 0..20_000u32 {
            let r = rng.next_u64();
            if !r.is_multiple_of(3) || live.is_empty() {
                let size =
                    [0, 1, 7, 16, 24, 100, 300, 1000, 2048, 3000, 70_000][(r >> 8) as usize % 11];
                let align = [1, 8, 16, 64][(r >> 16) as usize % 4];
                let layout = Layout::from_size_align(size, align).unwrap();
                let p = unsafe { a.alloc(layout) };
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0, "aligned");
                if freed.contains(&(p as usize)) {
                    reused += 1;
                }
                let fill = step as u8;
                unsafe { std::ptr::write_bytes(p, fill, size) };
                live.push((p, layout, fill));
            } else {
                let i = (r >> 8) as usize % live.len();
                let (p, layout, fill) = live.swap_remove(i);
                let bytes = unsafe { std::slice::from_raw_parts(p, layout.size()) };
                assert!(
                    bytes.iter().all(|&b| b == fill),
                    "step {step}: a block was overwritten"
                );
                unsafe { a.dealloc(p, layout) };
                freed.push(p as usize);
            }
        }
        let mut spans: Vec<(usize, usize)> = live
            .iter()
            .map(|(p, l, _)| (*p as usize, *p as usize + l.size().max(1)))
            .collect();
        spans.sort();
        assert!(
            spans.windows(2).all(|w| w[0].1 <= w[1].0),
            "live blocks overlap"
        );
        assert!(
            reused > 1000,
            "freed blocks are handed out again ({reused})"
        );
        for (p, layout, fill) in live {
            let bytes = unsafe { std::slice::from_raw_parts(p, layout.size()) };
            assert!(bytes.iter().all(|&b| b == fill));
            unsafe { a.dealloc(p, layout) };
        }
    }
}
