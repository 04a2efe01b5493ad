//! The emulator's command line, `ailb-gateway --config FILE [--set key=value]...`: prints
//! `READY listen=… admin=…` once serving; exits 2 if the plugin rejects its configuration.
//! A library function so that `ailb-bench-gateway` (e2e/bench) is this same program with its
//! instruments installed first ([`crate::instrument`]).

use crate::config::Config;
use crate::gateway::{start, ConfigRejected};
use std::io::Write;
use std::path::PathBuf;

/// Parses the arguments, starts the gateway and serves until the process is killed.
pub fn main() {
    let mut config: Option<PathBuf> = None;
    let mut sets = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--config" | "-c" => config = args.next().map(PathBuf::from),
            "--set" => sets.extend(args.next()),
            "-h" | "--help" => {
                println!("usage: ailb-gateway --config FILE [--set key=value]...");
                return;
            }
            other => {
                eprintln!("unknown argument {other}");
                std::process::exit(64);
            }
        }
    }
    let Some(config) = config else {
        eprintln!("usage: ailb-gateway --config FILE [--set key=value]...");
        std::process::exit(64);
    };
    let cfg = match Config::load(&config, &sets) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("config error: {e:#}");
            std::process::exit(64);
        }
    };
    match start(cfg) {
        Ok(gw) => {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "READY listen={} admin={}", gw.listen, gw.admin);
            let _ = out.flush();
            drop(out);
            loop {
                std::thread::park();
            }
        }
        Err(e) => {
            eprintln!("ailb-gateway: {e:#}");
            if e.downcast_ref::<ConfigRejected>().is_some() {
                std::process::exit(2);
            }
            std::process::exit(1);
        }
    }
}
