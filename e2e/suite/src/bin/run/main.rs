//! `make run [POLICY=<name>]`: redis-server, fake pods and one emulator gateway running the
//! built plugin with one policy, a workload that shows that policy at work, a per-pod (or
//! per-service) table and the policy's own counters; then it keeps serving until Ctrl-C
//! (`--once`: exit after the table). The gateway's log, the plugin's lines included, goes to a
//! file it names. `--engine llama` serves with three real llama.cpp engines instead of fake
//! pods (global_least_request and prefix_cache; real.rs).
//!
//! `ailb-run [--policy global_least_request|prefix_cache|endpoint_metrics|cluster_metrics|cluster_hash] [--engine fake|llama] [--once]`

mod demo;
mod real;
mod report;

use ailb_core::config::Policy;
use demo::Demo;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

struct Args {
    policy: Policy,
    once: bool,
    /// `--engine llama`: real engines instead of fake pods.
    llama: bool,
}

fn engine(name: &str) -> anyhow::Result<bool> {
    match name {
        "fake" => Ok(false),
        "llama" => Ok(true),
        other => anyhow::bail!("unknown engine {other:?}: fake or llama"),
    }
}

fn args() -> anyhow::Result<Args> {
    let mut policy = Policy::GlobalLeastRequest;
    let mut once = false;
    let mut llama = false;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--once" => once = true,
            "--policy" => {
                let name = it.next().unwrap_or_default();
                policy = demo::policy(&name)?;
            }
            "--engine" => llama = engine(&it.next().unwrap_or_default())?,
            other => match (
                other.strip_prefix("--policy="),
                other.strip_prefix("--engine="),
            ) {
                (Some(name), _) => policy = demo::policy(name)?,
                (_, Some(name)) => llama = engine(name)?,
                _ => anyhow::bail!(
                    "unknown argument {other}\nusage: ailb-run [--policy {}] [--engine fake|llama] [--once]",
                    demo::names().replace(", ", "|")
                ),
            },
        }
    }
    Ok(Args {
        policy,
        once,
        llama,
    })
}

/// Where the gateway's log goes: `e2e/target/ailb-run/<policy>[-llama].log`.
fn log_path(policy: Policy, llama: bool) -> anyhow::Result<PathBuf> {
    let root = ailb_e2e::repo_root();
    let dir = root
        .canonicalize()
        .unwrap_or(root)
        .join("e2e/target/ailb-run");
    std::fs::create_dir_all(&dir)?;
    let suffix = if llama { "-llama" } else { "" };
    Ok(dir.join(format!("{}{suffix}.log", policy.name())))
}

fn main() -> anyhow::Result<()> {
    let args = args()?;
    let demo = if args.llama {
        real::start(args.policy)?
    } else {
        Demo::start(args.policy)?
    };
    let log = log_path(args.policy, args.llama)?;
    report::header(&demo, &log);
    let outcome = if args.llama {
        real::workload(&demo)
    } else {
        demo.run_workload()?
    };
    report::table(&demo, &outcome);
    report::counters(&demo);
    std::fs::write(&log, demo.gateway.logs())?;
    println!("\ngateway log: {}", log.display());
    if args.once {
        return Ok(());
    }
    println!("\nserving on {} — Ctrl-C to stop", demo.gateway.url);
    // The log file follows the gateway's log while it serves.
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let _ = std::fs::write(&log, demo.gateway.logs());
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        let waited = demo.bed.rt.block_on(tokio::signal::ctrl_c());
        stop.store(true, Ordering::Relaxed);
        waited
    })?;
    std::fs::write(&log, demo.gateway.logs())?;
    Ok(())
}
