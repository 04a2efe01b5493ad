//! Byte-level scanning for the Prometheus parser ([`super::prom`]): a cursor over one line and a
//! fast line splitter. Every access is bounds-checked (`get`), nothing here can panic.

use std::fmt;

/// Length of a metric or label name.
pub const MAX_NAME_LEN: usize = 512;
/// Length of one (unescaped) label value.
pub const MAX_LABEL_VALUE_LEN: usize = 16 * 1024;
/// Length of one label value of a family whose labels hold lists: vLLM's
/// `lora_requests_info` joins every adapter with a running or waiting request into one value
/// (docs/model-server-metrics.md §1.1), 1,000 adapters of up to 255 bytes each.
pub const MAX_LIST_LABEL_VALUE_LEN: usize = 256 * 1024;

/// Why a line was skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineError {
    InvalidUtf8,
    BadMetricName,
    NameTooLong,
    BadLabelName,
    MissingEquals,
    MissingQuote,
    UnterminatedLabelValue,
    BadEscape,
    LabelValueTooLong,
    TooManyLabels,
    UnterminatedLabels,
    MissingValue,
    BadValue,
    BadTimestamp,
    TrailingGarbage,
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

pub(super) struct Cursor<'a> {
    pub(super) s: &'a [u8],
    pub(super) i: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    pub(super) fn eat(&mut self, b: u8) -> bool {
        if self.peek() == Some(b) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    /// Eats `word` only if followed by whitespace or end of line.
    pub(super) fn eat_word(&mut self, word: &[u8]) -> bool {
        let end = self.i.saturating_add(word.len());
        if self.s.get(self.i..end) == Some(word)
            && matches!(self.s.get(end), None | Some(b' ' | b'\t'))
        {
            self.i = end;
            true
        } else {
            false
        }
    }

    /// Returns whether anything was skipped.
    pub(super) fn skip_ws(&mut self) -> bool {
        let start = self.i;
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.i += 1;
        }
        self.i > start
    }

    pub(super) fn token(&mut self) -> &'a [u8] {
        let start = self.i;
        while matches!(self.peek(), Some(b) if b != b' ' && b != b'\t') {
            self.i += 1;
        }
        self.s.get(start..self.i).unwrap_or_default()
    }

    pub(super) fn rest_trimmed(&self) -> &'a [u8] {
        self.s.get(self.i..).unwrap_or_default().trim_ascii_end()
    }

    /// `[a-zA-Z_:][a-zA-Z0-9_:]*`
    pub(super) fn metric_name(&mut self) -> Result<&'a str, LineError> {
        self.ident(|b| b.is_ascii_alphabetic() || b == b'_' || b == b':')
            .ok_or(LineError::BadMetricName)
            .and_then(check_len)
    }

    /// `[a-zA-Z_][a-zA-Z0-9_]*`
    pub(super) fn label_name(&mut self) -> Result<&'a str, LineError> {
        self.ident(|b| b.is_ascii_alphabetic() || b == b'_')
            .ok_or(LineError::BadLabelName)
            .and_then(check_len)
    }

    pub(super) fn ident(&mut self, first: impl Fn(u8) -> bool) -> Option<&'a str> {
        let start = self.i;
        if !first(self.peek()?) {
            return None;
        }
        self.i += 1;
        // Metric names may contain ':' after the first byte, label names may not.
        let colon_ok = first(b':');
        while matches!(self.peek(), Some(b) if b.is_ascii_alphanumeric() || b == b'_' || (colon_ok && b == b':'))
        {
            self.i += 1;
        }
        // Only ASCII bytes were accepted, so this cannot fail.
        std::str::from_utf8(self.s.get(start..self.i)?).ok()
    }

    /// Reads an escaped quoted string (a label value, or a Prometheus 3 quoted name) after the
    /// opening quote, through the closing quote; longer than `limit` is
    /// [`LineError::LabelValueTooLong`].
    pub(super) fn label_value(&mut self, limit: usize) -> Result<String, LineError> {
        let rest = self.s.get(self.i..).unwrap_or_default();
        // Fast path: no escapes before the closing quote (the usual case).
        if let Some(end) = find2(rest, b'"', b'\\') {
            if rest.get(end) == Some(&b'"') {
                let raw = rest.get(..end).unwrap_or_default();
                if raw.len() > limit {
                    return Err(LineError::LabelValueTooLong);
                }
                self.i += end + 1;
                return String::from_utf8(raw.to_vec()).map_err(|_| LineError::InvalidUtf8);
            }
        }
        let mut buf = Vec::new();
        loop {
            let b = self.peek().ok_or(LineError::UnterminatedLabelValue)?;
            self.i += 1;
            match b {
                b'"' => break,
                b'\\' => {
                    let e = self.peek().ok_or(LineError::UnterminatedLabelValue)?;
                    self.i += 1;
                    buf.push(match e {
                        b'\\' => b'\\',
                        b'"' => b'"',
                        b'n' => b'\n',
                        // The Go reference parser rejects other escapes; so do we.
                        _ => return Err(LineError::BadEscape),
                    });
                }
                _ => buf.push(b),
            }
            if buf.len() > limit {
                return Err(LineError::LabelValueTooLong);
            }
        }
        String::from_utf8(buf).map_err(|_| LineError::InvalidUtf8)
    }
}

