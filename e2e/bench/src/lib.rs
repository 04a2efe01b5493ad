//! The benchmarks' own pieces, apart from the test harness they build on (`ailb_e2e`): the
//! trace replay ([`trace`], docs/trace-bench.md), the third-party Go plugin ([`thirdparty`])
//! and the empty modules ([`empty_plugin`]) the plugin's CPU is read against, and the
//! emulator's profiling switches ([`instruments`], run by `ailb-bench-gateway`).

pub mod empty_plugin;
pub mod instruments;
pub mod thirdparty;
pub mod trace;
