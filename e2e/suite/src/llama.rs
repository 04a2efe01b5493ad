//! Real engines (issue 51): `llama-server` processes from llama.cpp on free loopback ports,
//! built once and cached by tools/llama/build.sh (`make llama`), each killed when dropped.
//!
//! Each engine runs the tiny random-weight model with `--cache-ram 0`: it remembers only its
//! slots' last prompts, so which engine a conversation returns to decides its cache hits
//! (docs/model-server-metrics.md §1.5 for its metrics). Output text is random: read usage and
//! metrics, never text.

use crate::gateway::http;
use ailb_fakepod::promtext::parse_text;
use ailb_testkit::free_port;
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where `make llama` put the server binary and the model.
pub struct Artifacts {
    pub server: PathBuf,
    pub model: PathBuf,
}

/// Runs tools/llama/build.sh (a cached run prints the two paths at once; a first run builds
/// for ~10 minutes, its progress on stderr) and reads the paths it prints.
pub fn artifacts() -> anyhow::Result<Artifacts> {
    let script = crate::repo_root().join("tools/llama/build.sh");
    let out = Command::new("sh")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "{} failed (run `make llama` to see why)",
        script.display()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let path = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(PathBuf::from)
            .ok_or_else(|| anyhow::anyhow!("build.sh printed no {key}: {text}"))
    };
    Ok(Artifacts {
        server: path("LLAMA_SERVER=")?,
        model: path("LLAMA_MODEL=")?,
    })
}

/// How each engine is started.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Concurrent sequences (`-np`); requests beyond them wait (`requests_deferred`).
    pub slots: usize,
    /// Context per engine (`-c`), shared by its slots.
    pub context: usize,
    /// CPU threads per engine (`-t`).
    pub threads: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            slots: 2,
            context: 8192,
            threads: 1,
        }
    }
}

/// One running `llama-server`.
pub struct Engine {
    pub name: String,
    pub addr: String,
    child: Option<Child>,
    /// What it was started with, to start it again on the same port ([`Engine::restart`]).
    server: PathBuf,
    model: PathBuf,
    cfg: EngineConfig,
}

impl Engine {
    /// Starts one engine named `name` on a free port; waits until `/health` answers 200.
    pub fn start(name: &str, art: &Artifacts, cfg: &EngineConfig) -> anyhow::Result<Engine> {
        let mut engine = Engine {
            name: name.to_string(),
            addr: format!("127.0.0.1:{}", free_port()),
            child: None,
            server: art.server.clone(),
            model: art.model.clone(),
            cfg: cfg.clone(),
        };
        engine.spawn()?;
        Ok(engine)
    }

    /// Kills the engine and starts it again on the same address, as a pod whose engine
    /// restarted: the same endpoint, every slot's cache empty.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn()
    }

    /// Starts the process on the engine's address and waits until `/health` answers 200 (at
    /// most 30 s).
    fn spawn(&mut self) -> anyhow::Result<()> {
        let (name, cfg) = (self.name.clone(), &self.cfg);
        let port = self.addr.rsplit(':').next().unwrap_or_default().to_string();
        let child = Command::new(&self.server)
            .args(["-m"])
            .arg(&self.model)
            .args(["--host", "127.0.0.1", "--port", &port])
            .args(["--metrics", "--cache-ram", "0", "--no-webui"])
            .args(["-np", &cfg.slots.to_string()])
            .args(["-c", &cfg.context.to_string()])
            .args(["-t", &cfg.threads.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if matches!(self.get("/health"), Ok((200, _))) {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut() {
                if let Some(status) = c.try_wait()? {
                    anyhow::bail!("llama-server {name} exited at start: {status}");
                }
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "llama-server {name} not healthy in 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A GET on the engine (the harness's HTTP client, crate::gateway::http): (status, body).
    pub fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let (status, _, body) = http(&self.url(), "GET", path, &[], b"")?;
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// One sample of the engine's Prometheus gauge or counter `name` (e.g.
    /// `llamacpp:requests_processing`), None when the page lacks it.
    /// The page is read by the fake pods' Prometheus reader, which also checks its shape.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let (_, page) = self.get("/metrics").ok()?;
        parse_text(&page)
            .ok()?
            .into_iter()
            .find_map(|(n, _, v)| (n == name).then_some(v))
    }

    /// Requests the engine holds: running in a slot plus waiting for one (0 when the page
    /// does not answer, as a dead engine holds nothing).
    pub fn load(&self) -> f64 {
        self.metric("llamacpp:requests_processing").unwrap_or(0.0)
            + self.metric("llamacpp:requests_deferred").unwrap_or(0.0)
    }

    /// Kills the engine at once (SIGKILL), as a crashed pod.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Held by each real-engine test for its whole run: the engines decode on the CPU, and two
/// tests' engines sharing 2 cores would slow each other's streams past the timings the tests
/// bound (a poisoned lock, a test that failed, does not stop the others).
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The engines' addresses (`ip:port`), in order: a gateway's endpoint list.
pub fn addrs(engines: &[Engine]) -> Vec<String> {
    engines.iter().map(|e| e.addr.clone()).collect()
}

/// `n` engines named `engine-<i>`, started together.
pub fn fleet(n: usize, cfg: &EngineConfig) -> anyhow::Result<Vec<Engine>> {
    let art = artifacts()?;
    (0..n)
        .map(|i| Engine::start(&format!("engine-{i}"), &art, cfg))
        .collect()
}

/// `usage.prompt_tokens` and `usage.prompt_tokens_details.cached_tokens` of an OpenAI chat
/// answer (plain JSON, or the last SSE event that carries usage), None when absent.
pub fn usage(body: &str) -> Option<(u64, u64)> {
    let read = |v: &Value| {
        let u = v.get("usage")?;
        let prompt = u.get("prompt_tokens")?.as_u64()?;
        let cached = u
            .pointer("/prompt_tokens_details/cached_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        Some((prompt, cached))
    };
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        return read(&v);
    }
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| read(&v))
        .next_back()
}

#[cfg(test)]
mod tests {
    use super::usage;

    #[test]
    fn usage_is_read_from_plain_and_streamed_answers() {
        let plain = r#"{"usage":{"prompt_tokens":652,"completion_tokens":8,"prompt_tokens_details":{"cached_tokens":634}}}"#;
        assert_eq!(usage(plain), Some((652, 634)));
        let sse = "data: {\"choices\":[{}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":653,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\ndata: [DONE]\n\n";
        assert_eq!(usage(sse), Some((653, 0)));
        assert_eq!(usage("data: [DONE]\n"), None);
    }
}
