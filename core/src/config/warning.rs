//! Leniency notices. Where the parser accepts what Higress's Go plugin accepts but a strict
//! reader would not (a number given as a string, a zero meaning "default", an unknown key), it
//! says so: one warning per field path per config load, naming what was assumed. Values of
//! secret fields are never quoted (docs/compatibility.md).

use std::fmt;

/// One notice: the field's full path and what the parser assumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// Dotted path, e.g. `_rules_[1].lb_config.servicePort`; empty for the whole config.
    pub path: String,
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// The warnings of one config load, at most one per path (the first one said is kept).
#[derive(Debug, Default)]
pub struct Warnings {
    list: Vec<Warning>,
}

impl Warnings {
    pub fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        use super::error::{clamp, elide_composites, MAX_PATH, MAX_PROBLEM};
        let path = clamp(path.into(), MAX_PATH);
        if self.list.iter().all(|w| w.path != path) {
            self.list.push(Warning {
                path,
                message: clamp(elide_composites(message.into()), MAX_PROBLEM),
            });
        }
    }

    pub fn into_vec(self) -> Vec<Warning> {
        self.list
    }
}

/// `path.key`, or `key` at the top.
pub fn join(path: &str, key: &str) -> String {
    if key.is_empty() {
        path.to_string()
    } else if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// The known key closest to `key` (case-insensitive edit distance), if close enough to be a
/// likely misspelling: at most a third of the key's length, and at least 2 edits allowed.
pub fn nearest<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    let key_l = key.to_ascii_lowercase();
    let limit = (key.chars().count() / 3).max(2);
    known
        .iter()
        .map(|k| (edit_distance(&key_l, &k.to_ascii_lowercase()), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diag + usize::from(ca != *cb));
            diag = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_keys_only() {
        let known = ["leaseTTL", "lb_config", "maxRequestCount", "servicePort"];
        assert_eq!(nearest("leaseTtl", &known), Some("leaseTTL"));
        assert_eq!(nearest("lease_ttl", &known), Some("leaseTTL"));
        assert_eq!(nearest("lbconfig", &known), Some("lb_config"));
        assert_eq!(nearest("maxRequestCnt", &known), Some("maxRequestCount"));
        assert_eq!(nearest("criticalModels", &known), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
    }

    #[test]
    fn one_warning_per_path() {
        let mut w = Warnings::default();
        w.push("a.b", "first");
        w.push("a.b", "second");
        w.push("a.c", "other");
        let v = w.into_vec();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].to_string(), "a.b: first");
    }
}
