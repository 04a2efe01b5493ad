//! Borrowed JSON tree and canonical JSON writer used by the canonicaliser.
//!
//! `J` is a minimal `serde_json::Value` look-alike that borrows strings from the request body
//! whenever they contain no escapes and keeps object entries as a `Vec` (no map building, key
//! order preserved; [`J::get`] returns the last duplicate, as JSON parsers commonly do).
//! `List` is the top-level array reader that materialises only the first `limit` items and skips
//! the rest, so a 10,000-message body costs one syntax pass and no per-message allocation.

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Number;
use std::borrow::Cow;
use std::fmt;

/// A parsed JSON value borrowing from the input where possible.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum J<'a> {
    Null,
    Bool(bool),
    Num(Number),
    Str(Cow<'a, str>),
    Arr(Vec<J<'a>>),
    Obj(Vec<(Cow<'a, str>, J<'a>)>),
}

impl<'a> J<'a> {
    /// JSON type name, for error messages.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            J::Null => "null",
            J::Bool(_) => "boolean",
            J::Num(_) => "number",
            J::Str(_) => "string",
            J::Arr(_) => "array",
            J::Obj(_) => "object",
        }
    }

    /// Member `key` of an object (last duplicate wins); `None` for non-objects.
    pub(crate) fn get(&self, key: &str) -> Option<&J<'a>> {
        match self {
            J::Obj(entries) => entries
                .iter()
                .rev()
                .find(|(k, _)| k.as_ref() == key)
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// Member `key`, with an explicit `null` treated as absent.
    pub(crate) fn get_present(&self, key: &str) -> Option<&J<'a>> {
        self.get(key).filter(|v| !matches!(v, J::Null))
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            J::Str(s) => Some(s.as_ref()),
            _ => None,
        }
    }
}

impl<'de> Deserialize<'de> for J<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JVisitor)
    }
}

struct JVisitor;

