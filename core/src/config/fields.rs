//! Typed access to one JSON object's fields, with unknown-key detection. Errors carry the
//! field name; `ConfigError::within` adds the enclosing path.

use super::ConfigError;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// A JSON object being read field by field. `finish` rejects the keys nobody asked for.
pub struct Fields<'a> {
    map: &'a Map<String, Value>,
    seen: BTreeSet<&'a str>,
}

impl<'a> Fields<'a> {
    pub fn new(map: &'a Map<String, Value>) -> Self {
        Fields {
            map,
            seen: BTreeSet::new(),
        }
    }

    /// The field converted to `T`, or `None` when absent or null.
    pub fn get<T: DeserializeOwned>(&mut self, key: &'a str) -> Result<Option<T>, ConfigError> {
        self.seen.insert(key);
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => T::deserialize(v).map(Some).map_err(|e| {
                ConfigError::new(key, format!("{} (got {})", type_problem(&e), kind_of(v)))
            }),
        }
    }

    /// The raw value, for nested objects handled by the caller.
    pub fn raw(&mut self, key: &'a str) -> Option<&'a Value> {
        self.seen.insert(key);
        self.map.get(key)
    }

    /// Fails on the first key that was never asked for. Keys starting with `_` belong to the
    /// control plane (Higress injects some) and are allowed.
    pub fn finish(self) -> Result<(), ConfigError> {
        for key in self.map.keys() {
            if !key.starts_with('_') && !self.seen.contains(key.as_str()) {
                let mut known: Vec<&str> = self
                    .seen
                    .iter()
                    .copied()
                    .filter(|k| !k.starts_with('_'))
                    .collect();
                known.sort_unstable();
                return Err(ConfigError::new(
                    key.clone(),
                    format!("unknown field (known here: {})", known.join(", ")),
                ));
            }
        }
        Ok(())
    }
}

/// serde's message without the value itself: a wrong-typed password must not be echoed.
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
        Value::Number(n) if n.is_i64() && n.as_i64().is_some_and(|i| i < 0) => "a negative number",
        Value::Number(n) if n.is_f64() => "a fractional number",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
