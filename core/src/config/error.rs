//! Configuration errors: each names the field path and the problem, never a secret's value.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted path of the offending field, e.g. `_rules_[1].lb_config.servicePort`.
    pub path: String,
    pub problem: String,
}

impl ConfigError {
    pub fn new(path: impl Into<String>, problem: impl Into<String>) -> Self {
        ConfigError {
            path: path.into(),
            problem: problem.into(),
        }
    }

    /// The same error seen from an enclosing object (`prefix.path`).
    pub fn within(self, prefix: &str) -> Self {
        let path = if self.path.is_empty() {
            prefix.to_string()
        } else if self.path.starts_with('[') {
            format!("{prefix}{}", self.path)
        } else {
            format!("{prefix}.{}", self.path)
        };
        ConfigError { path, ..self }
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
