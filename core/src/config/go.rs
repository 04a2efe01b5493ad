//! Higress's keys read the way its Go plugin reads them: through gjson's accessors, which
//! coerce instead of failing (docs/compatibility.md has the table):
//!
//! | accessor | number | string | bool | null, array, object |
//! |---|---|---|---|---|
//! | `string` | its text (`1.50` → `1.5`) | as is | `true`/`false` | `""`; JSON text for arrays/objects |
//! | `int` | truncated toward zero | digits with an optional `-`, else 0 | 1 / 0 | 0 |
//! | `float` | as is | Go `ParseFloat`, else 0 | 1 / 0 | 0 |
//! | `bool` | ≠ 0 | `1`, `t`, `true` (any case), else false | as is | false |
//! | `array` | one-item list | one-item list | one-item list | null: empty; object: one item |
//!
//! Each accessor also says, when the JSON type was not the natural one, what it assumed; the
//! caller turns that into a warning. `show = false` (secrets) keeps the value out of the note.

use serde_json::Value;
use std::marker::PhantomData;

/// A Higress key's raw JSON value; the accessors below read it as Go does.
#[derive(Debug, Clone, PartialEq)]
pub struct Go(pub Value);

/// One of this plugin's own keys: read strictly as `T` when the route is compiled, so a wrong
/// type is an error naming the field (and never quoting the value).
#[derive(Debug, Clone, PartialEq)]
pub struct Own<T> {
    pub value: Value,
    _type: PhantomData<fn() -> T>,
}

/// A raw value taken from its JSON as is (the raw structs never fail on a value).
pub trait FromJson {
    fn from_json(v: &Value) -> Self;
}

impl FromJson for Go {
    fn from_json(v: &Value) -> Self {
        Go(v.clone())
    }
}

impl<T> FromJson for Own<T> {
    fn from_json(v: &Value) -> Self {
        Own {
            value: v.clone(),
            _type: PhantomData,
        }
    }
}

/// One key of a raw struct: `Field(None)` when absent, `Field(Some(..))` when present, even
/// with `null` (gjson's `Exists()` is true for `null`, where serde's `Option` says absent).
#[derive(Debug, Clone, PartialEq)]
pub struct Field<T>(pub Option<T>);

impl<T> Default for Field<T> {
    fn default() -> Self {
        Field(None)
    }
}

impl<T> Field<T> {
    pub fn is_some(&self) -> bool {
        self.0.is_some()
    }

    pub fn as_ref(&self) -> Option<&T> {
        self.0.as_ref()
    }
}

/// A value and, when it was coerced, what was assumed.
pub type Read<T> = (T, Option<String>);

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn shown(show: bool, text: impl std::fmt::Display) -> String {
    if show {
        format!(" {text}")
    } else {
        String::new()
    }
}

impl Go {
    /// gjson `String()`.
    pub fn string(&self, show: bool) -> Read<String> {
        match &self.0 {
            Value::String(s) => (s.clone(), None),
            Value::Null => (String::new(), Some("null, read as \"\"".into())),
            Value::Number(n) => {
                let text = number_text(n);
                let note = format!(
                    "a number, read as the text{}",
                    shown(show, format!("\"{text}\""))
                );
                (text, Some(note))
            }
            Value::Bool(b) => (
                b.to_string(),
                Some(format!("a boolean, read as the text \"{b}\"")),
            ),
            other => (
                other.to_string(),
                Some(format!("{}, read as its JSON text", kind(other))),
            ),
        }
    }

    /// gjson `Int()`.
    pub fn int(&self, show: bool) -> Read<i64> {
        match &self.0 {
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    (i, None)
                } else if let Some(u) = n.as_u64() {
                    // Beyond i64: gjson parses the digits into an int64 that wraps.
                    let i = u as i64;
                    (
                        i,
                        Some(format!(
                            "too large for a 64-bit integer, read as{}",
                            shown(true, i)
                        )),
                    )
                } else {
                    let f = n.as_f64().unwrap_or(0.0);
                    let i = f.trunc() as i64;
                    // `6379.0` is an integer to Go too; only a real fraction is worth a note.
                    let note = (f.fract() != 0.0)
                        .then(|| format!("not an integer, truncated to{}", shown(show, i)));
                    (i, note)
                }
            }
            Value::String(s) => match parse_go_int(s) {
                Some(i) => (
                    i,
                    Some(format!("a string, read as the number{}", shown(show, i))),
                ),
                None => (0, Some("a string that is not an integer, read as 0".into())),
            },
            Value::Bool(b) => (
                i64::from(*b),
                Some(format!("a boolean, read as {}", i64::from(*b))),
            ),
            other => (0, Some(format!("{}, read as 0", kind(other)))),
        }
    }

    /// gjson `Float()`.
    pub fn float(&self, show: bool) -> Read<f64> {
        match &self.0 {
            Value::Number(n) => (n.as_f64().unwrap_or(0.0), None),
            Value::String(s) => match s.parse::<f64>() {
                Ok(f) => (
                    f,
                    Some(format!("a string, read as the number{}", shown(show, f))),
                ),
                Err(_) => (0.0, Some("a string that is not a number, read as 0".into())),
            },
            Value::Bool(b) => {
                let f = if *b { 1.0 } else { 0.0 };
                (f, Some(format!("a boolean, read as {f}")))
            }
            other => (0.0, Some(format!("{}, read as 0", kind(other)))),
        }
    }

    /// gjson `Bool()`.
    pub fn bool(&self) -> Read<bool> {
        match &self.0 {
            Value::Bool(b) => (*b, None),
            Value::String(s) => match s.to_ascii_lowercase().as_str() {
                "1" | "t" | "true" => (true, Some("a string, read as true".into())),
                "0" | "f" | "false" => (false, Some("a string, read as false".into())),
                _ => (
                    false,
                    Some(
                        "a string that is not a boolean (1, t, true, 0, f, false), read as false"
                            .into(),
                    ),
                ),
            },
            Value::Number(n) => {
                let b = n.as_f64().is_some_and(|f| f != 0.0);
                (b, Some(format!("a number, read as {b}")))
            }
            other => (false, Some(format!("{}, read as false", kind(other)))),
        }
    }

    /// gjson `Array()`: a scalar or an object is a one-item list, `null` an empty one.
    pub fn array(&self) -> Read<Vec<Go>> {
        match &self.0 {
            Value::Array(items) => (items.iter().cloned().map(Go).collect(), None),
            Value::Null => (Vec::new(), Some("null, read as an empty list".into())),
            other => (
                vec![Go(other.clone())],
                Some(format!(
                    "{} instead of a list, read as a one-item list",
                    kind(other)
                )),
            ),
        }
    }

    /// gjson `IsArray()`.
    pub fn is_array(&self) -> bool {
        matches!(self.0, Value::Array(_))
    }

    /// gjson `Get(key)` on this value: a field of an object; nothing for anything else.
    pub fn get(&self, key: &str) -> Option<Go> {
        match &self.0 {
            Value::Object(m) => m.get(key).cloned().map(Go),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        self.0.is_null()
    }
}

