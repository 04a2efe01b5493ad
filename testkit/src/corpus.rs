//! The compatibility corpus (`plugin-config/compat/`): Higress's own config examples and
//! variants of them, each with the verdict of Higress's Go `ai-load-balancer` taken from its
//! source. ailb-core's parser test, check-config's CLI test and the e2e emulator test all walk
//! it through these helpers.
//!
//! Header lines of a corpus file (YAML comments; a `.json` file, which cannot hold comments,
//! has them in the `.verdict` file beside it): `# go: accept|refuse`, `# source: ...`,
//! `# why: ...`, `# expect: <fact> = <value>`, `# refuse: <part of our error>`,
//! `# warn: <part of a warning>`, `# yaml: <part of check-config's note where a YAML 1.2 reader
//! differs>`.

use std::path::{Path, PathBuf};

/// The corpus directory.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugin-config/compat")
}

/// Every corpus file (`.yaml` and `.json`), sorted by name.
pub fn files() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "json"))
        .collect();
    paths.sort();
    paths
}

/// The `# key: value` header lines of a corpus file, in order.
pub fn header(path: &Path) -> Vec<(String, String)> {
    let meta = if path.extension().is_some_and(|e| e == "json") {
        path.with_extension("verdict")
    } else {
        path.to_path_buf()
    };
    let text = std::fs::read_to_string(&meta).unwrap_or_else(|e| panic!("{}: {e}", meta.display()));
    text.lines()
        .filter_map(|l| l.trim().strip_prefix('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// Every value of header key `key`.
pub fn values(header: &[(String, String)], key: &str) -> Vec<String> {
    header
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .collect()
}

/// Whether Higress's Go plugin accepts the file (its one `# go: accept|refuse` line).
pub fn go_accepts(path: &Path) -> bool {
    let go = values(&header(path), "go");
    match go.as_slice() {
        [v] if v == "accept" => true,
        [v] if v == "refuse" => false,
        _ => panic!("{}: needs one `# go: accept|refuse` line", path.display()),
    }
}
