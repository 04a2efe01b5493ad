//! The two binaries end to end: READY lines, multi-pod mode, loadgen JSON.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn fakepod_prints_ready_lines_and_loadgen_drives_it() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ailb-fakepod"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--pods",
            "2",
            "--base-name",
            "bin",
        ])
        .args([
            "--decode-us-per-token",
            "500",
            "--prefill-us-per-token",
            "10",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _guard = Kill(child);
    let mut lines = BufReader::new(stdout).lines();
    let mut urls = Vec::new();
    for i in 0..2 {
        let line = lines.next().unwrap().unwrap();
        let rest = line
            .strip_prefix("READY listen=")
            .unwrap_or_else(|| panic!("{line}"));
        let (addr, name) = rest.split_once(" name=").unwrap();
        assert_eq!(name, format!("bin-{i}"));
        assert!(addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"));
        urls.push(format!("http://{addr}"));
    }
    let out = Command::new(env!("CARGO_BIN_EXE_ailb-loadgen"))
        .args([
            "--target", &urls[0], "--target", &urls[1], "--admin", &urls[0], "--admin", &urls[1],
        ])
        .args([
            "--workload",
            "sessions",
            "--sessions",
            "4",
            "--rounds",
            "2",
            "--concurrency",
            "2",
        ])
        .args([
            "--new-tokens",
            "20",
            "--system-tokens",
            "50",
            "--max-tokens",
            "3",
            "--seed",
            "5",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["count"], 8);
    assert_eq!(v["ok"], 8);
    assert_eq!(v["per_pod"]["bin-0"], 4);
    assert_eq!(v["per_pod"]["bin-1"], 4);
    let human = String::from_utf8_lossy(&out.stderr);
    assert_eq!(human.lines().count(), 1, "{human}");
    assert!(human.starts_with("sessions seed=5 n=8 ok=8"));
    let bad = Command::new(env!("CARGO_BIN_EXE_ailb-fakepod"))
        .arg("--nope")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}
