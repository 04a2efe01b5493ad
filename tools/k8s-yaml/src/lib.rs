//! YAML read as Kubernetes tooling reads it. `kubectl apply`, Helm and Argo CD turn a manifest
//! into JSON with `sigs.k8s.io/yaml`, which is go-yaml v2: YAML 1.1. So an unquoted `yes`,
//! `on` or `off` is a boolean there, `6_379` is the integer 6379, `0755` is octal, and a merge
//! key (`<<: *base`) copies the anchored mapping's keys in. A YAML 1.2 reader (most libraries
//! today, serde_yaml among them) takes the first four as text and keeps a key named `<<`.
//!
//! [`documents`] gives each document's JSON as Kubernetes gets it, with a [`Note`] wherever a
//! YAML 1.2 reader would read a different value. Resolution follows go-yaml v2's `resolve()`
//! (resolve.go) and its decoder's merge (decode.go: keys are set in order, a later one wins;
//! in a sequence of merged mappings the earlier ones win).

use serde_json::{Map, Number, Value};
use std::collections::HashMap;
use yaml_rust2::parser::{Event, Parser, Tag};
use yaml_rust2::scanner::TScalarStyle;

/// Where a YAML 1.2 reader would differ from Kubernetes' reading.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    /// The value's place, e.g. `spec.defaultConfig.lb_config.servicePort`.
    pub path: String,
    pub message: String,
}

/// One document: its JSON as Kubernetes tooling gets it, and the notes.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    pub value: Value,
    pub notes: Vec<Note>,
}

