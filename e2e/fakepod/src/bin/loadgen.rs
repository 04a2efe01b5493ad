//! `ailb-loadgen`: run a seeded workload against one or more setups and print JSON summaries.

use ailb_fakepod::load::{cli::LoadCli, run};
use serde_json::json;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::args().any(|a| a == "--help" || a == "-h") {
        print!("{}", ailb_fakepod::load::cli::USAGE);
        return Ok(());
    }
    let cli = match LoadCli::parse(std::env::args().skip(1).collect()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mut results = Vec::new();
    for (name, cfg) in &cli.setups {
        let summary = run(cfg).await?;
        let label = if name.is_empty() {
            String::new()
        } else {
            format!("[{name}] ")
        };
        eprintln!("{label}{}", summary.line());
        results.push((name.clone(), summary));
    }
    let text = match results.as_slice() {
        [(name, s)] if name.is_empty() => serde_json::to_string_pretty(s)?,
        _ => serde_json::to_string_pretty(&json!({
            "setups": results
                .iter()
                .map(|(n, s)| json!({"name": n, "summary": s}))
                .collect::<Vec<_>>()
        }))?,
    };
    match &cli.out {
        Some(path) => std::fs::write(path, text + "\n")?,
        None => println!("{text}"),
    }
    Ok(())
}
