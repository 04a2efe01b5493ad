//! Byte-string searches for the texts the plugin reads without parsing them whole (a response's
//! usage tail and SSE events, a host's metrics page as it sits in the host list's JSON).

/// Where the first `needle` in `hay` starts.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Where the last `needle` in `hay` starts.
pub fn rfind(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > hay.len() {
        return None;
    }
    (0..=hay.len() - needle.len())
        .rev()
        .find(|&i| hay.get(i..i + needle.len()) == Some(needle))
}

/// `s` without its leading ASCII whitespace.
pub fn skip_ws(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|b| b.is_ascii_whitespace()).count();
    s.get(n..).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_first_and_the_last_occurrence() {
        assert_eq!(find(b"a usage usage", b"usage"), Some(2));
        assert_eq!(rfind(b"a usage usage", b"usage"), Some(8));
        assert_eq!((find(b"ab", b"abc"), rfind(b"ab", b"abc")), (None, None));
        assert_eq!((find(b"ab", b""), rfind(b"ab", b"")), (None, None));
        assert_eq!(skip_ws(b" \n\t:x"), b":x");
        assert_eq!(skip_ws(b"  "), b"");
    }
}