/// Splits on `\n` like `slice::split`, but finds newlines 8 bytes at a time: a byte-at-a-time
/// scan was the largest cost of a filtered parse (most lines are skipped after their name).
pub(super) struct Lines<'a> {
    rest: Option<&'a [u8]>,
}

impl<'a> Lines<'a> {
    pub(super) fn new(input: &'a [u8]) -> Self {
        Self { rest: Some(input) }
    }
}

impl<'a> Iterator for Lines<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = self.rest?;
        match find2(rest, b'\n', b'\n') {
            Some(i) => {
                // Input ending in '\n' yields a final empty line, as `split` does.
                self.rest = rest.get(i + 1..);
                rest.get(..i)
            }
            None => {
                self.rest = None;
                Some(rest)
            }
        }
    }
}

/// Index of the first `a` or `b` in `hay` (SWAR: whole `u64` words, then the tail).
fn find2(hay: &[u8], a: u8, b: u8) -> Option<usize> {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let (ra, rb) = (LO * u64::from(a), LO * u64::from(b));
    let zero_bytes = |v: u64| v.wrapping_sub(LO) & !v & HI;
    let mut chunks = hay.chunks_exact(8);
    let mut base = 0usize;
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word);
        let hits = zero_bytes(x ^ ra) | zero_bytes(x ^ rb);
        if hits != 0 {
            // Exact for the lowest flagged byte: false positives only sit above a true match.
            return Some(base + (hits.trailing_zeros() / 8) as usize);
        }
        base += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&c| c == a || c == b)
        .map(|i| base + i)
}

fn check_len(name: &str) -> Result<&str, LineError> {
    if name.len() > MAX_NAME_LEN {
        Err(LineError::NameTooLong)
    } else {
        Ok(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find2_matches_naive_scan() {
        let hay: Vec<u8> = (0..300u32).map(|i| (i * 37 % 251) as u8).collect();
        for a in [0u8, b'\n', b'"', 200, 255] {
            for start in 0..20 {
                let h = &hay[start..];
                let naive = h.iter().position(|&c| c == a || c == b'\\');
                assert_eq!(find2(h, a, b'\\'), naive, "{a} {start}");
            }
        }
    }

    #[test]
    fn lines_split_like_slice_split() {
        for s in [
            "",
            "a",
            "a\n",
            "\n\n",
            "a\nb",
            "a\r\nb\n\n",
            "12345678\n123456789\n",
        ] {
            let want: Vec<&[u8]> = s.as_bytes().split(|&b| b == b'\n').collect();
            assert_eq!(Lines::new(s.as_bytes()).collect::<Vec<_>>(), want, "{s:?}");
        }
    }
}
