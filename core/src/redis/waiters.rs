//! The waiting queue's entries in Redis (docs/redis-data-model.md §12): plain commands, no
//! script.

use super::resp;
use super::scripts::Keys;

/// `ZADD` of a waiter at `score` (Some), or its `ZREM`.
pub fn call(keys: &Keys, member: &str, score: Option<u64>) -> Vec<u8> {
    match score {
        Some(score) => {
            let score = score.to_string();
            resp::encode_command(&[
                b"ZADD".as_slice(),
                keys.wait.as_bytes(),
                score.as_bytes(),
                member.as_bytes(),
            ])
        }
        None => {
            resp::encode_command(&[b"ZREM".as_slice(), keys.wait.as_bytes(), member.as_bytes()])
        }
    }
}
