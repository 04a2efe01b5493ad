//! A deliberately small reader of Prometheus text, for tests: it checks the shape of every line
//! of a `/metrics` page (the fake's own, or a real engine's sample).

/// A deliberately small Prometheus text checker used by tests: every non-comment line must be
/// `name{labels} value` or `name value` with a float value; returns `(name, labels, value)`.
pub fn parse_text(text: &str) -> Result<Vec<(String, String, f64)>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let rest = rest.trim_start();
            if !(rest.starts_with("HELP ") || rest.starts_with("TYPE ")) {
                continue; // plain comment
            }
            if rest.starts_with("TYPE ") {
                let kind = rest.split_whitespace().nth(2).unwrap_or("");
                if !["gauge", "counter", "histogram", "summary", "untyped"].contains(&kind) {
                    return Err(format!("line {}: bad TYPE {kind:?}", i + 1));
                }
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .ok_or_else(|| format!("line {}: no value", i + 1))?;
        let value: f64 = value
            .parse()
            .map_err(|_| format!("line {}: bad value {value:?}", i + 1))?;
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => {
                let labels = rest
                    .strip_suffix('}')
                    .ok_or_else(|| format!("line {}: unclosed labels", i + 1))?;
                (n, labels)
            }
            None => (series, ""),
        };
        let name_ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            && !name.starts_with(|c: char| c.is_ascii_digit());
        if !name_ok {
            return Err(format!("line {}: bad metric name {name:?}", i + 1));
        }
        for pair in split_labels(labels) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| format!("line {}: bad label {pair:?}", i + 1))?;
            if k.is_empty() || !(v.starts_with('"') && v.ends_with('"') && v.len() >= 2) {
                return Err(format!("line {}: bad label {pair:?}", i + 1));
            }
        }
        out.push((name.to_string(), labels.to_string(), value));
    }
    Ok(out)
}

/// Splits `a="x",b="y,z"` at commas outside quotes.
fn split_labels(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut in_q, mut escaped) = (0, false, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => in_q = !in_q,
            ',' if !in_q => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < s.len() {
        parts.push(&s[start..]);
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::GARBAGE;

    #[test]
    fn real_samples_parse_and_garbage_does_not() {
        // shared/ sits beside the repository (CI) or beside the worktrees folder (dev).
        let root = env!("CARGO_MANIFEST_DIR");
        let dirs = [
            format!("{root}/../../../shared/data/metrics"),
            format!("{root}/../../../../shared/data/metrics"),
        ];
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for e in entries.flatten() {
                let text = std::fs::read_to_string(e.path()).unwrap();
                parse_text(&text).unwrap_or_else(|err| panic!("{:?}: {err}", e.path()));
            }
        }
        assert!(parse_text(GARBAGE).is_err());
    }
}
