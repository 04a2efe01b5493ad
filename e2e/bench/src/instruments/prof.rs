//! Where the VM time goes (`AILB_PROF`): call counts and wall ns per plugin export and per host
//! call, shown by `/stats` as `prof.<name>.calls` / `prof.<name>.ns` (export times include the
//! host calls made inside them). Off unless asked for, so the VM-time benchmarks measure the
//! emulator without it. One process-wide map behind a mutex.

use std::collections::BTreeMap;
use std::sync::Mutex;

static PROF: Mutex<BTreeMap<&'static str, (u64, u64)>> = Mutex::new(BTreeMap::new());

pub fn record(name: &'static str, ns: u64) {
    let mut m = PROF.lock().unwrap_or_else(|e| e.into_inner());
    let e = m.entry(name).or_insert((0, 0));
    e.0 += 1;
    e.1 += ns;
}

/// `prof.<name>.calls N` and `prof.<name>.ns N` lines, by name.
pub fn lines() -> String {
    let m = PROF.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = String::new();
    for (name, (calls, ns)) in m.iter() {
        out.push_str(&format!("prof.{name}.calls {calls}\nprof.{name}.ns {ns}\n"));
    }
    out
}
