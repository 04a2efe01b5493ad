//! cluster_hash's cookie key (Higress PR #3921 `source: cookie`): a cookie's value exactly as
//! Go's `http.Request.Cookie` reads it from the `Cookie` header (`net/http` `readCookies`,
//! `parseCookieValue`), so a cookie sends each user to the cluster Go would.

/// The value of the first cookie `name` in a `Cookie` header that Go reads as valid: pairs
/// split at `;` and trimmed, a pair without `=` is a cookie with an empty value, the name must
/// be an HTTP token, a value in double quotes loses them, and a value with a byte outside
/// `0x20..0x7e` or a `"`, `;` or `\` is skipped. `None` when there is none.
pub fn go_cookie(header: &[u8], name: &str) -> Option<Vec<u8>> {
    if name.is_empty() {
        return None;
    }
    for part in header.split(|&b| b == b';') {
        let part = trim(part);
        if part.is_empty() {
            continue;
        }
        let (n, v) = match part.iter().position(|&b| b == b'=') {
            Some(i) => (
                part.get(..i).unwrap_or_default(),
                part.get(i + 1..).unwrap_or_default(),
            ),
            None => (part, &[][..]),
        };
        let n = trim(n);
        if n.is_empty() || !n.iter().all(|&b| is_token(b)) || n != name.as_bytes() {
            continue;
        }
        let v = match v {
            [b'"', inner @ .., b'"'] => inner,
            _ => v,
        };
        if v.iter()
            .all(|&b| (0x20..0x7f).contains(&b) && !matches!(b, b'"' | b';' | b'\\'))
        {
            return Some(v.to_vec());
        }
    }
    None
}

/// Go's `textproto.TrimString`: ASCII spaces, tabs, CR and LF off both ends.
fn trim(s: &[u8]) -> &[u8] {
    let ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\r' | b'\n');
    let start = s.iter().position(|b| !ws(b)).unwrap_or(s.len());
    let end = s.iter().rposition(|b| !ws(b)).map_or(start, |i| i + 1);
    s.get(start..end).unwrap_or_default()
}

/// An RFC 7230 token character, as Go's `isTokenRune`.
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(header: &str, name: &str) -> Option<String> {
        go_cookie(header.as_bytes(), name).map(|v| String::from_utf8(v).unwrap())
    }

    #[test]
    fn cookies_read_as_go_reads_them() {
        assert_eq!(
            c("a=1; llm_session=abc; b=2", "llm_session").as_deref(),
            Some("abc")
        );
        assert_eq!(
            c("  llm_session=abc  ", "llm_session").as_deref(),
            Some("abc")
        );
        assert_eq!(
            c("llm_session=\"abc\"", "llm_session").as_deref(),
            Some("abc")
        );
        assert_eq!(
            c("x_llm_session=1;llm_session=2", "llm_session").as_deref(),
            Some("2")
        );
        // The first of a name wins, even empty; an invalid value is skipped for the next.
        assert_eq!(c("s=; s=2", "s").as_deref(), Some(""));
        assert_eq!(c("s; s=2", "s").as_deref(), Some(""));
        assert_eq!(c("s=a\\b; s=2", "s").as_deref(), Some("2"));
        assert_eq!(c("s=a\"b", "s"), None);
        // Go keeps a value's leading space after `=` (only the pair and the name are trimmed).
        assert_eq!(c("s = v", "s").as_deref(), Some(" v"));
        assert_eq!(c("s=a b", "s").as_deref(), Some("a b"));
        assert_eq!(c("s=\u{e9}", "s"), None);
        assert_eq!(c("s=1", "S"), None, "names are case-sensitive");
        assert_eq!(c("s=1", ""), None);
        assert_eq!(c("", "s"), None);
        assert_eq!(c("bad name=1; s=3", "s").as_deref(), Some("3"));
    }
}
