//! The fuzz driver and the generic mutators: a deterministic generator (the crate's
//! SplitMix64), byte-level mutations in the manner of libFuzzer's, JSON tree mutations, and the
//! budget/replay/crash-file plumbing every target shares.

use ailb_core::hash::SplitMix64;
use serde_json::{Map, Number, Value};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Deterministic random source.
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(SplitMix64(seed))
    }

    pub fn u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.u64() % n as u64) as usize
        }
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.u64() % den < num
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// A length skewed towards small values (most bugs need little input).
    pub fn len(&mut self, max: usize) -> usize {
        let bits = self.below(usize::BITS as usize - max.leading_zeros() as usize + 1);
        self.below((1usize << bits).min(max) + 1)
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u64() as u8).collect()
    }
}

/// Integers and floats that sit on edges parsers get wrong.
pub const INTERESTING_NUMBERS: &[&str] = &[
    "0",
    "-0",
    "1",
    "-1",
    "7",
    "127",
    "128",
    "255",
    "256",
    "65535",
    "65536",
    "2147483647",
    "2147483648",
    "-2147483649",
    "4294967295",
    "4294967296",
    "9007199254740993",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "1e308",
    "1e309",
    "-1e309",
    "4.9e-324",
    "1.7976931348623157e308",
    "0.5",
    "1.0000001",
    "1e-7",
    "NaN",
    "+Inf",
    "-Inf",
    "inf",
    "0x10",
    "1_000",
    " 12 ",
    "",
];

/// Stacks 1-8 byte-level mutations on `base`: bit flips, random bytes, dictionary tokens,
/// interesting numbers, deletions, duplications, splices from another seed, truncation.
pub fn mutate_bytes(
    rng: &mut Rng,
    base: &[u8],
    others: &[Vec<u8>],
    dict: &[&[u8]],
    max_len: usize,
) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..=rng.below(8) {
        let at = rng.below(v.len() + 1);
        match rng.below(11) {
            0 => {
                if let Some(b) = v.get_mut(at) {
                    *b ^= 1 << rng.below(8);
                }
            }
            1 => {
                if let Some(b) = v.get_mut(at) {
                    *b = rng.u64() as u8;
                }
            }
            2 => {
                let n = rng.len(16);
                let junk = rng.bytes(n);
                v.splice(at..at, junk);
            }
            3 if !dict.is_empty() => {
                let tok = rng.pick(dict).to_vec();
                v.splice(at..at, tok);
            }
            4 => {
                let end = (at + rng.len(64)).min(v.len());
                v.drain(at..end);
            }
            5 => {
                // Duplicate a chunk, sometimes many times (limits, repeated families).
                let end = (at + rng.len(256)).min(v.len());
                let chunk = v[at..end].to_vec();
                let times = if rng.chance(1, 8) { rng.len(64) } else { 1 };
                for _ in 0..times {
                    let to = rng.below(v.len() + 1);
                    v.splice(to..to, chunk.iter().copied());
                }
            }
            6 if !others.is_empty() => {
                let other = rng.pick(others);
                let from = rng.below(other.len() + 1);
                let end = (from + rng.len(512)).min(other.len());
                v.splice(at..at, other[from..end].iter().copied());
            }
            7 => v.truncate(at),
            8 => {
                // Replace a run of digits with an interesting number.
                let start = (at..v.len()).find(|&i| v[i].is_ascii_digit());
                if let Some(s) = start {
                    let e = (s..v.len())
                        .find(|&i| !v[i].is_ascii_digit())
                        .unwrap_or(v.len());
                    let n = rng.pick(INTERESTING_NUMBERS).as_bytes().to_vec();
                    v.splice(s..e, n);
                }
            }
            9 => {
                // Swap two bytes.
                if !v.is_empty() {
                    let j = rng.below(v.len());
                    let i = at.min(v.len() - 1);
                    v.swap(i, j);
                }
            }
            _ => {
                let b = *rng.pick(b"\"\\{}[],:\n\r\t 0\x00\xff-+.");
                v.insert(at.min(v.len()), b);
            }
        }
        if v.len() > max_len {
            v.truncate(max_len);
        }
    }
    v
}

