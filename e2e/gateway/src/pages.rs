//! Bench instrument: which 4 KiB pages of a range this process touched, from the kernel's
//! accessed bits (proc(5): `/proc/self/clear_refs`, `/proc/self/smaps` `Referenced`). Used by
//! `ailb-footprint --pages` for the VM's linear memory, where the host's own reads and writes
//! of the plugin's buffers count too (docs/plugin-cpu.md "Data pages"). Linux only.

use anyhow::{ensure, Context, Result};
use std::ops::Range;

pub const PAGE: usize = 4096;

/// Clears the accessed bit of every page of this process and flushes `range`'s TLB entries:
/// the kernel clears the bits without a flush, and a page reached through an entry still
/// cached is not marked again. Taking write access away and giving it back flushes the
/// range. `range` must be page-aligned, writable memory nothing else runs in meanwhile.
pub fn forget(range: &Range<usize>) -> Result<()> {
    std::fs::write("/proc/self/clear_refs", "1").context("writing /proc/self/clear_refs")?;
    for prot in [libc::PROT_READ, libc::PROT_READ | libc::PROT_WRITE] {
        // SAFETY: the caller's range (the VM's own linear memory), whose access is restored
        // before anything runs in it again.
        let rc = unsafe { libc::mprotect(range.start as *mut libc::c_void, range.len(), prot) };
        ensure!(rc == 0, "mprotect: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Gives every other page of `range` a VMA flag of its own (MADV_NOHUGEPAGE, which changes
/// nothing else where THP is `madvise` or `never`), so that each page is its own mapping
/// and [`touched`] can tell pages apart. `range` must be page-aligned.
pub fn split(range: &Range<usize>) -> Result<()> {
    for p in (range.start..range.end).step_by(2 * PAGE) {
        // SAFETY: advice on pages of the caller's mapping; it changes no contents.
        let rc = unsafe { libc::madvise(p as *mut libc::c_void, PAGE, libc::MADV_NOHUGEPAGE) };
        ensure!(rc == 0, "madvise: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// The pages of `range` accessed since [`forget`], as offsets from its start, by mapping:
/// each page once [`split`] made it a mapping of its own, else the first pages of each
/// mapping as many as it counts.
pub fn touched(range: &Range<usize>) -> Result<Vec<usize>> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").context("reading smaps")?;
    Ok(parse_smaps(&smaps, range))
}

fn parse_smaps(smaps: &str, range: &Range<usize>) -> Vec<usize> {
    let mut pages = Vec::new();
    let mut at = None;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                at = (a < range.end && range.start < b).then_some(a.max(range.start));
                continue;
            }
        }
        let (Some(a), Some(v)) = (at, line.strip_prefix("Referenced:")) else {
            continue;
        };
        let kb: usize = v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
        pages.extend((0..kb * 1024 / PAGE).map(|k| a - range.start + k * PAGE));
    }
    pages
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaps_mappings_inside_the_range_count_their_referenced_pages() {
        let smaps = "\
7f0000000000-7f0000002000 rw-p 00000000 00:00 0
Size:                  8 kB
Referenced:            8 kB
7f0000010000-7f0000011000 rw-p 00000000 00:00 0
Referenced:            4 kB
7f0000011000-7f0000012000 rw-p 00000000 00:00 0
Referenced:            0 kB
7f0000020000-7f0000021000 r-xp 00000000 00:00 0
Referenced:            4 kB
";
        let range = 0x7f0000010000..0x7f0000020000;
        assert_eq!(parse_smaps(smaps, &range), vec![0]);
        let all = 0x7f0000000000..0x7f0000030000;
        assert_eq!(parse_smaps(smaps, &all), vec![0, 0x1000, 0x10000, 0x20000]);
    }

    /// The kernel marks what this process touches: a fresh mapping, split per page, a few
    /// of its pages touched after `forget`.
    #[test]
    fn touched_pages_are_the_ones_written() {
        let len = 16 * PAGE;
        // SAFETY: a private anonymous mapping of our own, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let range = p as usize..p as usize + len;
        let bytes = p as *mut u8;
        for k in 0..16 {
            // SAFETY: inside the mapping.
            unsafe { bytes.add(k * PAGE).write_volatile(1) };
        }
        split(&range).unwrap();
        forget(&range).unwrap();
        for k in [1, 2, 9] {
            // SAFETY: inside the mapping.
            unsafe { bytes.add(k * PAGE + 100).write_volatile(2) };
        }
        let touched = touched(&range).unwrap();
        // SAFETY: our mapping, no longer used.
        unsafe { libc::munmap(p, len) };
        // A kernel thread sampling accessed bits (DAMON) may clear one meanwhile: never more.
        assert!(
            touched
                .iter()
                .all(|t| [PAGE, 2 * PAGE, 9 * PAGE].contains(t)),
            "{touched:x?}"
        );
        assert!(!touched.is_empty(), "{touched:x?}");
    }
}
