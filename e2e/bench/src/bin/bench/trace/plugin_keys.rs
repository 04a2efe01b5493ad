//! Whether the plugin in dist/ takes a configuration key a section's router needs, asked of
//! `dist/check-config` (the plugin's own parser), so that a section can run its other routers
//! on a plugin built before the key existed (it then refuses the config, or accepts it and
//! ignores the key with a warning: either way that router would not be what it says).

use super::run::plugin_config;
use serde_json::Value;

/// Whether the prefix_cache route config with `lb` over it is accepted with `key` known;
/// otherwise says on stderr that `section` leaves `router` out, and why.
pub fn plugin_takes(section: &str, key: &str, lb: &Value, router: &str) -> bool {
    let tool = ailb_e2e::repo_root().join("dist/check-config");
    let file = std::env::temp_dir().join(format!("ailb-{section}-{}.json", std::process::id()));
    let out = std::fs::write(&file, plugin_config(6379, lb).to_string())
        .and_then(|_| std::process::Command::new(&tool).arg(&file).output());
    let _ = std::fs::remove_file(&file);
    match out {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout).to_string()
                + &String::from_utf8_lossy(&o.stderr);
            let known = o.status.success() && !text.contains(&format!("{key}: unknown key"));
            if !known {
                eprintln!(
                    "{section}: the plugin does not take this {key} ({}); the {router} router is left out",
                    text.trim().replace('\n', "; ")
                );
            }
            known
        }
        Err(e) => {
            eprintln!(
                "{section}: {} did not run ({e}); `make build` makes it; the {router} router is left out",
                tool.display()
            );
            false
        }
    }
}
