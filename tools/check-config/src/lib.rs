//! Reads a configuration document and checks every plugin config in it with the plugin's own
//! parser (`ailb_core::config::parse`). JSON is handed to the parser byte for byte (repeated
//! keys and number spellings reach it as Higress would see them); YAML (the console's and
//! Kubernetes' format, several documents allowed) is converted to JSON first as `kubectl`,
//! Helm and Argo CD convert it (YAML 1.1: `ailb_k8s_yaml`), with a warning wherever a YAML 1.2
//! reader would read another value. Documents of other kinds (an Ingress, an EnvoyFilter) are
//! named and skipped. [`extract`] finds the configs, [`check`] parses them.
//! docs/compatibility.md documents the output.

use ailb_core::config::{self, Build, ConfigError, ErrorKind, Warning};
use ailb_k8s_yaml as yaml11;
use serde_json::Value;

/// The verdict on one plugin config found in the input.
#[derive(Debug)]
pub struct Checked {
    /// Where it came from: `plugin config`, `WasmPlugin <name>`, `spec.configSchema example`.
    pub label: String,
    /// The parser's summary, or why the config is refused; `None` for a skipped document.
    pub outcome: Option<Result<String, String>>,
    pub warnings: Vec<Warning>,
    /// Where the YAML reads differently under YAML 1.2 (`path: message`).
    pub yaml_notes: Vec<String>,
}

impl Checked {
    fn refused(label: impl Into<String>, reason: impl Into<String>) -> Checked {
        Checked {
            label: label.into(),
            outcome: Some(Err(reason.into())),
            warnings: Vec::new(),
            yaml_notes: Vec::new(),
        }
    }
}

/// A plugin config found in the input: the JSON Higress's control plane would hand the plugin
/// (its `on_configure` buffer), or why no config reaches the plugin at all.
#[derive(Debug, Clone, PartialEq)]
pub struct Extracted {
    /// Where it came from: `plugin config`, `WasmPlugin <name>`, `spec.configSchema example`.
    pub label: String,
    /// The config's JSON, why none reaches the plugin, or `Skipped` for another kind.
    pub json: Result<Vec<u8>, Unchecked>,
    /// Where a YAML 1.2 reader would read this config differently (`path: message`).
    pub yaml_notes: Vec<String>,
}

/// Why a document gives the parser nothing.
#[derive(Debug, Clone, PartialEq)]
pub enum Unchecked {
    /// No config reaches the plugin: a refusal.
    Refused(String),
    /// A resource of another kind (Ingress, EnvoyFilter, ...): not a plugin config.
    Skipped,
}

impl Extracted {
    fn found(label: impl Into<String>, json: Vec<u8>) -> Extracted {
        Extracted {
            label: label.into(),
            json: Ok(json),
            yaml_notes: Vec::new(),
        }
    }

    fn refused(label: impl Into<String>, reason: impl Into<String>) -> Extracted {
        Extracted {
            label: label.into(),
            json: Err(Unchecked::Refused(reason.into())),
            yaml_notes: Vec::new(),
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
        return extract_document(&doc, Some(text), &[]);
    }
    let looks_json = s.trim_start().starts_with(['{', '[']) || s.trim().is_empty();
    let docs = match yaml11::documents(s) {
        Ok(docs) => docs,
        // Not YAML either: if it was meant as JSON, the plugin's own JSON error says why.
        Err(_) if looks_json => return vec![Extracted::found("plugin config", text.to_vec())],
        Err(e) => {
            return vec![Extracted::refused(
                "input",
                format!("not JSON or YAML: {e}"),
            )]
        }
    };
    let mut out: Vec<Extracted> = docs
        .iter()
        .flat_map(|d| extract_document(&d.value, None, &d.notes))
        .collect();
    if out.is_empty() {
        out.push(Extracted::found("plugin config", text.to_vec()));
    } else if out.iter().all(|e| e.json == Err(Unchecked::Skipped)) {
        out.push(Extracted::refused("input", "no plugin config in it"));
    }
    out
}

/// Where a resource of `kind` keeps what the plugin receives (the notes worth showing).
fn config_paths(doc: &Value) -> &'static [&'static str] {
    if doc["kind"] == "WasmPlugin" {
        &["spec.pluginConfig", "spec.defaultConfig", "spec.matchRules"]
    } else if doc["spec"]["configSchema"].is_object() {
        &[
            "spec.configSchema.openAPIV3Schema.example",
            "spec.routeConfigSchema.openAPIV3Schema.example",
        ]
    } else {
        &[""]
    }
}

fn extract_document(doc: &Value, raw: Option<&[u8]>, notes: &[yaml11::Note]) -> Vec<Extracted> {
    // A Kubernetes resource of another kind in the same file: named, not judged.
    if let (Some(kind), true) = (doc["kind"].as_str(), doc["apiVersion"].is_string()) {
        if kind != "WasmPlugin" {
            let name = doc["metadata"]["name"].as_str().unwrap_or("?");
            return vec![Extracted {
                label: format!("{kind} {name}"),
                json: Err(Unchecked::Skipped),
                yaml_notes: Vec::new(),
            }];
        }
    }
    let paths = config_paths(doc);
    let yaml_notes: Vec<String> = notes
        .iter()
        .filter(|n| paths.iter().any(|p| n.path.starts_with(p)))
        .map(|n| format!("{}: {}", n.path, n.message))
        .collect();
    match config::plugin_configs(doc) {
        Err(reason) => vec![Extracted::refused("document", reason)],
        Ok(delivered) => delivered
            .into_iter()
            .map(|d| {
                let mut e = match raw {
                    // A plain JSON plugin config goes to the parser exactly as written.
                    Some(raw) if d.label == "plugin config" => {
                        Extracted::found(d.label, raw.to_vec())
                    }
                    _ => Extracted::found(d.label, d.json.to_string().into_bytes()),
                };
                e.yaml_notes.clone_from(&yaml_notes);
                e
            })
            .collect(),
    }
}

/// Checks every plugin config in `text` (a file's content).
pub fn check(text: &[u8], build: Build) -> Vec<Checked> {
    extract(text)
        .into_iter()
        .map(|e| {
            let mut c = match e.json {
                Ok(json) => verdict(&e.label, &json, build),
                Err(Unchecked::Refused(reason)) => Checked::refused(e.label, reason),
                Err(Unchecked::Skipped) => Checked {
                    label: e.label,
                    outcome: None,
                    warnings: Vec::new(),
                    yaml_notes: Vec::new(),
                },
            };
            c.yaml_notes = e.yaml_notes;
            c
        })
        .collect()
}

fn verdict(label: &str, json: &[u8], build: Build) -> Checked {
    match config::parse(json, build) {
        Ok(parsed) => Checked {
            label: label.to_string(),
            outcome: Some(Ok(parsed.config.summary())),
            warnings: parsed.warnings,
            yaml_notes: Vec::new(),
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
            Some(Ok(summary)) => out.push_str(&format!("{prefix}accepted: {summary}\n")),
            Some(Err(why)) => out.push_str(&format!("{prefix}refused: {why}\n")),
            None => out.push_str(&format!("{prefix}skipped: not a plugin config\n")),
        }
        for w in &c.warnings {
            out.push_str(&format!("{prefix}warning: {w}\n"));
        }
        for n in &c.yaml_notes {
            out.push_str(&format!("{prefix}warning: {n}\n"));
        }
    }
    out
}

/// Whether every config was accepted.
pub fn all_accepted(results: &[Checked]) -> bool {
    results.iter().all(|c| !matches!(c.outcome, Some(Err(_))))
}