/// A random JSON scalar, biased towards values config readers and canonicalisers trip on.
pub fn random_scalar(rng: &mut Rng, strings: &[&str]) -> Value {
    match rng.below(9) {
        0 => Value::Null,
        1 => Value::Bool(rng.chance(1, 2)),
        2 => {
            let s = rng.pick(INTERESTING_NUMBERS);
            serde_json::from_str::<Number>(s.trim())
                .map(Value::Number)
                .unwrap_or_else(|_| Value::String(s.to_string()))
        }
        3 => Value::String(rng.pick(INTERESTING_NUMBERS).to_string()),
        4 if !strings.is_empty() => Value::String(rng.pick(strings).to_string()),
        5 => Value::Number(Number::from(rng.u64() as i64 >> rng.below(64))),
        6 => {
            let s: String = (0..rng.len(24))
                .map(|_| {
                    *rng.pick(&[
                        'a', 'Z', '0', ' ', '"', '\\', '\n', '\u{0}', 'é', '✓', '😀', '\u{ffff}',
                    ])
                })
                .collect();
            Value::String(s)
        }
        7 => Value::String("x".repeat(rng.len(70_000))),
        _ => serde_json::from_str::<Number>(&format!("{}.{}", rng.u64() % 1000, rng.u64() % 1000))
            .map(Value::Number)
            .unwrap_or(Value::Null),
    }
}

fn random_value(rng: &mut Rng, keys: &[&str], strings: &[&str], depth: usize) -> Value {
    if depth == 0 || rng.chance(2, 3) {
        return random_scalar(rng, strings);
    }
    if rng.chance(1, 2) {
        Value::Array(
            (0..rng.len(4))
                .map(|_| random_value(rng, keys, strings, depth - 1))
                .collect(),
        )
    } else {
        let mut m = Map::new();
        for _ in 0..rng.len(4) {
            m.insert(
                rng.pick(keys).to_string(),
                random_value(rng, keys, strings, depth - 1),
            );
        }
        Value::Object(m)
    }
}

/// Number of nodes in a JSON tree.
fn count(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(count).sum(),
        Value::Object(m) => m.values().map(count).sum(),
        _ => 0,
    }
}

/// The `n`th node in pre-order.
fn nth(v: &mut Value, n: usize) -> Option<&mut Value> {
    fn walk<'a>(v: &'a mut Value, n: &mut usize) -> Option<&'a mut Value> {
        if *n == 0 {
            return Some(v);
        }
        *n -= 1;
        match v {
            Value::Array(a) => a.iter_mut().find_map(|c| walk(c, n)),
            Value::Object(m) => m.values_mut().find_map(|c| walk(c, n)),
            _ => None,
        }
    }
    let mut n = n;
    walk(v, &mut n)
}

/// Stacks 1-4 tree mutations: replace a node by a random value, drop or add a member, duplicate
/// or wrap a node, turn an object into an array, nest deeply.
pub fn mutate_value(rng: &mut Rng, v: &mut Value, keys: &[&str], strings: &[&str]) {
    for _ in 0..=rng.below(4) {
        let n = rng.below(count(v));
        let Some(node) = nth(v, n) else { continue };
        match rng.below(8) {
            0 | 1 => *node = random_value(rng, keys, strings, 2),
            2 => match node {
                Value::Object(m) if !m.is_empty() => {
                    let k = m
                        .keys()
                        .nth(rng.below(m.len()))
                        .cloned()
                        .unwrap_or_default();
                    m.remove(&k);
                }
                Value::Array(a) if !a.is_empty() => {
                    let i = rng.below(a.len());
                    a.remove(i);
                }
                _ => *node = Value::Null,
            },
            3 => match node {
                Value::Object(m) => {
                    m.insert(
                        rng.pick(keys).to_string(),
                        random_value(rng, keys, strings, 2),
                    );
                }
                Value::Array(a) => {
                    let dup = a.get(rng.below(a.len())).cloned().unwrap_or(Value::Null);
                    for _ in 0..=rng.len(8) {
                        a.push(dup.clone());
                    }
                }
                other => *other = Value::Array(vec![other.clone()]),
            },
            4 => {
                if let Value::Object(m) = node {
                    *node = Value::Array(m.values().cloned().collect());
                }
            }
            5 => {
                // Rename a key (misspellings, case, the dictionary's other keys).
                if let Value::Object(m) = node {
                    if let Some(k) = m.keys().nth(rng.below(m.len().max(1))).cloned() {
                        let val = m.remove(&k).unwrap_or(Value::Null);
                        let new = match rng.below(3) {
                            0 => k.to_uppercase(),
                            1 => format!("{k}_"),
                            _ => rng.pick(keys).to_string(),
                        };
                        m.insert(new, val);
                    }
                }
            }
            6 => {
                let depth = if rng.chance(1, 4) { 130 } else { rng.len(20) };
                for _ in 0..depth {
                    let inner = std::mem::take(node);
                    *node = if rng.chance(1, 2) {
                        Value::Array(vec![inner])
                    } else {
                        let mut m = Map::new();
                        m.insert(rng.pick(keys).to_string(), inner);
                        Value::Object(m)
                    };
                }
            }
            _ => *node = random_scalar(rng, strings),
        }
    }
}

