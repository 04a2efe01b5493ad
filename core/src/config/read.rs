//! The compile step's reading context: the path of the object being read, and the warnings
//! of this config load. Higress's keys go through the Go accessors (lenient, coercions become
//! warnings); our own keys through `own` (strict: a wrong type is an error naming the field).

use super::error::ConfigError;
use super::go::{Field, Go, Own};
use super::warning::{join, Warnings};
use serde::de::DeserializeOwned;
use serde_json::Value;

pub struct Reader<'w> {
    /// Path of the object being read (`_rules_[0].lb_config`), empty at the top.
    pub at: String,
    pub warnings: &'w mut Warnings,
}

impl<'w> Reader<'w> {
    pub fn new(at: impl Into<String>, warnings: &'w mut Warnings) -> Self {
        Reader {
            at: at.into(),
            warnings,
        }
    }

    /// A reader for the object under `key`.
    pub fn nested(&mut self, key: &str) -> Reader<'_> {
        Reader {
            at: self.path(key),
            warnings: self.warnings,
        }
    }

    pub fn path(&self, key: &str) -> String {
        join(&self.at, key)
    }

    pub fn warn(&mut self, key: &str, message: impl Into<String>) {
        let path = self.path(key);
        self.warnings.push(path, message);
    }

    pub fn err(&self, key: &str, problem: impl Into<String>) -> ConfigError {
        ConfigError::new(self.path(key), problem)
    }

    /// An error Higress's Go plugin makes too.
    pub fn err_higress(&self, key: &str, problem: impl Into<String>) -> ConfigError {
        ConfigError::higress(self.path(key), problem)
    }

    fn noted<T>(&mut self, key: &str, (value, note): (T, Option<String>)) -> T {
        if let Some(note) = note {
            self.warn(key, format!("{note} (as Higress reads it)"));
        }
        value
    }

    /// Go `String()`; `None` when absent.
    pub fn string(&mut self, key: &str, v: &Field<Go>) -> Option<String> {
        v.as_ref().map(|g| {
            let read = g.string(true);
            self.noted(key, read)
        })
    }

    /// Go `String()` of a secret: notes never hold the value.
    pub fn secret(&mut self, key: &str, v: &Field<Go>) -> Option<String> {
        v.as_ref().map(|g| {
            let read = g.string(false);
            self.noted(key, read)
        })
    }

    /// Go `Int()`; `None` when absent.
    pub fn int(&mut self, key: &str, v: &Field<Go>) -> Option<i64> {
        v.as_ref().map(|g| {
            let read = g.int(true);
            self.noted(key, read)
        })
    }

    /// Go `Float()`; `None` when absent.
    pub fn float(&mut self, key: &str, v: &Field<Go>) -> Option<f64> {
        v.as_ref().map(|g| {
            let read = g.float(true);
            self.noted(key, read)
        })
    }

    /// Go `Bool()`; `None` when absent.
    pub fn bool(&mut self, key: &str, v: &Field<Go>) -> Option<bool> {
        v.as_ref().map(|g| {
            let read = g.bool();
            self.noted(key, read)
        })
    }

    /// Go `Array()`; `None` when absent.
    pub fn list(&mut self, key: &str, v: &Field<Go>) -> Option<Vec<Go>> {
        v.as_ref().map(|g| {
            let read = g.array();
            self.noted(key, read)
        })
    }

    /// Go `Int()` where 0 (or absent) means `default`; an explicit 0 is said.
    pub fn int_or(&mut self, key: &str, v: &Field<Go>, default: i64, unit: &str) -> i64 {
        match self.int(key, v) {
            None => default,
            Some(0) => {
                self.warn(
                    key,
                    format!("0 means the default: {default}{unit} (as in Higress)"),
                );
                default
            }
            Some(n) => n,
        }
    }

    /// One of our own keys, strictly typed; `None` when absent or `null`.
    pub fn own<T: DeserializeOwned>(
        &self,
        key: &str,
        v: &Field<Own<T>>,
    ) -> Result<Option<T>, ConfigError> {
        match v.as_ref() {
            None => Ok(None),
            Some(own) if own.value.is_null() => Ok(None),
            Some(own) => T::deserialize(&own.value).map(Some).map_err(|e| {
                self.err(
                    key,
                    format!("{} (got {})", type_problem(&e), kind_of(&own.value)),
                )
            }),
        }
    }
}

/// serde's message without the value itself: a wrong-typed secret must not be echoed.
fn type_problem(e: &serde_json::Error) -> String {
    let msg = e.to_string();
    match msg.find(", expected") {
        Some(i) => format!("wrong type: expected{}", &msg[i + ", expected".len()..]),
        None if msg.starts_with("invalid value") => "value out of range".to_string(),
        None => "wrong type".to_string(),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.as_i64().is_some_and(|i| i < 0) => "a negative number",
        Value::Number(n) if n.is_f64() => "a fractional number",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// What one compile step (`TryFrom<In<Raw…>> for Typed…`) reads: the raw object, the reading
/// context (path, warnings) and the build the config is for.
pub struct In<'a, 'w, T> {
    pub raw: &'a T,
    pub r: &'a mut Reader<'w>,
    pub build: super::values::Build,
}

/// A header key: `""` (or absent) is the default.
pub fn header_or(r: &mut Reader<'_>, key: &str, v: &Field<Go>, default: &str) -> String {
    match r.string(key, v) {
        None => default.to_string(),
        Some(h) if h.is_empty() => {
            r.warn(
                key,
                format!("empty: the default `{default}` (as in Higress)"),
            );
            default.to_string()
        }
        Some(h) => h,
    }
}
