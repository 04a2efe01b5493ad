//! Block hashes and the chained prefix keys.
//!
//! `h_i = SHA-1( u32_le(i) ‖ u32_le(len(model)) ‖ model ‖ block_i )` for 0-based position `i`;
//! `key_i = key_{i-1} XOR h_i` with `key_{-1} = 0`, truncated to the first 8 bytes (16 hex
//! digits). The position makes the chain order-sensitive and stops a repeated block from
//! cancelling (plain XOR chaining, as in Higress, has both flaws); the length-prefixed model
//! name keeps different models' chains apart. Key `i` depends only on blocks `0..=i`, so a
//! longer conversation's keys start with the shorter one's.

use sha1::{Digest, Sha1};

/// First 8 bytes of a chain key.
pub type PrefixKey = [u8; 8];

/// SHA-1 of one block at `position`, salted with the model name.
pub fn block_hash(model: &str, position: usize, block: &[u8]) -> [u8; 20] {
    // Both saturate only for inputs far past any body or block cap.
    let position = u32::try_from(position).unwrap_or(u32::MAX);
    let model_len = u32::try_from(model.len()).unwrap_or(u32::MAX);
    let mut h = Sha1::new();
    h.update(position.to_le_bytes());
    h.update(model_len.to_le_bytes());
    h.update(model.as_bytes());
    h.update(block);
    h.finalize().into()
}

/// The chain keys of `blocks` (one per block, in order).
pub fn chain_keys<I>(model: &str, blocks: I) -> Vec<PrefixKey>
where
    I: IntoIterator,
    I::Item: AsRef<[u8]>,
{
    let blocks = blocks.into_iter();
    let mut keys = Vec::with_capacity(blocks.size_hint().0);
    let mut acc: PrefixKey = [0; 8];
    for (i, block) in blocks.enumerate() {
        let h = block_hash(model, i, block.as_ref());
        for (a, b) in acc.iter_mut().zip(h.iter()) {
            *a ^= b;
        }
        keys.push(acc);
    }
    keys
}

/// 16 lower-case hex digits.
pub fn key_hex(key: &PrefixKey) -> String {
    hex::encode(key)
}

/// Redis key `<ns>:px:<16 hex>`, where `ns` is the hash-tagged namespace `ailb:{route|cluster}`.
pub fn prefix_key(ns: &str, key: &PrefixKey) -> String {
    let mut buf = [0u8; 16];
    let mut s = String::with_capacity(ns.len() + 4 + buf.len());
    s.push_str(ns);
    s.push_str(":px:");
    match hex::encode_to_slice(key, &mut buf) {
        Ok(()) => s.extend(buf.iter().map(|&b| char::from(b))),
        // Unreachable (8 bytes always fit 16 digits); stay panic-free anyway.
        Err(_) => s.push_str(&hex::encode(key)),
    }
    s
}
