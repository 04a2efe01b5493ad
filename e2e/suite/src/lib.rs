//! Harness for the end-to-end suite: a real redis-server, emulator gateway processes running
//! the built `dist/ai-load-balancer.wasm`, fake pods in-process, and Redis inspection through
//! the plugin's own RESP codec and key names.

pub mod bed;
pub mod cluster;
pub mod cluster3;
pub mod conversations;
pub mod data_parallel;
pub mod envoy;
pub mod gateway;
pub mod llama;
pub mod metrics;
pub mod real;
pub mod real_verify;
pub mod redis;
pub mod redis_cluster;
pub mod storm;
pub mod streams;
pub mod two_speeds;

use std::path::PathBuf;

/// The repository root (two levels above this crate).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The Higress artifact, built by `make build`.
pub fn plugin_wasm() -> PathBuf {
    let p = repo_root().join("dist/ai-load-balancer.wasm");
    assert!(
        p.exists(),
        "{} is missing: run `make build` first",
        p.display()
    );
    p
}

/// A binary of the e2e workspace (`ailb-gateway`), built by `make e2e-build`.
pub fn e2e_bin(name: &str) -> PathBuf {
    if let Ok(dir) = std::env::var("AILB_E2E_BIN_DIR") {
        return PathBuf::from(dir).join(name);
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let p = target.join("release").join(name);
    assert!(
        p.exists(),
        "{} is missing: run `make e2e-build` first",
        p.display()
    );
    p
}
