//! The plugin code one request touches, counted exactly: `ailb-footprint` drives N requests
//! through a VM under `valgrind --tool=callgrind --dump-instr=yes`, wasmtime names its compiled
//! functions in a perf map (`AILB_PERFMAP`), and an instruction belongs to every request when
//! a run of 2N requests executes it at least N times more than a run of N (startup and
//! one-time paths cancel out). What is counted is the distinct 64-byte lines of compiled
//! plugin code holding such instructions: what a worker idle between requests reloads from
//! memory at every request, the cost the streamed bench runs measure in µs
//! (docs/plugin-cpu.md). Instruction counts are repeatable run to run; timings on this
//! machine are not.

use anyhow::{bail, Context, Result};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Command;

/// Requests in the shorter run; the longer runs twice as many.
pub const REQUESTS: usize = 150;

/// One module's per-request footprint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footprint {
    /// Distinct 64-byte lines of compiled plugin code.
    pub lines: usize,
    /// Distinct 4 KiB pages of compiled code those lines are on (the engine's trampolines
    /// included): each one a page walk for a worker whose TLB forgot it (docs/plugin-cpu.md
    /// "Code pages").
    pub pages: usize,
    /// Instructions of compiled plugin code.
    pub instructions: u64,
    /// Lines per compiled function (perf-map name), most first.
    pub by_function: Vec<(String, usize)>,
}

/// Counts the footprint of the gateway config at `config` (its plugin, its first route).
pub fn measure(config: &Path, scratch: &Path) -> Result<Footprint> {
    let short = run(config, scratch, REQUESTS)?;
    let long = run(config, scratch, 2 * REQUESTS)?;
    Ok(per_request(&short, &long, REQUESTS as u64))
}

/// Instruction counts of one run, keyed by (function, offset in it) so that two runs whose
/// code loaded at other addresses line up; with each function's start modulo 64, and its
/// address (for pages).
struct Run {
    counts: HashMap<(String, u64), u64>,
    line_base: HashMap<String, u64>,
    starts: HashMap<String, u64>,
}

fn run(config: &Path, scratch: &Path, requests: usize) -> Result<Run> {
    let out = scratch.join(format!("callgrind.{requests}.out"));
    let status = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg("--dump-instr=yes")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(crate::e2e_bin("ailb-footprint"))
        .arg(config)
        .arg(requests.to_string())
        .env("AILB_PERFMAP", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .context("running valgrind (apt-get install valgrind)")?;
    let log = String::from_utf8_lossy(&status.stderr);
    if !status.status.success() {
        bail!("ailb-footprint under callgrind failed: {log}");
    }
    // valgrind prefixes its lines with ==PID==; the perf map is named after that pid.
    let pid = log
        .lines()
        .find_map(|l| {
            l.strip_prefix("==")?
                .split("==")
                .next()?
                .parse::<u32>()
                .ok()
        })
        .context("no pid in valgrind's log")?;
    let map_path = std::env::temp_dir().join(format!("perf-{pid}.map"));
    let map = std::fs::read_to_string(&map_path)
        .with_context(|| format!("reading {}", map_path.display()))?;
    let _ = std::fs::remove_file(&map_path);
    let text = std::fs::read_to_string(&out)?;
    let _ = std::fs::remove_file(&out);
    Ok(attribute(&parse_perf_map(&map), &parse_callgrind(&text)))
}

/// `ADDR SIZE NAME` lines (hex), sorted by address.
fn parse_perf_map(text: &str) -> Vec<(u64, u64, String)> {
    let mut v: Vec<(u64, u64, String)> = text
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ' ');
            let addr = u64::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
            let size = u64::from_str_radix(parts.next()?, 16).ok()?;
            Some((addr, size, parts.next()?.trim().to_string()))
        })
        .collect();
    v.sort();
    v
}

