//! Messages, content parts, tool calls and tool lists → fields of one block stream.

use super::block::{user_text, Out, KIND_MESSAGE, KIND_TOOLS};
use super::error::{wrong, CanonError};
use super::json::J;

/// Keys never hashed in opaque parts/tools: Anthropic moves its cache breakpoint every turn.
const SKIP_PART_KEYS: &[&str] = &["cache_control"];

pub(super) fn response_item(
    out: &mut Out,
    item: &J,
    anthropic: &mut bool,
) -> Result<(), CanonError> {
    let typ = match item {
        J::Str(text) => {
            user_text(out, text);
            return Ok(());
        }
        J::Obj(_) => item.get("type").and_then(J::as_str),
        other => return Err(wrong("", "an object or a string", other)),
    };
    match typ {
        None | Some("message") => message(out, item, anthropic),
        Some("function_call") => {
            out.begin(KIND_MESSAGE);
            out.field(b'r', b"assistant");
            out.field(b'c', req_str(item, "name")?.as_bytes());
            arguments(out, item.get("arguments"));
            out.end_block();
            Ok(())
        }
        Some("function_call_output") => {
            out.begin(KIND_MESSAGE);
            out.field(b'r', b"tool");
            out.field(b'i', req_str(item, "call_id")?.as_bytes());
            content(out, item.get("output"), anthropic).map_err(|e| e.within("output"))?;
            out.end_block();
            Ok(())
        }
        Some(_) => {
            out.begin(KIND_MESSAGE);
            out.field_json(b'j', item, SKIP_PART_KEYS);
            out.end_block();
            Ok(())
        }
    }
}

pub(super) fn tools_block(out: &mut Out, tools: Option<&J>) -> Result<(), CanonError> {
    let tools = match tools {
        None | Some(J::Null) => return Ok(()),
        Some(J::Arr(tools)) if tools.is_empty() => return Ok(()),
        Some(J::Arr(tools)) => tools,
        Some(other) => return Err(wrong("tools", "an array", other)),
    };
    out.begin(KIND_TOOLS);
    for (i, tool) in tools.iter().enumerate() {
        if !matches!(tool, J::Obj(_)) {
            return Err(wrong(&format!("tools[{i}]"), "an object", tool));
        }
        out.field_json(b'j', tool, SKIP_PART_KEYS);
    }
    out.end_block();
    Ok(())
}

/// One chat / Anthropic message or Responses message item → one block (or its pieces).
pub(super) fn message(out: &mut Out, m: &J, anthropic: &mut bool) -> Result<(), CanonError> {
    if !matches!(m, J::Obj(_)) {
        return Err(wrong("", "an object", m));
    }
    let role = req_str(m, "role")?;
    out.begin(KIND_MESSAGE);
    out.field(b'r', role.as_bytes());
    for (key, tag) in [("name", b'n'), ("tool_call_id", b'i')] {
        match m.get_present(key) {
            None => {}
            Some(J::Str(s)) => out.field(tag, s.as_bytes()),
            Some(other) => return Err(wrong(key, "a string", other)),
        }
    }
    content(out, m.get("content"), anthropic).map_err(|e| e.within("content"))?;
    match m.get_present("tool_calls") {
        None => {}
        Some(J::Arr(calls)) => {
            for (i, call) in calls.iter().enumerate() {
                tool_call(out, call).map_err(|e| e.within(&format!("tool_calls[{i}]")))?;
            }
        }
        Some(other) => return Err(wrong("tool_calls", "an array", other)),
    }
    // Legacy (pre-tools) assistant `function_call`.
    if let Some(f) = m.get_present("function_call") {
        function(out, f).map_err(|e| e.within("function_call"))?;
    }
    out.end_block();
    Ok(())
}

