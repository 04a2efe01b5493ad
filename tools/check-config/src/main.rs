//! `check-config [--envoy] FILE...` (`-` reads stdin): prints `accepted` or `refused: <reason>`
//! and every warning for each plugin config in each file; exits 0 when all are accepted, 1
//! when one is refused, 2 on a usage or read error.

use ailb_check_config::{all_accepted, check, render};
use ailb_core::config::Build;
use std::io::Read;
use std::process::ExitCode;

const USAGE: &str = "usage: check-config [--envoy] FILE...   (FILE may be - for stdin)
  Checks plugin configs (JSON or YAML: a plugin config, a console route config, a Higress
  WasmPlugin resource, or a plugin spec.yaml) with the plugin's own parser.
  --envoy   check for the plain-Envoy build (default: the Higress build)";

fn main() -> ExitCode {
    let mut build = Build::Higress;
    let mut files = Vec::new();
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--envoy" => build = Build::Envoy,
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            _ => files.push(arg),
        }
    }
    if files.is_empty() {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    }
    let mut ok = true;
    for file in &files {
        let mut text = Vec::new();
        let read = if file == "-" {
            std::io::stdin().read_to_end(&mut text).map(|_| ())
        } else {
            std::fs::read(file).map(|t| text = t)
        };
        if let Err(e) = read {
            eprintln!("check-config: {file}: {e}");
            return ExitCode::from(2);
        }
        let results = check(&text, build);
        if files.len() > 1 {
            println!("{file}:");
        }
        print!("{}", render(&results));
        ok &= all_accepted(&results);
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
