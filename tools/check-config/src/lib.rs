//! Reads a configuration document and checks every plugin config in it with the plugin's own
//! parser (`ailb_core::config::parse`). JSON is handed to the parser byte for byte (repeated
//! keys and number spellings reach it as Higress would see them); YAML (the console's and
//! Kubernetes' format, several documents allowed) is converted to JSON first, as the control
//! plane does. [`extract`] finds the configs, [`check`] parses them. docs/compatibility.md
//! documents the output.

use ailb_core::config::{self, Build, ConfigError, ErrorKind, Warning};
use serde::Deserialize;
use serde_json::Value;

/// The verdict on one plugin config found in the input.
#[derive(Debug)]
pub struct Checked {
    /// Where it came from: `plugin config`, `WasmPlugin <name>`, `spec.configSchema example`.
    pub label: String,
    pub outcome: Result<String, String>,
    pub warnings: Vec<Warning>,
}

impl Checked {
    fn refused(label: impl Into<String>, reason: impl Into<String>) -> Checked {
        Checked {
            label: label.into(),
            outcome: Err(reason.into()),
            warnings: Vec::new(),
        }
    }
}

/// A plugin config found in the input: the JSON Higress's control plane would hand the plugin
/// (its `on_configure` buffer), or why no config reaches the plugin at all.
#[derive(Debug, Clone, PartialEq)]
pub struct Extracted {
    /// Where it came from: `plugin config`, `WasmPlugin <name>`, `spec.configSchema example`.
    pub label: String,
    pub json: Result<Vec<u8>, String>,
}

impl Extracted {
    fn found(label: impl Into<String>, json: Vec<u8>) -> Extracted {
        Extracted {
            label: label.into(),
            json: Ok(json),
        }
    }

    fn refused(label: impl Into<String>, reason: impl Into<String>) -> Extracted {
        Extracted {
            label: label.into(),
            json: Err(reason.into()),
        }
    }
}

/// Every plugin config in `text` (a file's content), as the plugin would receive it. The e2e
/// suite delivers exactly these bytes to the built plugin in the gateway emulator.
pub fn extract(text: &[u8]) -> Vec<Extracted> {
    let Ok(s) = std::str::from_utf8(text) else {
        return vec![Extracted::refused("input", "not UTF-8 text")];
    };
    if let Ok(doc) = serde_json::from_str::<Value>(s) {
        return extract_document(&doc, Some(text));
    }
    let looks_json = s.trim_start().starts_with(['{', '[']) || s.trim().is_empty();
    let mut out = Vec::new();
    for (n, de) in serde_yaml::Deserializer::from_str(s).enumerate() {
        let doc = serde_yaml::Value::deserialize(de)
            .map_err(|e| e.to_string())
            .and_then(|y| serde_json::to_value(y).map_err(|e| e.to_string()));
        match doc {
            Ok(Value::Null) => {}
            Ok(doc) => out.extend(extract_document(&doc, None)),
            // Not YAML either: if it was meant as JSON, the plugin's own JSON error says why.
            Err(_) if looks_json => return vec![Extracted::found("plugin config", text.to_vec())],
            Err(e) => {
                return vec![Extracted::refused(
                    format!("document {}", n + 1),
                    format!("not JSON or YAML: {e}"),
                )]
            }
        }
    }
    if out.is_empty() {
        out.push(Extracted::found("plugin config", text.to_vec()));
    }
    out
}

fn extract_document(doc: &Value, raw: Option<&[u8]>) -> Vec<Extracted> {
    match config::plugin_configs(doc) {
        Err(reason) => vec![Extracted::refused("document", reason)],
        Ok(delivered) => delivered
            .into_iter()
            .map(|d| match raw {
                // A plain JSON plugin config goes to the parser exactly as written.
                Some(raw) if d.label == "plugin config" => Extracted::found(d.label, raw.to_vec()),
                _ => Extracted::found(d.label, d.json.to_string().into_bytes()),
            })
            .collect(),
    }
}

/// Checks every plugin config in `text` (a file's content).
pub fn check(text: &[u8], build: Build) -> Vec<Checked> {
    extract(text)
        .into_iter()
        .map(|e| match e.json {
            Ok(json) => verdict(&e.label, &json, build),
            Err(reason) => Checked::refused(e.label, reason),
        })
        .collect()
}

fn verdict(label: &str, json: &[u8], build: Build) -> Checked {
    match config::parse(json, build) {
        Ok(parsed) => Checked {
            label: label.to_string(),
            outcome: Ok(parsed.config.summary()),
            warnings: parsed.warnings,
        },
        Err(e) => Checked::refused(label, reason(&e)),
    }
}

/// The error and whose rule it is.
pub fn reason(e: &ConfigError) -> String {
    let whose = match e.kind {
        ErrorKind::Syntax | ErrorKind::Higress => "Higress refuses it too",
        ErrorKind::Strict => "a rule of this plugin's own keys or build",
    };
    let at = if e.path.is_empty() {
        String::new()
    } else {
        format!("{}: ", e.path)
    };
    format!("{at}{} ({whose})", e.problem)
}

/// The report lines: per config `accepted: ...` or `refused: ...`, then its warnings.
pub fn render(results: &[Checked]) -> String {
    let many = results.len() > 1;
    let mut out = String::new();
    for c in results {
        let prefix = if many {
            format!("[{}] ", c.label)
        } else {
            String::new()
        };
        match &c.outcome {
            Ok(summary) => out.push_str(&format!("{prefix}accepted: {summary}\n")),
            Err(why) => out.push_str(&format!("{prefix}refused: {why}\n")),
        }
        for w in &c.warnings {
            out.push_str(&format!("{prefix}warning: {w}\n"));
        }
    }
    out
}

/// Whether every config was accepted.
pub fn all_accepted(results: &[Checked]) -> bool {
    results.iter().all(|c| c.outcome.is_ok())
}
