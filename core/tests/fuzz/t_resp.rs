//! The RESP2 decoder (`redis::resp`): the replies our scripts get (OK, errors, integers,
//! endpoint/count arrays, nil) and random value trees, encoded, then mutated as bytes.
//!
//! Properties: never panics; `decode` uses at most the input and its value depends only on the
//! bytes it used (nothing past them is read); `decode_exact` succeeds exactly when `decode` uses
//! the whole input; a value round-trips through the encoding, and every strict prefix of an
//! encoding is `Incomplete`, never another value; the accessors never panic.

use crate::gen::{drive, mutate_bytes, Rng, INTERESTING_NUMBERS};
use ailb_core::redis::resp::{decode, decode_exact, encode_command, RespError, Value};
use ailb_testkit::encode_value;

const DICT: &[&[u8]] = &[
    b"\r\n",
    b"*",
    b"$",
    b":",
    b"+",
    b"-",
    b"-1",
    b"*-1\r\n",
    b"$-1\r\n",
    b"*1\r\n",
    b"$0\r\n\r\n",
    b"*33\r\n",
    b"\r",
    b"\n",
];

fn random_value(rng: &mut Rng, depth: usize) -> Value {
    let text = |rng: &mut Rng| -> String {
        (0..rng.len(12))
            .map(|_| *rng.pick(&['a', ' ', ':', '1', 'é', '-', '+', '$', '*']))
            .collect()
    };
    match rng.below(if depth == 0 { 6 } else { 8 }) {
        0 => Value::Simple(text(rng)),
        1 => Value::Error(format!("ERR {}", text(rng))),
        2 => Value::Integer(rng.u64() as i64 >> rng.below(64)),
        3 => Value::Bulk(None),
        4 => {
            let n = rng.len(40);
            Value::Bulk(Some(rng.bytes(n)))
        }
        5 => Value::Array(None),
        _ => Value::Array(Some(
            (0..rng.len(6))
                .map(|_| random_value(rng, depth - 1))
                .collect(),
        )),
    }
}

fn encoded(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    encode_value(v, &mut out);
    out
}

fn seeds() -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = [
        &b"+OK\r\n"[..],
        b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
        b"-NOAUTH Authentication required.\r\n",
        b":42\r\n",
        b"$-1\r\n",
        b"*-1\r\n",
        b"*0\r\n",
        b"*2\r\n$11\r\n10.0.0.1:80\r\n:3\r\n",
        b"*3\r\n$11\r\n10.0.0.2:80\r\n$1\r\n7\r\n*2\r\n$16\r\nabcdef0123456789\r\n:1\r\n",
        b"$40\r\n0123456789abcdef0123456789abcdef01234567\r\n",
    ]
    .iter()
    .map(|s| s.to_vec())
    .collect();
    out.push(encode_command(&[
        "EVALSHA",
        "0123",
        "1",
        "{route}:k",
        "10.0.0.1:80",
    ]));
    out
}

fn generate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    match rng.below(4) {
        0 => encoded(&random_value(rng, 4)),
        1 => {
            // Deep nesting around the depth limit.
            let depth = 28 + rng.below(8);
            let mut v = b"*1\r\n".repeat(depth);
            v.extend_from_slice(b":1\r\n");
            v
        }
        _ => {
            let base = if rng.chance(1, 2) {
                rng.pick(seeds).clone()
            } else {
                encoded(&random_value(rng, 3))
            };
            let mut v = mutate_bytes(rng, &base, seeds, DICT, 1 << 16);
            if rng.chance(1, 8) {
                // A length or count field set to an edge value.
                let at = v.iter().position(|&b| b == b'$' || b == b'*');
                if let Some(at) = at {
                    let end = v[at..]
                        .iter()
                        .position(|&b| b == b'\r')
                        .map_or(v.len(), |e| at + e);
                    let n = rng.pick(INTERESTING_NUMBERS).as_bytes().to_vec();
                    v.splice(at + 1..end, n);
                }
            }
            v
        }
    }
}

fn touch(v: &Value) {
    let _ = (v.as_str(), v.as_i64(), v.as_f64());
    if let Value::Array(Some(items)) = v {
        items.iter().for_each(touch);
    }
}

fn check(input: &[u8]) {
    match decode(input) {
        Ok((value, used)) => {
            assert!(used > 0 && used <= input.len());
            // Only the used bytes were read: the same value from them alone.
            assert_eq!(decode(&input[..used]), Ok((value.clone(), used)));
            assert_eq!(
                decode_exact(input),
                if used == input.len() {
                    Ok(value.clone())
                } else {
                    Err(RespError::TrailingBytes(input.len() - used))
                }
            );
            touch(&value);
            // Round trip: the value re-encoded decodes to itself.
            let again = encoded(&value);
            assert_eq!(decode_exact(&again), Ok(value.clone()));
            // Every strict prefix of an encoding is incomplete, never another value.
            if again.len() <= 512 {
                for cut in 0..again.len() {
                    assert_eq!(
                        decode(&again[..cut]),
                        Err(RespError::Incomplete),
                        "prefix {cut} of {again:?}"
                    );
                }
            }
        }
        Err(e) => {
            assert!(decode_exact(input).is_err());
            assert!(e.to_string().len() < 128);
        }
    }
}

#[test]
fn fuzz_resp_decode() {
    let seeds = seeds();
    for s in &seeds {
        check(s);
    }
    drive("resp", 200, |rng| generate(rng, &seeds), check);
}