/// Serialises a JSON tree with its object keys in reverse order and some whitespace, so a
/// reader's result can be checked to depend on neither.
pub fn to_reordered_json(v: &Value, out: &mut String) {
    match v {
        Value::Array(a) => {
            out.push_str("[ ");
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(" ,\n");
                }
                to_reordered_json(x, out);
            }
            out.push_str(" ]");
        }
        Value::Object(m) => {
            out.push_str("{\t");
            for (i, (k, x)) in m.iter().rev().enumerate() {
                if i > 0 {
                    out.push_str(",\r\n ");
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(" : ");
                to_reordered_json(x, out);
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Seconds each target runs: `FUZZ_SECONDS` (`make fuzz`), else 2 (`make test`).
fn budget() -> Duration {
    let secs = std::env::var("FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(2.0);
    Duration::from_secs_f64(secs)
}

fn crash_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize()
        .unwrap_or(root)
        .join("target/fuzz-crashes")
}

/// Runs a target: with `FUZZ_REPLAY=<file>` naming a file of this target, that input only;
/// else cases from `generate` until the budget is spent (at least `min_cases`). A failing case
/// is saved under `target/fuzz-crashes/` and the failure names the file and how to replay it.
/// Returns the number of cases run.
pub fn drive(
    target: &str,
    min_cases: u64,
    mut generate: impl FnMut(&mut Rng) -> Vec<u8>,
    mut check: impl FnMut(&[u8]),
) -> u64 {
    if let Ok(path) = std::env::var("FUZZ_REPLAY") {
        let name = Path::new(&path)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.starts_with(&format!("{target}-")) {
            // cargo runs tests in `core/`: a relative path is taken from the workspace root.
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let file = [Path::new(&path).to_path_buf(), root.join(&path)]
                .into_iter()
                .find(|p| p.exists())
                .unwrap_or_else(|| panic!("FUZZ_REPLAY: {path} not found"));
            check(&std::fs::read(file).unwrap());
            return 1;
        }
        return 0;
    }
    let base: u64 = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x00A1_1B00);
    let salt = ailb_core::hash::fnv1a(ailb_core::hash::FNV_OFFSET, target.as_bytes());
    let deadline = Instant::now() + budget();
    let mut cases = 0u64;
    while cases < min_cases || Instant::now() < deadline {
        let seed = base ^ salt ^ cases.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let input = generate(&mut Rng::new(seed));
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| check(&input))) {
            let dir = crash_dir();
            let _ = std::fs::create_dir_all(&dir);
            let file = dir.join(format!("{target}-{seed:016x}.bin"));
            let _ = std::fs::write(&file, &input);
            eprintln!(
                "fuzz {target}: case {cases} failed; input ({} bytes) saved to {}\n  replay: \
                 FUZZ_REPLAY={} cargo test -p ailb-core --test fuzz {target}",
                input.len(),
                file.display(),
                file.display()
            );
            resume_unwind(panic);
        }
        cases += 1;
    }
    eprintln!("fuzz {target}: {cases} cases");
    cases
}
