//! cluster_hash's body key (Higress PR #3921 `source: body`): the value at a gjson path in the
//! JSON request body, as gjson's `GetBytes(body, path).String()` gives it. Only the paths gjson
//! reads the same way as plain member and index lookups are taken ([`parse`]); the body is
//! walked over its raw bytes (no tree is built, nothing recurses), so an object's text is
//! hashed exactly as the client sent it, as gjson does.

/// gjson path characters this walker does not evaluate: wildcards, queries, modifiers, pipes,
/// literals and multipaths.
const UNSUPPORTED: &[char] = &['*', '?', '|'];
const UNSUPPORTED_FIRST: &[char] = &['#', '@', '!', '[', '{'];

/// The parts of a gjson path (`a.b.0`, `\.` escaping a dot), or why it is not taken.
pub fn parse(path: &str) -> Result<Vec<String>, String> {
    let refuse = |what: &str| {
        Err(format!(
            "{what}: gjson syntax this plugin does not evaluate (wildcards, `#` queries, \
             modifiers, pipes, literals, multipaths); name the field by plain keys and array \
             indexes"
        ))
    };
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    let mut chars = path.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(n) => {
                    cur.push(n);
                    escaped = true;
                }
                None => return Err("it ends in a lone `\\`".into()),
            },
            '.' => {
                if cur.is_empty() && !escaped {
                    return Err("it has an empty part".into());
                }
                parts.push(std::mem::take(&mut cur));
                escaped = false;
            }
            c if UNSUPPORTED.contains(&c) => return refuse(&format!("`{c}`")),
            c if cur.is_empty() && !escaped && UNSUPPORTED_FIRST.contains(&c) => {
                return refuse(&format!("a part starting with `{c}`"))
            }
            c => cur.push(c),
        }
    }
    if cur.is_empty() && !escaped {
        return Err("it has an empty part".into());
    }
    parts.push(cur);
    Ok(parts)
}

/// The value at `path` in `body` as gjson's `String()` gives it: a string's text, a number as
/// written when it is an integer (else Go's shortest `'f'` form), `true` / `false`, an object's
/// or array's raw text; `None` for null, a missing member, or a body that is not JSON there.
pub fn lookup(body: &[u8], path: &[String]) -> Option<Vec<u8>> {
    let mut v = value_at(body, skip_ws(body, 0))?;
    for part in path {
        v = match v.first()? {
            b'{' => member(v, part)?,
            b'[' => item(v, part)?,
            _ => return None,
        };
    }
    text(v)
}

fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while s
        .get(i)
        .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        i += 1;
    }
    i
}

/// The raw span of the value starting at `i` (strings, nested objects and arrays skipped by
/// counting brackets outside strings).
fn value_at(s: &[u8], i: usize) -> Option<&[u8]> {
    let end = match *s.get(i)? {
        b'"' => string_end(s, i)?,
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match *s.get(j)? {
                    b'"' => j = string_end(s, j)?,
                    b'{' | b'[' => {
                        depth += 1;
                        j += 1;
                    }
                    b'}' | b']' => {
                        depth -= 1;
                        j += 1;
                        if depth == 0 {
                            break j;
                        }
                    }
                    _ => j += 1,
                }
            }
        }
        _ => {
            let mut j = i;
            while s
                .get(j)
                .is_some_and(|b| !matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
            {
                j += 1;
            }
            if j == i {
                return None;
            }
            j
        }
    };
    s.get(i..end)
}

/// Index just past the string starting at `i` (its opening quote).
fn string_end(s: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        match *s.get(j)? {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
}

/// The first member `key` of object `v` (gjson takes the first of duplicates).
fn member<'a>(v: &'a [u8], key: &str) -> Option<&'a [u8]> {
    let mut i = skip_ws(v, 1);
    if v.get(i) == Some(&b'}') {
        return None;
    }
    loop {
        let k = value_at(v, i).filter(|k| k.first() == Some(&b'"'))?;
        i = skip_ws(v, i + k.len());
        if v.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(v, i + 1);
        let val = value_at(v, i)?;
        if key_is(k, key) {
            return Some(val);
        }
        i = skip_ws(v, i + val.len());
        match v.get(i)? {
            b',' => i = skip_ws(v, i + 1),
            _ => return None,
        }
    }
}

/// Whether the raw JSON string `raw` (quotes included) is `key`.
fn key_is(raw: &[u8], key: &str) -> bool {
    let inner = raw.get(1..raw.len().saturating_sub(1)).unwrap_or_default();
    if !inner.contains(&b'\\') {
        return inner == key.as_bytes();
    }
    serde_json::from_slice::<String>(raw).is_ok_and(|k| k == key)
}

