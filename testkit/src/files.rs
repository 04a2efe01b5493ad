//! Files the tests and benchmarks write: one that goes when its guard is dropped, and one put
//! in place whole, for files several test processes share.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A file removed when dropped, a failed test's too.
pub struct TempFile(pub PathBuf);

impl TempFile {
    /// `ailb-<pid>-<name>` in the temp directory.
    pub fn new(name: &str) -> TempFile {
        TempFile(std::env::temp_dir().join(format!("ailb-{}-{name}", std::process::id())))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Writes `bytes` to `path` under a name of this writer's own (process and call), then
/// renames it into place: a reader in another thread or process never meets a half-written
/// file, and one that has the old file open keeps it.
pub fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let n = WRITES.fetch_add(1, Ordering::Relaxed);
    let mut part = path.as_os_str().to_owned();
    part.push(format!(".{}-{n}.part", std::process::id()));
    std::fs::write(&part, bytes)?;
    std::fs::rename(&part, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_file_holds_the_new_bytes_and_a_temp_file_goes_when_dropped() {
        let file = TempFile::new("files-test");
        replace_file(&file.0, b"one").unwrap();
        replace_file(&file.0, b"two").unwrap();
        assert_eq!(std::fs::read(&file.0).unwrap(), b"two");
        let path = file.0.clone();
        drop(file);
        assert!(!path.exists());
    }
}
