//! Test scaffolding shared by ailb-core's integration tests and benchmark drivers and by the
//! e2e crates (`e2e/` is a separate workspace and depends on this crate by path): one launcher
//! for a throwaway redis-server, one blocking RESP client built on the plugin's own codec
//! (`ailb_core::redis::resp`), so the tests read Redis the way the plugin does, and the reader
//! of the compatibility corpus's files and Go verdicts ([`corpus`]), and the temp files they
//! write ([`TempFile`], [`replace_file`]), and the polling wait they share ([`wait_until`]).
//!
//! Only tests, benchmarks and the e2e harness depend on this crate; nothing in the plugin does.
// Test scaffolding: a broken setup (no redis-server, a port that will not bind, a garbled
// reply) should stop the test loudly at the point it went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod client;
pub mod corpus;
pub mod dashboard;
mod files;
mod server;
mod wait;

pub use client::{command_stats, encode_value, try_cmd, Conn};
pub use files::{replace_file, TempFile};
pub use server::{free_port, Options, RedisServer};
pub use wait::wait_until;
