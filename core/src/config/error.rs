//! Configuration errors: each names the field path and the problem, never a secret's value,
//! and says whose rule refused it (Higress's own, or one of this plugin's stricter keys).

use std::fmt;

/// Why a config was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Not JSON (Higress refuses it too).
    Syntax,
    /// Higress's Go plugin refuses this config too (same rule, same outcome).
    Higress,
    /// One of this plugin's own keys, or a limit of this build (README tables): Higress has no
    /// such key or build, so it would not refuse.
    Strict,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted path of the offending field, e.g. `_rules_[1].lb_config.servicePort`.
    pub path: String,
    pub problem: String,
    pub kind: ErrorKind,
}

impl ConfigError {
    /// An error from one of our own keys or this build's limits.
    pub fn new(path: impl Into<String>, problem: impl Into<String>) -> Self {
        ConfigError {
            path: clamp(path.into(), MAX_PATH),
            problem: clamp(elide_composites(problem.into()), MAX_PROBLEM),
            kind: ErrorKind::Strict,
        }
    }

    /// An error Higress's Go plugin makes too.
    pub fn higress(path: impl Into<String>, problem: impl Into<String>) -> Self {
        ConfigError {
            kind: ErrorKind::Higress,
            ..Self::new(path, problem)
        }
    }

    pub fn syntax(problem: impl Into<String>) -> Self {
        ConfigError {
            kind: ErrorKind::Syntax,
            ..Self::new("", problem)
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "invalid configuration: {}", self.problem)
        } else {
            write!(f, "invalid configuration: {}: {}", self.path, self.problem)
        }
    }
}

impl std::error::Error for ConfigError {}

/// Longest field path kept in an error or warning (paths are built from the config's keys).
pub(super) const MAX_PATH: usize = 256;
/// Longest problem or warning text kept: they quote the offending value, which the config
/// author controls, and each is one log line.
pub(super) const MAX_PROBLEM: usize = 512;

/// `s` with every backtick-quoted JSON object or array, and every other occurrence of its text,
/// replaced by `{…}` / `[…]`. Go's gjson reads an object given where text is expected as its
/// JSON text, and so does the parser; quoted back in a message, a misplaced block would show
/// what it holds, passwords included (found by `tests/fuzz`: `"lb_policy": {"password": …}`).
/// A quoted composite whose end cannot be found is cut with the rest of the message.
pub(super) fn elide_composites(s: String) -> String {
    if !s.contains("`{") && !s.contains("`[") {
        return s;
    }
    let mut found: Vec<String> = Vec::new();
    let mut rest = s.as_str();
    let mut cut_at = None;
    while let Some(i) = rest.find('`') {
        let after = &rest[i + 1..];
        if !after.starts_with(['{', '[']) {
            // An ordinary quote: skip through its closing backtick.
            rest = after.find('`').map_or("", |j| &after[j + 1..]);
            continue;
        }
        let mut values = serde_json::Deserializer::from_str(after).into_iter::<serde_json::Value>();
        let end = match values.next() {
            Some(Ok(_)) => Some(values.byte_offset()),
            _ => None,
        };
        match end.filter(|&e| after.get(e..).is_some_and(|r| r.starts_with('`'))) {
            Some(e) => {
                found.push(after[..e].to_string());
                rest = &after[e + 1..];
            }
            None => {
                cut_at = Some(s.len() - after.len());
                break;
            }
        }
    }
    let mut out = match cut_at {
        Some(at) => format!("{}…`", &s[..at]),
        None => s.clone(),
    };
    // Longest first, so a composite inside another is not replaced before its container.
    found.sort_by_key(|f| std::cmp::Reverse(f.len()));
    for f in &found {
        let mark = if f.starts_with('{') { "{…}" } else { "[…]" };
        out = out.replace(f.as_str(), mark);
    }
    out
}

/// `s` cut to at most `max` bytes (3 or more) on a character boundary, `…` marking the cut.
pub(super) fn clamp(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max.saturating_sub('…'.len_utf8());
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse, Build};

    /// Found by `tests/fuzz` (config): an unknown policy of 70 KB was quoted whole, so refusing
    /// the config wrote a 70 KB log line; an unknown key's warning did the same with its path.
    #[test]
    fn long_values_and_keys_are_quoted_cut() {
        let policy = "x".repeat(70_000);
        let cfg = format!(r#"{{"lb_policy":"{policy}","lb_config":{{}}}}"#);
        let e = parse(cfg.as_bytes(), Build::Higress).unwrap_err();
        assert!(e.problem.starts_with("unknown policy `xxx"), "{e}");
        assert!(
            e.problem.len() <= MAX_PROBLEM && e.problem.ends_with('…'),
            "{e}"
        );
        let key = "k".repeat(70_000);
        let cfg = format!(
            r#"{{"lb_policy":"global_least_request","lb_config":{{"serviceFQDN":"r","servicePort":1,"{key}":1}}}}"#
        );
        let p = parse(cfg.as_bytes(), Build::Higress).unwrap();
        assert!(!p.warnings.is_empty());
        for w in &p.warnings {
            assert!(
                w.path.len() <= MAX_PATH && w.message.len() <= MAX_PROBLEM,
                "{w}"
            );
        }
    }

    /// Found by `tests/fuzz` (config): `lb_policy` given as an object was quoted as its JSON
    /// text, so the refusal logged the `password` inside it.
    #[test]
    fn a_misplaced_block_is_not_quoted_with_its_password() {
        let cfg = br#"{"lb_config":{"serviceFQDN":"r","servicePort":1},
                       "lb_policy":{"password":"hunter2-secret","note":"a`b"}}"#;
        let e = parse(cfg, Build::Higress).unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
        assert!(
            e.problem
                .starts_with("unknown policy `{…}` for lb_type endpoint"),
            "{e}"
        );
        let cfg =
            br#"{"lb_policy":"global_least_request","lb_type":["password","hunter2-secret"]}"#;
        let e = parse(cfg, Build::Higress).unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[test]
    fn composites_are_elided_plain_quotes_kept() {
        let e = |s: &str| elide_composites(s.to_string());
        assert_eq!(e("unknown value `x` (a, b)"), "unknown value `x` (a, b)");
        assert_eq!(e("`{\"p\":\"s\"}` and `y`"), "`{…}` and `y`");
        assert_eq!(e("`[1,\"`\"]` then `z`"), "`[…]` then `z`");
        assert_eq!(e("`{broken` rest `secret`"), "`…`");
        assert_eq!(e("`{} x"), "`…`");
        assert_eq!(e("`[1]` or [1] again"), "`[…]` or […] again");
    }

    #[test]
    fn clamp_cuts_on_a_character_boundary() {
        assert_eq!(clamp("abc".into(), 3), "abc");
        assert_eq!(clamp("abcdef".into(), 5), "ab…");
        let cut = clamp("é".repeat(10), 6);
        assert!(cut.len() <= 6 && cut.ends_with('…'), "{cut}");
        assert_eq!(clamp("✓✓".into(), 2), "…");
    }
}