/// gjson's text of a number: integers as written, anything else in Go's shortest `'f'`
/// formatting, which Rust's `Display` for `f64` matches (no exponent, shortest round trip).
pub fn number_text(n: &serde_json::Number) -> String {
    if n.is_i64() || n.is_u64() {
        n.to_string()
    } else {
        format!("{}", n.as_f64().unwrap_or(0.0))
    }
}

/// gjson's `parseInt`: an optional `-` then digits only (no `+`, no spaces, no fraction),
/// accumulated in a wrapping int64 as Go does.
pub fn parse_go_int(s: &str) -> Option<i64> {
    let (negative, digits) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = digits.bytes().fold(0i64, |n, b| {
        n.wrapping_mul(10).wrapping_add(i64::from(b - b'0'))
    });
    Some(if negative { n.wrapping_neg() } else { n })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn go(v: Value) -> Go {
        Go(v)
    }

    #[test]
    fn string_reads_like_gjson() {
        assert_eq!(go(json!("x")).string(true), ("x".into(), None));
        assert_eq!(go(json!(123456)).string(true).0, "123456");
        assert_eq!(go(json!(1.50)).string(true).0, "1.5");
        assert_eq!(go(json!(1e3)).string(true).0, "1000");
        assert_eq!(go(json!(-7)).string(true).0, "-7");
        assert_eq!(go(json!(true)).string(true).0, "true");
        assert_eq!(go(json!(null)).string(true).0, "");
        assert_eq!(go(json!([1, "a"])).string(true).0, "[1,\"a\"]");
        // A secret's note never holds its value.
        let (_, note) = go(json!(123456)).string(false);
        assert!(!note.unwrap().contains("123456"));
    }

    #[test]
    fn int_reads_like_gjson() {
        assert_eq!(go(json!(6379)).int(true), (6379, None));
        assert_eq!(go(json!("6379")).int(true).0, 6379);
        assert_eq!(go(json!("-5")).int(true).0, -5);
        for s in ["1.5", " 3", "+3", "1e3", "", "-", "abc"] {
            assert_eq!(go(json!(s)).int(true).0, 0, "{s}");
        }
        assert_eq!(go(json!(69.9)).int(true).0, 69);
        assert_eq!(go(json!(6379.0)).int(true), (6379, None));
        assert_eq!(go(json!(-1.9)).int(true).0, -1);
        assert_eq!(go(json!(true)).int(true).0, 1);
        assert_eq!(go(json!(null)).int(true).0, 0);
        assert_eq!(go(json!({"a": 1})).int(true).0, 0);
        assert_eq!(go(json!(u64::MAX)).int(true).0, -1);
        assert_eq!(parse_go_int("9223372036854775808"), Some(i64::MIN));
    }

    #[test]
    fn float_bool_and_array_read_like_gjson() {
        assert_eq!(go(json!("0.6")).float(true).0, 0.6);
        assert_eq!(go(json!("1e3")).float(true).0, 1000.0);
        assert!(go(json!("inf")).float(true).0.is_infinite());
        assert_eq!(go(json!("x")).float(true).0, 0.0);
        assert_eq!(go(json!(null)).float(true).0, 0.0);
        assert_eq!(go(json!(true)).float(true).0, 1.0);
        for (v, b) in [
            (json!("TRUE"), true),
            (json!("t"), true),
            (json!("1"), true),
            (json!("yes"), false),
            (json!(2), true),
            (json!(0), false),
            (json!(null), false),
        ] {
            assert_eq!(go(v.clone()).bool().0, b, "{v}");
        }
        assert_eq!(go(json!("a")).array().0, vec![go(json!("a"))]);
        assert_eq!(go(json!(null)).array().0, vec![]);
        assert_eq!(go(json!([1, 2])).array().0.len(), 2);
        assert!(go(json!([1, 2])).array().1.is_none());
    }
}