/// Item `index` of array `v` (the part must be all digits, as gjson reads an index).
fn item<'a>(v: &'a [u8], index: &str) -> Option<&'a [u8]> {
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: usize = index.parse().ok()?;
    let mut i = skip_ws(v, 1);
    for at in 0.. {
        if v.get(i) == Some(&b']') {
            return None;
        }
        let val = value_at(v, i)?;
        if at == n {
            return Some(val);
        }
        i = skip_ws(v, i + val.len());
        match v.get(i)? {
            b',' => i = skip_ws(v, i + 1),
            _ => return None,
        }
    }
    None
}

/// gjson's `String()` of a raw value (`None` for null or text that is no JSON value).
fn text(v: &[u8]) -> Option<Vec<u8>> {
    match *v.first()? {
        b'"' => serde_json::from_slice::<String>(v)
            .ok()
            .map(String::into_bytes),
        b'{' | b'[' => Some(v.to_vec()),
        _ if v == b"true" || v == b"false" => Some(v.to_vec()),
        _ if v == b"null" => None,
        _ => {
            let digits = v.strip_prefix(b"-").unwrap_or(v);
            let n: f64 = std::str::from_utf8(v).ok()?.parse().ok()?;
            if !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) {
                Some(v.to_vec())
            } else {
                Some(format!("{n}").into_bytes())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(body: &str, path: &str) -> Option<String> {
        let p = parse(path).unwrap();
        lookup(body.as_bytes(), &p).map(|v| String::from_utf8(v).unwrap())
    }

    #[test]
    fn paths_parse_as_gjson_reads_plain_ones() {
        assert_eq!(
            parse("callOptions.stickySessionId").unwrap(),
            vec!["callOptions", "stickySessionId"]
        );
        assert_eq!(parse(r"a\.b.c").unwrap(), vec!["a.b", "c"]);
        assert_eq!(
            parse("messages.0.content").unwrap(),
            vec!["messages", "0", "content"]
        );
        for bad in [
            "a.*", "a?", "a|b", "a.#", "#.x", "@reverse", "a..b", "a.", "!true", "[a,b]",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert_eq!(parse(r"a.\#").unwrap(), vec!["a", "#"]);
    }

    #[test]
    fn values_read_as_gjson_string() {
        let body = r#"{"callOptions": {"stickySessionId": "s-1", "n": 42, "f": 1.50, "e": 1e3,
            "neg": -7, "b": true, "z": null, "o": {"k": [1, 2]}, "esc": "a\"b\u00e9"},
            "messages": [{"content": "hi"}, {"content": "there"}], "dup": 1, "dup": 2,
            "we\"ird": "w"}"#;
        assert_eq!(
            get(body, "callOptions.stickySessionId").as_deref(),
            Some("s-1")
        );
        assert_eq!(get(body, "callOptions.n").as_deref(), Some("42"));
        assert_eq!(get(body, "callOptions.f").as_deref(), Some("1.5"));
        assert_eq!(get(body, "callOptions.e").as_deref(), Some("1000"));
        assert_eq!(get(body, "callOptions.neg").as_deref(), Some("-7"));
        assert_eq!(get(body, "callOptions.b").as_deref(), Some("true"));
        assert_eq!(get(body, "callOptions.z"), None);
        assert_eq!(
            get(body, "callOptions.o").as_deref(),
            Some(r#"{"k": [1, 2]}"#),
            "raw text"
        );
        assert_eq!(get(body, "callOptions.o.k.1").as_deref(), Some("2"));
        assert_eq!(get(body, "callOptions.esc").as_deref(), Some("a\"b\u{e9}"));
        assert_eq!(get(body, "messages.1.content").as_deref(), Some("there"));
        assert_eq!(get(body, "messages.2.content"), None);
        assert_eq!(get(body, "messages.x"), None);
        assert_eq!(
            get(body, "dup").as_deref(),
            Some("1"),
            "the first, as gjson"
        );
        assert_eq!(get(body, r#"we"ird"#).as_deref(), Some("w"));
        assert_eq!(get(body, "callOptions.stickySessionId.x"), None);
        for junk in [
            "",
            "{",
            "{\"a\":",
            "[1,",
            "not json",
            "{\"callOptions\":{\"stickySessionId\":\"s",
        ] {
            assert_eq!(get(junk, "callOptions.stickySessionId"), None, "{junk}");
        }
        // A deep body is walked without recursion.
        let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(get(&deep, "0.0").as_deref().map(str::len), Some(199_997));
    }
}
