//! Canonicalisation errors.

use super::json::J;
use std::fmt;

/// Why a body could not be canonicalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CanonError {
    TooLarge {
        len: usize,
        max: usize,
    },
    /// Syntax error, invalid UTF-8, nesting over 128, trailing data (serde_json's message).
    NotJson(String),
    NotObject {
        found: &'static str,
    },
    NoPrompt,
    /// `field` is an empty array.
    Empty {
        field: &'static str,
    },
    WrongType {
        path: String,
        expected: &'static str,
        found: &'static str,
    },
    MissingField {
        path: String,
    },
}

impl fmt::Display for CanonError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            CanonError::TooLarge { len, max } => {
                write!(
                    f,
                    "request body of {len} bytes exceeds the limit of {max} bytes"
                )
            }
            CanonError::NotJson(e) => write!(f, "request body is not valid JSON: {e}"),
            CanonError::NotObject { found } => {
                write!(f, "request body must be a JSON object, found {found}")
            }
            CanonError::NoPrompt => f.write_str(
                "request body has no prompt field (messages, input, instructions or prompt)",
            ),
            CanonError::Empty { field } => write!(f, "`{field}` must not be empty"),
            CanonError::WrongType {
                path,
                expected,
                found,
            } => {
                write!(f, "`{path}` must be {expected}, found {found}")
            }
            CanonError::MissingField { path } => write!(f, "`{path}` is missing"),
        }
    }
}

impl std::error::Error for CanonError {}

impl CanonError {
    /// Prefixes the path of a field error with the enclosing location.
    pub(super) fn within(self, outer: &str) -> Self {
        let join = |path: String| match path.as_bytes().first() {
            None => outer.to_owned(),
            Some(b'[') => format!("{outer}{path}"),
            Some(_) => format!("{outer}.{path}"),
        };
        match self {
            CanonError::WrongType {
                path,
                expected,
                found,
            } => CanonError::WrongType {
                path: join(path),
                expected,
                found,
            },
            CanonError::MissingField { path } => CanonError::MissingField { path: join(path) },
            other => other,
        }
    }
}

pub(super) fn wrong(path: &str, expected: &'static str, found: &J) -> CanonError {
    CanonError::WrongType {
        path: path.to_owned(),
        expected,
        found: found.kind(),
    }
}