#[derive(Debug, Clone)]
enum Node {
    /// A scalar's text; `plain` when unquoted (only plain scalars are resolved).
    Scalar {
        text: String,
        plain: bool,
        tag: Option<String>,
    },
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

/// Every document of `text`, in order (empty documents are skipped).
pub fn documents(text: &str) -> Result<Vec<Document>, String> {
    let mut parser = Parser::new_from_str(text);
    let mut anchors: HashMap<usize, Node> = HashMap::new();
    // Open collections: (anchor id, node being built, a map key waiting for its value).
    let mut stack: Vec<(usize, Node, Option<Node>)> = Vec::new();
    let mut docs = Vec::new();
    loop {
        let (event, mark) = parser.next_token().map_err(|e| e.to_string())?;
        let done: Option<(usize, Node)> = match event {
            Event::StreamEnd => break,
            Event::Scalar(text, style, anchor, tag) => Some((
                anchor,
                Node::Scalar {
                    text,
                    plain: style == TScalarStyle::Plain,
                    tag: tag.map(|t| tag_name(&t)),
                },
            )),
            Event::Alias(id) => match anchors.get(&id) {
                Some(n) => Some((0, n.clone())),
                None => return Err(format!("line {}: unknown alias", mark.line())),
            },
            Event::SequenceStart(anchor, _) => {
                stack.push((anchor, Node::Seq(Vec::new()), None));
                None
            }
            Event::MappingStart(anchor, _) => {
                stack.push((anchor, Node::Map(Vec::new()), None));
                None
            }
            Event::SequenceEnd | Event::MappingEnd => stack.pop().map(|(a, n, _)| (a, n)),
            _ => None,
        };
        let Some((anchor, node)) = done else {
            continue;
        };
        if anchor > 0 {
            anchors.insert(anchor, node.clone());
        }
        match stack.last_mut() {
            Some((_, Node::Seq(items), _)) => items.push(node),
            Some((_, Node::Map(pairs), key)) => match key.take() {
                Some(k) => pairs.push((k, node)),
                None => *key = Some(node),
            },
            Some((_, Node::Scalar { .. }, _)) => {}
            None => {
                let mut notes = Vec::new();
                let value = to_json(&node, "", &mut notes)?;
                if !value.is_null() {
                    docs.push(Document { value, notes });
                }
            }
        }
    }
    Ok(docs)
}

fn tag_name(t: &Tag) -> String {
    format!("{}{}", t.handle, t.suffix)
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn to_json(node: &Node, path: &str, notes: &mut Vec<Note>) -> Result<Value, String> {
    match node {
        Node::Scalar { text, plain, tag } => Ok(scalar(text, *plain, tag.as_deref(), path, notes)),
        Node::Seq(items) => items
            .iter()
            .enumerate()
            .map(|(i, n)| to_json(n, &format!("{path}[{i}]"), notes))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        Node::Map(pairs) => {
            let mut out = Map::new();
            for (k, v) in pairs {
                if is_merge(k) {
                    merge(v, path, &mut out, notes)?;
                    continue;
                }
                let key = key_text(k, path, notes)?;
                let value = to_json(v, &child(path, &key), notes)?;
                out.insert(key, value);
            }
            Ok(Value::Object(out))
        }
    }
}

fn is_merge(k: &Node) -> bool {
    matches!(k, Node::Scalar { text, plain: true, tag: None } if text == "<<")
}

/// go-yaml v2's merge: a mapping's keys are set into `out`; of a sequence of mappings, the
/// earlier ones win.
fn merge(
    v: &Node,
    path: &str,
    out: &mut Map<String, Value>,
    notes: &mut Vec<Note>,
) -> Result<(), String> {
    let maps: Vec<&Node> = match v {
        Node::Map(_) => vec![v],
        Node::Seq(items) => items.iter().rev().collect(),
        Node::Scalar { .. } => {
            return Err(format!(
                "{}: a merge key needs a mapping",
                child(path, "<<")
            ))
        }
    };
    for m in maps {
        match to_json(m, path, notes)? {
            Value::Object(fields) => {
                notes.push(Note {
                    path: child(path, "<<"),
                    message: format!(
                        "the merge key copies in {}; a YAML 1.2 reader without merge keys keeps \
                         a key named `<<` instead",
                        fields
                            .keys()
                            .map(|k| format!("`{k}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
                out.extend(fields);
            }
            _ => {
                return Err(format!(
                    "{}: a merge key needs a mapping",
                    child(path, "<<")
                ))
            }
        }
    }
    Ok(())
}

/// A mapping key as JSON text (sigs.k8s.io/yaml turns non-string keys into their text).
fn key_text(k: &Node, path: &str, notes: &mut Vec<Note>) -> Result<String, String> {
    match to_json(k, path, notes)? {
        Value::String(s) => Ok(s),
        Value::Null => Ok("null".into()),
        other @ (Value::Bool(_) | Value::Number(_)) => Ok(other.to_string()),
        _ => Err(format!("{path}: a mapping key must be a scalar")),
    }
}

fn scalar(text: &str, plain: bool, tag: Option<&str>, path: &str, notes: &mut Vec<Note>) -> Value {
    if !plain || tag.is_some_and(|t| t == "!!str" || t == "tag:yaml.org,2002:str") {
        return Value::String(text.to_string());
    }
    let (v11, v12) = (resolve_yaml11(text), resolve_yaml12(text));
    if v11 != v12 {
        notes.push(Note {
            path: path.to_string(),
            message: format!(
                "`{text}` is {} to Kubernetes tooling (YAML 1.1: kubectl, Helm, Argo CD); a YAML \
                 1.2 reader takes {}",
                describe(&v11),
                describe(&v12)
            ),
        });
    }
    v11
}

fn describe(v: &Value) -> String {
    match v {
        Value::String(s) => format!("the text \"{s}\""),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Null => "null".into(),
        Value::Number(n) => format!("the number {n}"),
        other => other.to_string(),
    }
}

/// go-yaml v2's resolution of a plain scalar (resolve.go).
pub fn resolve_yaml11(s: &str) -> Value {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true" | "True" | "TRUE" => {
            return Value::Bool(true)
        }
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "false" | "False" | "FALSE" => {
            return Value::Bool(false)
        }
        _ => {}
    }
    // Only these first characters start a number (resolve.go's hint table).
    if !s.starts_with(|c: char| c.is_ascii_digit() || "+-.".contains(c)) {
        return Value::String(s.to_string());
    }
    let plain = s.replace('_', "");
    if let Some(i) = go_parse_int(&plain) {
        return Value::Number(i.into());
    }
    if is_yaml_style_float(&plain) {
        if let Some(n) = plain.parse::<f64>().ok().and_then(Number::from_f64) {
            return Value::Number(n);
        }
    }
    Value::String(s.to_string())
}

/// Go's `strconv.ParseInt(s, 0, 64)`: optional sign, then `0x`, `0o`, `0b` or a leading `0`
/// (octal) prefix, else decimal.
fn go_parse_int(s: &str) -> Option<i64> {
    let (neg, body) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..])
    } else {
        (10, lower.as_str())
    };
    if digits.is_empty() || digits.starts_with(['+', '-']) {
        return None;
    }
    let magnitude = i128::from_str_radix(digits, radix).ok()?;
    i64::try_from(if neg { -magnitude } else { magnitude }).ok()
}

/// resolve.go's `yamlStyleFloat`: `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn is_yaml_style_float(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some(("", frac)) => digits(frac),
        Some((int, frac)) => digits(int) && (frac.is_empty() || digits(frac)),
        None => digits(mantissa),
    };
    let exponent_ok = exponent.is_none_or(|e| digits(e.strip_prefix(['+', '-']).unwrap_or(e)));
    mantissa_ok && exponent_ok
}

/// The YAML 1.2 core schema's resolution (what serde_yaml and most current libraries do).
pub fn resolve_yaml12(s: &str) -> Value {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        _ => {}
    }
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    let int = if let Some(h) = s.strip_prefix("0x") {
        i64::from_str_radix(h, 16).ok()
    } else if let Some(o) = s.strip_prefix("0o") {
        i64::from_str_radix(o, 8).ok()
    } else if !unsigned.is_empty() && unsigned.bytes().all(|b| b.is_ascii_digit()) {
        s.parse::<i64>().ok()
    } else {
        None
    };
    if let Some(i) = int {
        return Value::Number(i.into());
    }
    if is_yaml_style_float(s) {
        if let Some(n) = s.parse::<f64>().ok().and_then(Number::from_f64) {
            return Value::Number(n);
        }
    }
    Value::String(s.to_string())
}

#[cfg(test)]
mod tests;