impl<'de> Visitor<'de> for JVisitor {
    type Value = J<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<J<'de>, E> {
        Ok(J::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<J<'de>, E> {
        Ok(J::Num(v.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<J<'de>, E> {
        Ok(J::Num(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<J<'de>, E> {
        // JSON cannot encode NaN/inf, so `None` is unreachable from serde_json.
        Ok(Number::from_f64(v).map_or(J::Null, J::Num))
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<J<'de>, E> {
        Ok(J::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<J<'de>, E> {
        Ok(J::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<J<'de>, E> {
        Ok(J::Str(Cow::Owned(v)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<J<'de>, E> {
        Ok(J::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<J<'de>, E> {
        Ok(J::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<J<'de>, D::Error> {
        J::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<J<'de>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(J::Arr(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<J<'de>, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let value = map.next_value()?;
            entries.push((key, value));
        }
        Ok(J::Obj(entries))
    }
}

/// Object key as a borrowed string when it has no escapes.
pub(crate) struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

/// A top-level field that should be an array (or, for `input`, a string), read with a cap.
#[derive(Debug)]
pub(crate) enum List<'a> {
    /// The first `limit` items, and how many items the array really had.
    Arr {
        items: Vec<J<'a>>,
        total: usize,
    },
    Str(Cow<'a, str>),
    /// Any other JSON type (its name), value consumed and dropped.
    Other(&'static str),
}

/// Reads a [`List`], materialising at most `limit` items (the rest are syntax-checked only).
pub(crate) struct ListSeed {
    pub(crate) limit: usize,
}

impl<'de> DeserializeSeed<'de> for ListSeed {
    type Value = List<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ListSeed {
    type Value = List<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<List<'de>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(self.limit).min(1024));
        let mut total = 0usize;
        while items.len() < self.limit {
            match seq.next_element::<J<'de>>()? {
                Some(item) => items.push(item),
                None => {
                    return Ok(List::Arr {
                        total: items.len(),
                        items,
                    })
                }
            }
        }
        total += items.len();
        while seq.next_element::<IgnoredAny>()?.is_some() {
            total += 1;
        }
        Ok(List::Arr { items, total })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<List<'de>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(List::Other("object"))
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<List<'de>, E> {
        Ok(List::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<List<'de>, E> {
        Ok(List::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<List<'de>, E> {
        Ok(List::Str(Cow::Owned(v)))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<List<'de>, E> {
        Ok(List::Other("boolean"))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<List<'de>, E> {
        Ok(List::Other("number"))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<List<'de>, E> {
        Ok(List::Other("number"))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<List<'de>, E> {
        Ok(List::Other("number"))
    }
    fn visit_unit<E: de::Error>(self) -> Result<List<'de>, E> {
        Ok(List::Other("null"))
    }
}

/// Appends the canonical JSON form of `v`: object keys sorted by UTF-8 bytes, duplicates
/// collapsed to the last one, no whitespace, strings escaped minimally (`"`, `\`, control
/// characters as `\u00XX`), numbers as serde_json prints them. Keys listed in `skip_top` are
/// left out of the top-level object only. The output never contains a 0x00 byte.
pub(crate) fn write_canonical(out: &mut Vec<u8>, v: &J, skip_top: &[&str]) {
    match v {
        J::Null => out.extend_from_slice(b"null"),
        J::Bool(true) => out.extend_from_slice(b"true"),
        J::Bool(false) => out.extend_from_slice(b"false"),
        J::Num(n) => out.extend_from_slice(n.to_string().as_bytes()),
        J::Str(s) => write_json_str(out, s),
        J::Arr(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(out, item, &[]);
            }
            out.push(b']');
        }
        J::Obj(entries) => {
            let mut sorted: Vec<&(Cow<str>, J)> = entries
                .iter()
                .filter(|(k, _)| !skip_top.contains(&k.as_ref()))
                .collect();
            // Stable: equal keys keep their order, so the last duplicate is the last of a run.
            sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            let mut first = true;
            for (i, (k, val)) in sorted.iter().map(|e| (&e.0, &e.1)).enumerate() {
                if sorted.get(i + 1).is_some_and(|next| next.0 == *k) {
                    continue;
                }
                if !first {
                    out.push(b',');
                }
                first = false;
                write_json_str(out, k);
                out.push(b':');
                write_canonical(out, val, &[]);
            }
            out.push(b'}');
        }
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn write_json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut run_start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(bytes.get(run_start..i).unwrap_or_default());
        run_start = i + 1;
        if esc.is_empty() {
            out.extend_from_slice(b"\\u00");
            for nibble in [b >> 4, b & 0xf] {
                out.push(HEX.get(usize::from(nibble)).copied().unwrap_or(b'0'));
            }
        } else {
            out.extend_from_slice(esc);
        }
    }
    out.extend_from_slice(bytes.get(run_start..).unwrap_or_default());
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(src: &str) -> String {
        let v: J = serde_json::from_str(src).unwrap();
        let mut out = Vec::new();
        write_canonical(&mut out, &v, &[]);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn canonical_json_sorts_keys_and_strips_whitespace() {
        assert_eq!(
            canon(r#" { "b" : [ 1 , {"z":null,"a":true} ], "a": "x" } "#),
            r#"{"a":"x","b":[1,{"a":true,"z":null}]}"#
        );
    }

    #[test]
    fn canonical_json_duplicate_key_keeps_last() {
        assert_eq!(canon(r#"{"a":1,"b":2,"a":3}"#), r#"{"a":3,"b":2}"#);
    }

    #[test]
    fn canonical_json_escapes_controls_and_unescapes_the_rest() {
        // "\u00e9" and "é" are the same string; a NUL becomes \u0000 (no raw 0x00 ever).
        assert_eq!(
            canon(r#"["\u00e9", "é", "a\"b\\c\u0000\n/\/"]"#),
            r#"["é","é","a\"b\\c\u0000\u000a//"]"#
        );
    }

    #[test]
    fn strings_without_escapes_are_borrowed() {
        let v: J = serde_json::from_str(r#"{"k":"plain","e":"a\nb"}"#).unwrap();
        assert!(matches!(v.get("k"), Some(J::Str(Cow::Borrowed(_)))));
        assert!(matches!(v.get("e"), Some(J::Str(Cow::Owned(_)))));
    }

    #[test]
    fn list_seed_caps_and_counts() {
        let mut de = serde_json::Deserializer::from_str("[1,2,3,4,5]");
        let l = ListSeed { limit: 2 }.deserialize(&mut de).unwrap();
        match l {
            List::Arr { items, total } => {
                assert_eq!(items.len(), 2);
                assert_eq!(total, 5);
            }
            other => panic!("{other:?}"),
        }
    }
}
