//! RESP2 encoder and decoder.
//!
//! The Higress host sends our query bytes verbatim and hands back the raw bytes of exactly one
//! reply, so the plugin owns both directions. Only RESP2 is spoken: the host's own parser
//! rejects RESP3 types (docs/higress-abi.md §5, §6).

use std::fmt;

/// Nesting deeper than this is refused rather than recursed into: a garbage reply must not be
/// able to exhaust the wasm stack.
const MAX_DEPTH: usize = 32;

/// A decoded RESP2 value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Simple(String),
    Error(String),
    Integer(i64),
    /// `None` is the nil bulk string (`$-1`).
    Bulk(Option<Vec<u8>>),
    /// `None` is the nil array (`*-1`).
    Array(Option<Vec<Value>>),
}

impl Value {
    /// The value as text, for simple and bulk strings.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Simple(s) => Some(s),
            Value::Bulk(Some(b)) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// The value as an integer, for integers and numeric strings (Redis returns scores as
    /// bulk strings).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Integer(i) => Some(*i),
            other => other.as_str().and_then(|s| s.parse().ok()),
        }
    }

    /// The value as a float, for integers and numeric strings.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Integer(i) => Some(*i as f64),
            other => other.as_str().and_then(|s| s.parse().ok()),
        }
    }
}

/// Why a reply could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RespError {
    /// The input ends before the value does.
    Incomplete,
    /// A byte that cannot start a RESP2 value.
    BadType(u8),
    /// A length or integer field that is not a number in range.
    BadNumber,
    /// A bulk string not followed by CRLF, or a line without one.
    BadFraming,
    /// Arrays nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// Bytes left over after one complete value.
    TrailingBytes(usize),
}

impl fmt::Display for RespError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RespError::Incomplete => write!(f, "truncated reply"),
            RespError::BadType(b) => write!(f, "unexpected type byte 0x{b:02x}"),
            RespError::BadNumber => write!(f, "malformed length or integer"),
            RespError::BadFraming => write!(f, "missing CRLF"),
            RespError::TooDeep => write!(f, "arrays nested deeper than {MAX_DEPTH}"),
            RespError::TrailingBytes(n) => write!(f, "{n} bytes after the reply"),
        }
    }
}