/// Instructions executed per address, from a `--dump-instr=yes` callgrind output: cost lines
/// are `ADDR LINE COUNT` with the address absolute (`0x…`), relative (`+N`/`-N`) or the same
/// (`*`); the cost line after a `calls=` line is the call's inclusive cost, not the address's.
fn parse_callgrind(text: &str) -> HashMap<u64, u64> {
    let mut counts: HashMap<u64, u64> = HashMap::new();
    let (mut addr, mut after_call) = (0u64, false);
    for line in text.lines() {
        if line.starts_with("calls=") {
            after_call = true;
            continue;
        }
        let Some(first) = line.split_whitespace().next() else {
            continue;
        };
        let moved = if let Some(hex) = first.strip_prefix("0x") {
            u64::from_str_radix(hex, 16).ok()
        } else if let Some(n) = first.strip_prefix('+') {
            n.parse::<u64>().ok().map(|n| addr.wrapping_add(n))
        } else if let Some(n) = first.strip_prefix('-') {
            n.parse::<u64>().ok().map(|n| addr.wrapping_sub(n))
        } else if first == "*" {
            Some(addr)
        } else {
            None
        };
        let Some(at) = moved else { continue };
        addr = at;
        if std::mem::take(&mut after_call) {
            continue;
        }
        if let Some(count) = line
            .split_whitespace()
            .nth(2)
            .and_then(|c| c.parse::<u64>().ok())
        {
            *counts.entry(at).or_default() += count;
        }
    }
    counts
}

fn attribute(map: &[(u64, u64, String)], counts: &HashMap<u64, u64>) -> Run {
    let mut run = Run {
        counts: HashMap::new(),
        line_base: HashMap::new(),
        starts: HashMap::new(),
    };
    for (&addr, &count) in counts {
        let i = map.partition_point(|(start, _, _)| *start <= addr);
        let Some((start, size, name)) = i.checked_sub(1).and_then(|i| map.get(i)) else {
            continue;
        };
        if addr >= start + size {
            continue;
        }
        *run.counts.entry((name.clone(), addr - start)).or_default() += count;
        run.line_base.insert(name.clone(), start % 64);
        run.starts.insert(name.clone(), *start);
    }
    run
}

fn per_request(short: &Run, long: &Run, requests: u64) -> Footprint {
    let mut lines: HashMap<&str, HashSet<u64>> = HashMap::new();
    let mut instructions = 0;
    let mut pages: HashSet<u64> = HashSet::new();
    for ((name, offset), &count) in &long.counts {
        let extra = count.saturating_sub(
            short
                .counts
                .get(&(name.clone(), *offset))
                .copied()
                .unwrap_or(0),
        );
        if extra < requests {
            continue;
        }
        instructions += extra;
        let base = long.line_base.get(name).copied().unwrap_or(0);
        lines.entry(name).or_default().insert((offset + base) / 64);
        if let Some(start) = long.starts.get(name) {
            pages.insert((start + offset) / 4096);
        }
    }
    let mut by_function: Vec<(String, usize)> = lines
        .iter()
        .map(|(name, l)| (name.to_string(), l.len()))
        .collect();
    by_function.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Footprint {
        lines: by_function.iter().map(|(_, n)| n).sum(),
        pages: pages.len(),
        instructions: instructions / requests,
        by_function,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(map: &str, callgrind: &str) -> Run {
        attribute(&parse_perf_map(map), &parse_callgrind(callgrind))
    }

    #[test]
    fn counts_the_lines_that_every_request_runs() {
        // f: 0x1000.. (128 bytes), g: 0x2020.. (64 bytes, starting mid-line).
        let map = "0x1000 80 f\n0x2020 40 g\n";
        // Short run (2 requests): f+0 once per request plus 5 at startup, f+0x40 at startup
        // only, g+0 and g+0x30 (the next line) once per request. A call's cost line is not
        // the address's own. Long run: 4 requests.
        let short = "fn=(1)\n0x1000 1 7\n+64 1 5\ncalls=1 0x2020\n* 1 900\n0x2020 1 2\n+48 1 2\n";
        let long = "fn=(1)\n0x1000 1 9\n+64 1 5\ncalls=1 0x2020\n* 1 900\n0x2020 1 4\n+48 1 4\n";
        let fp = per_request(&run_of(map, short), &run_of(map, long), 2);
        assert_eq!(fp.lines, 3, "{fp:?}");
        assert_eq!(
            fp.by_function,
            vec![("g".to_string(), 2), ("f".to_string(), 1)]
        );
        assert_eq!(fp.instructions, (2 + 2 + 2) / 2);
        assert_eq!(fp.pages, 2, "f on page 1, g's two lines on page 2");
    }

    #[test]
    fn addresses_outside_the_map_are_not_plugin_code() {
        let map = "0x1000 10 f\n";
        let r = run_of(map, "0x0fff 1 50\n0x1010 1 50\n0x1008 1 50\n");
        assert_eq!(r.counts.len(), 1);
        assert_eq!(r.counts.get(&("f".to_string(), 8)), Some(&50));
    }
}
