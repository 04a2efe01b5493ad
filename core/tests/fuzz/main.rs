//! Property-based fuzzing on stable Rust. cargo-fuzz needs a nightly toolchain this build cannot
//! fetch, so each target here mutates a seed corpus taken from the repository's fixtures with
//! the crate's deterministic SplitMix64 and checks properties of the result: never a panic, and
//! the cheap invariants each module promises (see each target's doc).
//!
//! Budget: each target runs `FUZZ_SECONDS` seconds (2 when unset: `make test`; `make fuzz`
//! runs them long), from `FUZZ_SEED` (a fixed default, so a run is repeatable). A failing case
//! is saved to `target/fuzz-crashes/<target>-<seed>.bin`; `FUZZ_REPLAY=<that file> cargo test
//! -p ailb-core --test fuzz <target>` runs it alone. A crash found here becomes a named unit
//! test next to the code it hit (docs/test-bed.md "Fuzzing").
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod gen;
mod t_config;
mod t_hosts;
mod t_prefix;
mod t_prom;
mod t_resp;
