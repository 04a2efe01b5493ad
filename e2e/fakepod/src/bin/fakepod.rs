//! `ailb-fakepod`: run one or more fake model servers until Ctrl-C / SIGTERM.

use ailb_fakepod::config::Cli;
use ailb_fakepod::spawn_pod;
use std::io::Write;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::args().any(|a| a == "--help" || a == "-h") {
        print!("{}", ailb_fakepod::config::USAGE);
        return Ok(());
    }
    let cli = match Cli::parse(std::env::args().skip(1).collect()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mut pods = Vec::new();
    for cfg in cli.pod_configs() {
        let pod = spawn_pod(cfg).await?;
        // Exactly one line per pod; test harnesses wait for it, so flush immediately.
        let mut out = std::io::stdout().lock();
        writeln!(out, "READY listen={} name={}", pod.addr, pod.name)?;
        out.flush()?;
        pods.push(pod);
    }
    wait_for_stop().await;
    for pod in pods {
        pod.shutdown().await;
    }
    Ok(())
}

async fn wait_for_stop() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
