//! Byte-string searches for the texts the plugin reads without parsing them whole (a response's
//! usage tail and SSE events, a host's metrics page as it sits in the host list's JSON).

/// Where the first `needle` in `hay` starts.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (k, p) = probe(needle)?;
    let last = hay.len().checked_sub(needle.len())?;
    let mut from = 0;
    while from <= last {
        let at = from + hay.get(from + k..=last + k)?.iter().position(|&b| b == p)?;
        if hay.get(at..at + needle.len()) == Some(needle) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// Where the last `needle` in `hay` starts.
pub fn rfind(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (k, p) = probe(needle)?;
    let mut end = hay.len().checked_sub(needle.len())? + 1;
    while end > 0 {
        let at = hay.get(k..end + k)?.iter().rposition(|&b| b == p)?;
        if hay.get(at..at + needle.len()) == Some(needle) {
            return Some(at);
        }
        end = at;
    }
    None
}

/// Where the last of any of `needles` in `hay` starts, and which one: one backward pass that
/// stops at the first match from the end, where a last occurrence of each needle would scan
/// the whole text for every needle that is absent.
pub fn rfind_any(hay: &[u8], needles: &[&[u8]]) -> Option<(usize, usize)> {
    let probes: Vec<Option<(usize, u8)>> = needles.iter().map(|n| probe(n)).collect();
    (0..hay.len()).rev().find_map(|i| {
        needles
            .iter()
            .zip(&probes)
            .enumerate()
            .find_map(|(j, (n, p))| {
                let (k, b) = (*p)?;
                let hit = hay.get(i + k) == Some(&b) && hay.get(i..i + n.len()) == Some(*n);
                hit.then_some((i, j))
            })
    })
}

/// The needle's byte a scan tests at each position before comparing the whole needle: its last
/// byte that is not a quote. The keys searched for are quoted, and a quote is the commonest
/// byte of JSON, so most positions cost one byte compare: a verified answer's end scans its
/// 4 KB tail for several absent keys (verify/usage.rs), which a compare at every position made
/// the costliest part of reading it.
fn probe(needle: &[u8]) -> Option<(usize, u8)> {
    let k = needle.iter().rposition(|&b| b != b'"').unwrap_or(0);
    Some((k, *needle.get(k)?))
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
        assert_eq!(find(b"\"\"\"", b"\"\""), Some(0));
        assert_eq!(rfind(b"\"\"\"", b"\"\""), Some(1));
    }

    /// The searches agree with a compare at every position, on texts of few letters (many
    /// partial matches, every overlap).
    #[test]
    fn the_searches_agree_with_the_plain_scan() {
        let naive_find = |h: &[u8], n: &[u8]| {
            (!n.is_empty())
                .then(|| h.windows(n.len()).position(|w| w == n))
                .flatten()
        };
        let naive_rfind = |h: &[u8], n: &[u8]| {
            (!n.is_empty())
                .then(|| h.windows(n.len()).rposition(|w| w == n))
                .flatten()
        };
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let alphabet = b"\"ab:";
        for _ in 0..20_000 {
            let mut text = |len: u64| -> Vec<u8> {
                (0..next(len))
                    .map(|_| alphabet[next(alphabet.len() as u64) as usize])
                    .collect()
            };
            let (hay, needle) = (text(24), text(5));
            assert_eq!(
                find(&hay, &needle),
                naive_find(&hay, &needle),
                "{hay:?} {needle:?}"
            );
            assert_eq!(
                rfind(&hay, &needle),
                naive_rfind(&hay, &needle),
                "{hay:?} {needle:?}"
            );
            let other = text(4);
            let any = rfind_any(&hay, &[&needle, &other]);
            let last = [&needle, &other]
                .iter()
                .enumerate()
                .filter_map(|(j, n)| Some((naive_rfind(&hay, n)?, j)))
                .max_by_key(|&(at, j)| (at, std::cmp::Reverse(j)));
            assert_eq!(any, last, "{hay:?} {needle:?} {other:?}");
        }
    }
}