fn tool_call(out: &mut Out, call: &J) -> Result<(), CanonError> {
    if !matches!(call, J::Obj(_)) {
        return Err(wrong("", "an object", call));
    }
    match call.get_present("function") {
        Some(f) => function(out, f).map_err(|e| e.within("function")),
        None => {
            out.field_json(b'u', call, &["id"]);
            Ok(())
        }
    }
}

fn function(out: &mut Out, f: &J) -> Result<(), CanonError> {
    if !matches!(f, J::Obj(_)) {
        return Err(wrong("", "an object", f));
    }
    out.field(b'c', req_str(f, "name")?.as_bytes());
    arguments(out, f.get("arguments"));
    Ok(())
}

/// Tool-call arguments: a JSON string is re-encoded canonically when it parses (so key order
/// and whitespace inside it do not matter), else hashed verbatim; a JSON value is encoded
/// canonically. Canonical JSON and unparsable text never coincide, so this stays injective.
fn arguments(out: &mut Out, args: Option<&J>) {
    match args {
        None | Some(J::Null) => out.field(b'a', b""),
        Some(J::Str(s)) => match serde_json::from_str::<J>(s) {
            Ok(parsed) => out.field_json(b'a', &parsed, &[]),
            Err(_) => out.field(b'a', s.as_bytes()),
        },
        Some(value) => out.field_json(b'a', value, &[]),
    }
}

/// `content`: absent/null → nothing, string → one text part, array → its parts.
pub(super) fn content(
    out: &mut Out,
    c: Option<&J>,
    anthropic: &mut bool,
) -> Result<(), CanonError> {
    match c {
        None | Some(J::Null) => Ok(()),
        Some(J::Str(s)) => {
            out.field(b't', s.as_bytes());
            Ok(())
        }
        Some(J::Arr(parts)) => {
            for (i, p) in parts.iter().enumerate() {
                part(out, p, anthropic).map_err(|e| e.within(&format!("[{i}]")))?;
            }
            Ok(())
        }
        Some(other) => Err(wrong("", "a string, an array or null", other)),
    }
}

fn part(out: &mut Out, p: &J, anthropic: &mut bool) -> Result<(), CanonError> {
    let typ = match p {
        J::Str(s) => {
            out.field(b't', s.as_bytes());
            return Ok(());
        }
        J::Obj(_) => p.get("type").and_then(J::as_str),
        other => return Err(wrong("", "an object or a string", other)),
    };
    match typ {
        Some("text" | "input_text" | "output_text") => {
            out.field(b't', req_str(p, "text")?.as_bytes());
        }
        Some("tool_use") => {
            *anthropic = true;
            out.field(b'c', req_str(p, "name")?.as_bytes());
            match p.get("input") {
                None => out.field(b'a', b"{}"),
                Some(input) => out.field_json(b'a', input, &[]),
            }
        }
        Some("tool_result") => {
            *anthropic = true;
            match p.get_present("tool_use_id") {
                None => out.field(b'R', b""),
                Some(J::Str(id)) => out.field(b'R', id.as_bytes()),
                Some(other) => return Err(wrong("tool_use_id", "a string", other)),
            }
            if matches!(p.get("is_error"), Some(J::Bool(true))) {
                out.field(b'e', b"");
            }
            content(out, p.get("content"), anthropic).map_err(|e| e.within("content"))?;
            out.field(b'E', b"");
        }
        Some(t) => {
            if matches!(t, "thinking" | "redacted_thinking" | "document")
                || (t == "image" && p.get("source").is_some())
            {
                *anthropic = true;
            }
            out.field_json(b'j', p, SKIP_PART_KEYS);
        }
        None => out.field_json(b'j', p, SKIP_PART_KEYS),
    }
    Ok(())
}

fn req_str<'j>(v: &'j J, key: &str) -> Result<&'j str, CanonError> {
    match v.get(key) {
        Some(J::Str(s)) => Ok(s.as_ref()),
        None => Err(CanonError::MissingField {
            path: key.to_owned(),
        }),
        Some(other) => Err(wrong(key, "a string", other)),
    }
}
