//! The data one request touches, counted two ways by `ailb-footprint` (no valgrind):
//!
//! - **pages** (`--pages`): the 4 KiB pages of the VM's linear memory that a request touches,
//!   whoever touches them: the plugin, or the host reading and writing the plugin's buffers
//!   (a header name in read-only data, a value it writes into a buffer the plugin
//!   allocated). The kernel's accessed bits say which: `/proc/self/clear_refs` before the
//!   request, `/proc/self/smaps` `Referenced` after (proc(5)).
//! - **pages per entry** (`--pages` too): the same count taken around each VM entry of a
//!   request and summed, over all its entries and over its ten answer chunks alone. An idle
//!   worker meets each entry's pages anew, so what every chunk touches counts ten times here
//!   and once above (docs/plugin-cpu.md "Body chunks").
//! - **lines** (`--trace`): the 64-byte lines the module's own loads and stores touch, each
//!   with the functions that touched it, from the module rewritten by `wasm-abi
//!   trace-memory` (tools/wasm-abi/src/trace.rs). This is what names a page: the statics of
//!   the linker's map, the heap blocks by the code that uses them.
//!
//! Why: a worker idle between requests walks the page tables again for every page a request
//! touches, data as much as code (docs/plugin-cpu.md "Data pages"). Both counts repeat
//! exactly run to run.

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;

/// Requests before counting (the first requests allocate what later ones reuse), then
/// requests counted.
const REQUESTS: usize = 100;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataFootprint {
    /// Pages of linear memory every request touches (plugin and host).
    pub pages: usize,
    /// Pages of linear memory each VM entry touches, summed over a request's entries.
    pub entry_pages: usize,
    /// The same over the request's ten answer chunks alone.
    pub chunk_pages: usize,
    /// Each entry's pages in order, comma-separated, as the last request counted touched
    /// them (the driver's doc names the entries).
    pub each_entry: String,
    /// 64-byte lines of linear memory every request's own accesses touch.
    pub lines: usize,
    /// One line per touched data line: address, bytes touched, the functions touching it.
    pub detail: Vec<String>,
}

/// Counts the data footprint of the gateway config at `config` (its plugin, its first
/// route); `traced` is the same config with the plugin rewritten by `wasm-abi trace-memory`.
pub fn measure(config: &Path, traced: &Path, traced_wasm: &Path) -> Result<DataFootprint> {
    let out = driver(config, "--pages")?;
    let column = |prefix: &str, at: usize| {
        column(&out, prefix, at).with_context(|| format!("no {prefix}counts"))
    };
    let pages = column("pages ", 0)?;
    let entry_pages = column("entry_pages ", 0)?;
    let chunk_pages = column("entry_pages ", 1)?;
    let each_entry = out
        .lines()
        .filter_map(|l| l.strip_prefix("entry_pages "))
        .filter_map(|l| l.split_whitespace().nth(2))
        .next_back()
        .unwrap_or_default()
        .to_string();
    let trace = driver(traced, "--trace")?;
    let lines = trace
        .lines()
        .find_map(|l| l.strip_prefix("data lines per request "))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .context("no line count")?;
    let names = function_names(&std::fs::read(traced_wasm)?)?;
    let detail = trace
        .lines()
        .filter(|l| l.starts_with("line "))
        .map(|l| name_functions(l, &names))
        .collect();
    Ok(DataFootprint {
        pages,
        entry_pages,
        chunk_pages,
        each_entry,
        lines,
        detail,
    })
}

fn driver(config: &Path, mode: &str) -> Result<String> {
    let out = Command::new(crate::e2e_bin("ailb-footprint"))
        .arg(config)
        .arg(REQUESTS.to_string())
        .arg(mode)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running ailb-footprint")?;
    if !out.status.success() {
        bail!("ailb-footprint {mode} failed");
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The median of field `at` of the driver's lines that start with `prefix`.
fn column(out: &str, prefix: &str, at: usize) -> Option<usize> {
    let counts = out
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|l| l.split_whitespace().nth(at)?.parse().ok())
        .collect();
    median(counts)
}

fn median(mut v: Vec<usize>) -> Option<usize> {
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

/// Defined and imported functions' names from the module's name section, demangled.
fn function_names(wasm: &[u8]) -> Result<std::collections::HashMap<u32, String>> {
    use wasmparser::{KnownCustom, Name, Parser, Payload};
    let mut names = std::collections::HashMap::new();
    for payload in Parser::new(0).parse_all(wasm) {
        if let Payload::CustomSection(c) = payload? {
            if let KnownCustom::Name(reader) = c.as_known() {
                for sub in reader {
                    if let Name::Function(map) = sub? {
                        for n in map {
                            let n = n?;
                            names
                                .insert(n.index, format!("{:#}", rustc_demangle::demangle(n.name)));
                        }
                    }
                }
            }
        }
    }
    Ok(names)
}

/// A `line 0x… bytes N functions [i, j]` line of the driver with the functions named.
fn name_functions(line: &str, names: &std::collections::HashMap<u32, String>) -> String {
    let Some((head, list)) = line.split_once(" functions [") else {
        return line.to_string();
    };
    let named: Vec<&str> = list
        .trim_end_matches(']')
        .split(", ")
        .filter_map(|i| i.parse::<u32>().ok())
        .map(|i| names.get(&i).map_or("?", String::as_str))
        .collect();
    format!("{head}: {}", named.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_their_functions_and_the_median_is_taken() {
        let names = [(3, "a::f".to_string()), (9, "b::g".to_string())].into();
        assert_eq!(
            name_functions("line 0x119040 bytes 36 functions [3, 9, 4]", &names),
            "line 0x119040 bytes 36: a::f, b::g, ?"
        );
        assert_eq!(
            name_functions("line 0x1 bytes 2", &names),
            "line 0x1 bytes 2"
        );
        assert_eq!(median(vec![9, 8, 8]), Some(8));
        let out = "pages 5 11\nentry_pages 26 5\nentry_pages 27 5\nentry_pages 26 6\npages 6 11\n";
        assert_eq!(column(out, "pages ", 0), Some(6));
        assert_eq!(column(out, "entry_pages ", 0), Some(26));
        assert_eq!(column(out, "entry_pages ", 1), Some(5));
        assert_eq!(column(out, "entry_pages ", 2), None);
        assert_eq!(median(Vec::new()), None);
    }
}
