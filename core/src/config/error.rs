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
            path: path.into(),
            problem: problem.into(),
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
