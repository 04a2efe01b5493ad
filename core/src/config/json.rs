//! Reads the config bytes into a JSON value the way Higress's gjson sees them: when an object
//! repeats a key, the **first** occurrence is the one read (gjson `Get` stops at the first
//! match; serde_json's own `Value` would keep the last). Each repeated key is reported.

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::cell::RefCell;
use std::fmt;

/// The value plus the paths of the keys that were given more than once.
pub fn parse(bytes: &[u8]) -> Result<(Value, Vec<String>), serde_json::Error> {
    let duplicates = RefCell::new(Vec::new());
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Node {
        path: String::new(),
        duplicates: &duplicates,
    }
    .deserialize(&mut de)?;
    de.end()?;
    Ok((value, duplicates.into_inner()))
}

struct Node<'d> {
    path: String,
    duplicates: &'d RefCell<Vec<String>>,
}

impl Node<'_> {
    fn child(&self, path: String) -> Node<'_> {
        Node {
            path,
            duplicates: self.duplicates,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(v) =
            seq.next_element_seed(self.child(format!("{}[{}]", self.path, items.len())))?
        {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = super::warning::join(&self.path, &key);
            let value = map.next_value_seed(self.child(path.clone()))?;
            if out.contains_key(&key) {
                self.duplicates.borrow_mut().push(path);
            } else {
                out.insert(key, value);
            }
        }
        Ok(out.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_key_wins_and_repeats_are_reported() {
        let (v, dups) = parse(br#"{"a": 1, "b": {"c": [1, {"d": 2, "d": 3}]}, "a": 2}"#).unwrap();
        assert_eq!(v["a"], 1);
        assert_eq!(v["b"]["c"][1]["d"], 2);
        assert_eq!(dups, vec!["b.c[1].d".to_string(), "a".to_string()]);
        assert!(parse(b"{\"a\": 1} x").is_err());
        assert!(parse(b"").is_err());
    }
}
