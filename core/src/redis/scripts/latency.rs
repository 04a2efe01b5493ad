//! prefix_cache's latency models in Redis (docs/redis-data-model.md §15): the merge call
//! (latency_merge.lua) and its reply.

use super::{call, decode, Keys, ReplyError, Script};
use crate::redis::resp::Value;

pub const LATENCY_MERGE: &str = include_str!("latency_merge.lua");

/// The models' keys live a day past their last merge: a route nobody uses any more leaves
/// nothing behind for long.
pub const TTL_S: u64 = 86_400;

/// What one merge sends: `batches` of records (each pod's samples, added to the fleet's), each
/// under its sender's sequence number (applied once however often it is sent), and
/// `coefficients` (what this gateway solved from the fleet's records last time, for the pick
/// script).
pub struct Merge<'a> {
    pub now_ms: u64,
    pub half_life_ms: u64,
    pub sender: &'a str,
    pub batches: &'a [Batch],
    pub coefficients: &'a [Record],
}

/// One pod's numbers: (pod, CSV numbers).
pub type Record = (String, Vec<f64>);
/// A sender's numbered batch of records.
pub type Batch = (u64, Vec<Record>);

/// Numbers as the script reads them back (Lua's `tonumber`): shortest round-trip form.
pub fn csv(v: &[f64]) -> String {
    let mut out = String::with_capacity(v.len() * 12);
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        // Display is the shortest text that reads back as the same number.
        out.push_str(&x.to_string());
    }
    out
}

/// The merge call. Sent with EVAL (once a second per route and gateway at most, so the
/// script cache's NOSCRIPT path is not worth having).
pub fn merge_call(keys: &Keys, m: &Merge) -> Vec<u8> {
    let script = Script::eval(&[LATENCY_MERGE]);
    let mut owned = vec![
        m.now_ms.to_string(),
        m.half_life_ms.to_string(),
        TTL_S.to_string(),
        m.sender.to_string(),
        m.batches.len().to_string(),
    ];
    for (seq, records) in m.batches {
        owned.push(seq.to_string());
        owned.push(records.len().to_string());
        for (pod, v) in records {
            owned.push(pod.clone());
            owned.push(csv(v));
        }
    }
    for (pod, v) in m.coefficients {
        owned.push(pod.clone());
        owned.push(csv(v));
    }
    let args: Vec<&[u8]> = owned.iter().map(|s| s.as_bytes()).collect();
    call(
        &script,
        false,
        &[keys.latency.as_str(), keys.latency_coef.as_str()],
        &args,
    )
}

/// The fleet's records the merge read back: (pod, numbers). A record whose numbers do not all
/// parse is left out (the book also checks each record's length and finiteness).
pub fn parse_merged(raw: &[u8]) -> Result<Vec<(String, Vec<f64>)>, ReplyError> {
    let value = decode(raw)?;
    let Value::Array(Some(items)) = value else {
        return Err(ReplyError::Malformed(
            "a merge reply that is not an array".into(),
        ));
    };
    let mut out = Vec::with_capacity(items.len() / 2);
    for pair in items.chunks(2) {
        let [pod, record] = pair else {
            return Err(ReplyError::Malformed("odd-length merge reply".into()));
        };
        let (Some(pod), Some(record)) = (pod.as_str(), record.as_str()) else {
            continue;
        };
        let numbers: Result<Vec<f64>, _> = record.split(',').map(str::parse::<f64>).collect();
        if let Ok(numbers) = numbers {
            out.push((pod.to_string(), numbers));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::resp;

    #[test]
    fn a_reply_parses_and_bad_records_are_left_out() {
        let reply = resp::encode_command(&[
            b"10.0.0.1:8000".as_slice(),
            b"1,2.5,-3e-7",
            b"10.0.0.2:8000",
            b"1,x",
        ]);
        let got = parse_merged(&reply).unwrap();
        assert_eq!(got, vec![("10.0.0.1:8000".into(), vec![1.0, 2.5, -3e-7])]);
        assert!(parse_merged(b"-ERR boom\r\n").is_err());
        assert!(parse_merged(b":1\r\n").is_err());
    }

    #[test]
    fn numbers_round_trip_exactly() {
        let v = [0.1, 1e300, -2.5e-12, 7.0];
        let back: Vec<f64> = csv(&v).split(',').map(|x| x.parse().unwrap()).collect();
        assert_eq!(back, v);
    }
}
