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

/// `s` with every JSON object or array that holds a string replaced by `{…}` / `[…]`. Go's gjson
/// reads an object or array given where text is expected as its JSON text, and so does the
/// parser; quoted back in a message, alone or inside a derived name (the Redis cluster
/// `outbound|6379||{…}`), a misplaced block would show what it holds, passwords included
/// (found by `tests/fuzz`). Only a JSON string can hold a password, so composites without one
/// (`[1]` of a path) stay. A composite cut short ends the message.
pub(super) fn elide_composites(s: String) -> String {
    if !s.contains('"') {
        return s;
    }
    // Bounds the scan; a composite this cuts is cut short below.
    let s = clamp(s, 64 * 1024);
    let mut out = String::with_capacity(s.len());
    let mut rest = s.as_str();
    while let Some(i) = rest.find(['{', '[']) {
        let (head, tail) = rest.split_at(i);
        out.push_str(head);
        let mut values = serde_json::Deserializer::from_str(tail).into_iter::<serde_json::Value>();
        match values.next() {
            Some(Ok(_)) => {
                let (text, after) = tail.split_at(values.byte_offset());
                match (text.contains('"'), text.starts_with('{')) {
                    (false, _) => out.push_str(text),
                    (true, true) => out.push_str("{…}"),
                    (true, false) => out.push_str("[…]"),
                }
                rest = after;
            }
            Some(Err(e)) if e.is_eof() => {
                out.push('…');
                return out;
            }
            _ => {
                let (open, after) = tail.split_at(1);
                out.push_str(open);
                rest = after;
            }
        }
    }
    out.push_str(rest);
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
        assert_eq!(
            e("cluster `outbound|1||[{\"password\":\"s\"}]` cannot exist; [{\"password\":\"s\"}]"),
            "cluster `outbound|1||[…]` cannot exist; […]"
        );
        assert_eq!(e("`{\"password\":\"s` rest"), "`…");
        assert_eq!(
            e("_rules_[1] has \"x\" and {}"),
            "_rules_[1] has \"x\" and {}"
        );
        assert_eq!(e("{\"a\" x} \"b\""), "{\"a\" x} \"b\"");
        assert_eq!(e("`{broken` rest `secret`"), "`{broken` rest `secret`");
    }

    /// Found by `tests/fuzz` (config): `serviceFQDN` given as an object went into the Redis
    /// cluster name, which a warning quotes.
    #[test]
    fn a_misplaced_block_inside_a_derived_name_is_not_quoted() {
        let cfg = br#"{"lb_policy":"global_least_request","lb_config":{"servicePort":70000,
                       "serviceFQDN":[{"ns":{"password":"hunter2-secret"}}]}}"#;
        let p = parse(cfg, Build::Higress).unwrap();
        let said: Vec<String> = p.warnings.iter().map(ToString::to_string).collect();
        assert!(
            said.iter().any(|w| w.contains("outbound|70000||[…]")),
            "{said:?}"
        );
        assert!(!said.iter().any(|w| w.contains("hunter2")), "{said:?}");
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