/// Encodes one command as an array of bulk strings, the only form Redis accepts from clients.
pub fn encode_command<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let payload: usize = args.iter().map(|a| a.as_ref().len() + 16).sum();
    let mut out = Vec::with_capacity(payload + 16);
    push_header(&mut out, b'*', args.len());
    for arg in args {
        let arg = arg.as_ref();
        push_header(&mut out, b'$', arg.len());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn push_header(out: &mut Vec<u8>, kind: u8, len: usize) {
    out.push(kind);
    out.extend_from_slice(len.to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Decodes exactly one value that must fill `input` completely (the host's buffer 9).
pub fn decode_exact(input: &[u8]) -> Result<Value, RespError> {
    let (value, used) = decode(input)?;
    if used != input.len() {
        return Err(RespError::TrailingBytes(input.len() - used));
    }
    Ok(value)
}

/// Decodes one value from the start of `input`; returns it and the bytes it used. Used by
/// stream readers (tests, benchmarks) where replies arrive back to back.
pub fn decode(input: &[u8]) -> Result<(Value, usize), RespError> {
    let mut pos = 0;
    let value = decode_at(input, &mut pos, 0)?;
    Ok((value, pos))
}

fn decode_at(input: &[u8], pos: &mut usize, depth: usize) -> Result<Value, RespError> {
    let kind = *input.get(*pos).ok_or(RespError::Incomplete)?;
    *pos += 1;
    match kind {
        b'+' => Ok(Value::Simple(lossy(read_line(input, pos)?))),
        b'-' => Ok(Value::Error(lossy(read_line(input, pos)?))),
        b':' => Ok(Value::Integer(parse_int(read_line(input, pos)?)?)),
        b'$' => {
            let len = parse_int(read_line(input, pos)?)?;
            if len < 0 {
                return Ok(Value::Bulk(None));
            }
            // A length past the end of the input is a truncated reply on every platform; only
            // then is it converted (on wasm32 a huge length would not fit a usize).
            if len > remaining(input, *pos) {
                return Err(RespError::Incomplete);
            }
            let end = *pos + usize::try_from(len).map_err(|_| RespError::BadNumber)?;
            let body = input.get(*pos..end).ok_or(RespError::Incomplete)?;
            match input.get(end..end + 2) {
                Some(b"\r\n") => {}
                Some(_) => return Err(RespError::BadFraming),
                None => return Err(RespError::Incomplete),
            }
            *pos = end + 2;
            Ok(Value::Bulk(Some(body.to_vec())))
        }
        b'*' => {
            let len = parse_int(read_line(input, pos)?)?;
            if len < 0 {
                return Ok(Value::Array(None));
            }
            if depth >= MAX_DEPTH {
                return Err(RespError::TooDeep);
            }
            // Each element takes at least 3 bytes; a count the input cannot hold is refused
            // before allocating for it.
            if len > remaining(input, *pos) / 3 + 1 {
                return Err(RespError::Incomplete);
            }
            let len = usize::try_from(len).map_err(|_| RespError::BadNumber)?;
            let mut items = Vec::with_capacity(len);
            for _ in 0..len {
                items.push(decode_at(input, pos, depth + 1)?);
            }
            Ok(Value::Array(Some(items)))
        }
        other => Err(RespError::BadType(other)),
    }
}

/// Bytes left after `pos`, as a RESP length.
fn remaining(input: &[u8], pos: usize) -> i64 {
    i64::try_from(input.len().saturating_sub(pos)).unwrap_or(i64::MAX)
}

fn read_line<'a>(input: &'a [u8], pos: &mut usize) -> Result<&'a [u8], RespError> {
    let rest = input.get(*pos..).ok_or(RespError::Incomplete)?;
    let cr = rest
        .iter()
        .position(|&b| b == b'\r')
        .ok_or(RespError::Incomplete)?;
    match rest.get(cr + 1) {
        Some(b'\n') => {}
        Some(_) => return Err(RespError::BadFraming),
        None => return Err(RespError::Incomplete),
    }
    *pos += cr + 2;
    Ok(&rest[..cr])
}

fn parse_int(line: &[u8]) -> Result<i64, RespError> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(RespError::BadNumber)
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode_value(v: &Value, out: &mut Vec<u8>) {
        match v {
            Value::Simple(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
            Value::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
            Value::Integer(i) => out.extend_from_slice(format!(":{i}\r\n").as_bytes()),
            Value::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
            Value::Bulk(Some(b)) => {
                push_header(out, b'$', b.len());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Value::Array(None) => out.extend_from_slice(b"*-1\r\n"),
            Value::Array(Some(items)) => {
                push_header(out, b'*', items.len());
                for i in items {
                    encode_value(i, out);
                }
            }
        }
    }

    #[test]
    fn encodes_a_command_as_bulk_array() {
        let got = encode_command(&["EVALSHA", "ab", "0"]);
        assert_eq!(got, b"*3\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n0\r\n");
        assert_eq!(encode_command::<&str>(&[]), b"*0\r\n");
        // Binary-safe: CRLF inside an argument is just payload.
        assert_eq!(encode_command(&["a\r\nb"]), b"*1\r\n$4\r\na\r\nb\r\n");
    }

    #[test]
    fn decodes_every_type() {
        let cases: Vec<(&[u8], Value)> = vec![
            (b"+OK\r\n", Value::Simple("OK".into())),
            (b"-NOSCRIPT x\r\n", Value::Error("NOSCRIPT x".into())),
            (b":-42\r\n", Value::Integer(-42)),
            (b"$3\r\nfoo\r\n", Value::Bulk(Some(b"foo".to_vec()))),
            (b"$0\r\n\r\n", Value::Bulk(Some(vec![]))),
            (b"$-1\r\n", Value::Bulk(None)),
            (b"*-1\r\n", Value::Array(None)),
            (b"*0\r\n", Value::Array(Some(vec![]))),
            (
                b"*2\r\n*1\r\n:1\r\n$2\r\nhi\r\n",
                Value::Array(Some(vec![
                    Value::Array(Some(vec![Value::Integer(1)])),
                    Value::Bulk(Some(b"hi".to_vec())),
                ])),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(
                decode_exact(input),
                Ok(want),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn round_trips_nested_values() {
        let v = Value::Array(Some(vec![
            Value::Simple("OK".into()),
            Value::Bulk(Some(b"10.0.0.1:8000".to_vec())),
            Value::Integer(7),
            Value::Array(Some(vec![Value::Bulk(None), Value::Error("E".into())])),
            Value::Array(None),
        ]));
        let mut bytes = Vec::new();
        encode_value(&v, &mut bytes);
        assert_eq!(decode_exact(&bytes), Ok(v));
    }

    #[test]
    fn rejects_truncated_and_malformed_input() {
        let bad: Vec<(&[u8], RespError)> = vec![
            (b"", RespError::Incomplete),
            (b"+OK", RespError::Incomplete),
            (b"+OK\r", RespError::Incomplete),
            (b"+OK\rx", RespError::BadFraming),
            (b"$5\r\nabc\r\n", RespError::Incomplete),
            (b"$3\r\nabcde", RespError::BadFraming),
            (b"$x\r\n", RespError::BadNumber),
            (b":12a\r\n", RespError::BadNumber),
            (b"*3\r\n:1\r\n", RespError::Incomplete),
            (b"%1\r\n", RespError::BadType(b'%')),
            (b"+OK\r\n+OK\r\n", RespError::TrailingBytes(5)),
            (b"$9223372036854775807\r\n", RespError::Incomplete),
            (b"*9223372036854775807\r\n", RespError::Incomplete),
        ];
        for (input, want) in bad {
            assert_eq!(
                decode_exact(input),
                Err(want),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1) + ":1\r\n";
        assert_eq!(decode_exact(deep.as_bytes()), Err(RespError::TooDeep));
    }

    #[test]
    fn random_bytes_never_panic() {
        // Seeded xorshift so a failure reproduces; mixes pure noise with mutated valid replies.
        let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let seeds: [&[u8]; 3] = [
            b"*3\r\n$2\r\nOK\r\n$13\r\n10.0.0.1:8000\r\n:3\r\n",
            b"-ERR boom\r\n",
            b"*2\r\n*1\r\n$-1\r\n:5\r\n",
        ];
        const ALPHABET: &[u8] = b"*$+-:0123456789\r\n-x";
        for i in 0..20_000 {
            let mut buf: Vec<u8> = if i % 2 == 0 {
                seeds[(next() % 3) as usize].to_vec()
            } else {
                (0..next() % 40)
                    .map(|_| ALPHABET[(next() % 19) as usize])
                    .collect()
            };
            for _ in 0..next() % 4 {
                if !buf.is_empty() {
                    let at = (next() as usize) % buf.len();
                    buf[at] = ALPHABET[(next() % 19) as usize];
                }
            }
            let cut = if buf.is_empty() {
                0
            } else {
                (next() as usize) % (buf.len() + 1)
            };
            let _ = decode_exact(&buf[..cut]);
            let _ = decode(&buf);
        }
    }
}
