//! Waiting queue, plain-Envoy build: the proxy-wide wait set in shared data, the counterpart of
//! the Redis wait set (docs/redis-data-model.md §12). Every worker VM's waiting requests of a
//! route with priority classes are lines `<id hex> <rank> <deadline ms>` of one record per
//! endpoint set (`ailb.wait.<fingerprint>`), so a lower class on one worker does not take the
//! room a higher class waits for on another. Expired lines neither count nor stay.

use super::shared;
use crate::host::{Host, HostError};
use crate::upstream;
use std::rc::Rc;

/// The wait set of the endpoint set `endpoints` (beside its counts, `ailb.glr.<fingerprint>`).
pub fn key(endpoints: &[String]) -> Rc<str> {
    format!("ailb.wait.{}", upstream::fingerprint(endpoints)).into()
}

/// One line: (id, rank, deadline ms). Malformed lines are skipped.
fn decode(b: &[u8]) -> Vec<(u64, usize, u64)> {
    String::from_utf8_lossy(b)
        .lines()
        .filter_map(|l| {
            let mut it = l.split(' ');
            let id = u64::from_str_radix(it.next()?, 16).ok()?;
            let rank = it.next()?.parse().ok()?;
            let deadline = it.next()?.parse().ok()?;
            Some((id, rank, deadline))
        })
        .collect()
}

fn encode(lines: &[(u64, usize, u64)]) -> Vec<u8> {
    let mut out = String::new();
    for (id, rank, deadline) in lines {
        out.push_str(&format!("{id:016x} {rank} {deadline}\n"));
    }
    out.into_bytes()
}

/// Adds (`rank` Some) or removes waiter `id`, dropping the lines whose deadline passed.
pub fn set(
    host: &mut dyn Host,
    key: &str,
    id: u64,
    rank: Option<usize>,
    deadline_ms: u64,
) -> Result<(), HostError> {
    let now = host.now_ms();
    shared::update(host, key, |cur| {
        let mut lines = cur.as_deref().map(decode).unwrap_or_default();
        lines.retain(|&(i, _, d)| i != id && d > now);
        if let Some(rank) = rank {
            lines.push((id, rank, deadline_ms));
        }
        (encode(&lines), ())
    })
}

/// How many requests of a class above `rank` wait in this proxy now (0 when unreadable: the
/// class caps still hold).
pub fn above(host: &dyn Host, key: &str, rank: usize) -> u64 {
    if rank == 0 {
        return 0;
    }
    let now = host.now_ms();
    match host.shared_get(key) {
        Ok(Some((b, _))) => decode(&b)
            .iter()
            .filter(|&&(_, r, d)| r < rank && d > now)
            .count() as u64,
        _ => 0,
    }
}

/// The rule of `pick.lua`'s `outranked`: with `above` higher-class requests waiting, a request
/// of `cost` at `cap` is refused while the free room is no more than their number. The free
/// room is the least of ⌊(cap − load) / cost⌋ summed over the endpoints and
/// ⌊(pool_cap − Σ load) / cost⌋ (`maxPoolRequests`), whichever cap is set (0 = none).
pub fn outranked(loads: &[u64], cap: u64, pool_cap: u64, cost: u64, above: u64) -> bool {
    if above == 0 || (cap == 0 && pool_cap == 0) {
        return false;
    }
    let cost = cost.max(1);
    let mut free = u64::MAX;
    if cap > 0 {
        free = loads.iter().map(|&l| cap.saturating_sub(l) / cost).sum();
    }
    if pool_cap > 0 {
        let total = loads.iter().fold(0u64, |t, &l| t.saturating_add(l));
        free = free.min(pool_cap.saturating_sub(total) / cost);
    }
    free <= above
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::mock::MockHost;

    #[test]
    fn lines_come_and_go_and_expire() {
        let mut host = MockHost::new();
        host.now_ms = 1000;
        let k = key(&["10.0.0.1:80".to_string()]);
        assert!(k.starts_with("ailb.wait."));
        set(&mut host, &k, 1, Some(0), 2000).unwrap();
        set(&mut host, &k, 2, Some(1), 1500).unwrap();
        set(&mut host, &k, 3, Some(2), 3000).unwrap();
        assert_eq!(
            above(&host, &k, 0),
            0,
            "the highest class is never outranked"
        );
        assert_eq!(above(&host, &k, 1), 1);
        assert_eq!(above(&host, &k, 2), 2);
        host.now_ms = 1500;
        assert_eq!(above(&host, &k, 2), 1, "an expired waiter does not count");
        set(&mut host, &k, 1, None, 0).unwrap();
        assert_eq!(above(&host, &k, 2), 0);
        let (b, _) = host.shared_get(&k).unwrap().unwrap();
        assert_eq!(
            decode(&b),
            [(3, 2, 3000)],
            "removed and expired lines are gone"
        );
    }

    #[test]
    fn room_beyond_the_waiters_is_free_to_take() {
        assert!(!outranked(&[4, 3], 4, 0, 1, 0));
        assert!(outranked(&[4, 3], 4, 0, 1, 1));
        assert!(!outranked(&[3, 3], 4, 0, 1, 1));
        assert!(outranked(&[3, 3], 4, 0, 1, 2));
        assert!(
            outranked(&[2, 3], 4, 0, 2, 1),
            "room counts in requests of this cost"
        );
        assert!(!outranked(&[4, 4], 0, 0, 1, 3), "no cap: no room to give");
        // maxPoolRequests: the pool's room counts too, the lesser of the two.
        assert!(
            outranked(&[1, 1], 0, 3, 1, 1),
            "pool cap alone: one free, one waits"
        );
        assert!(!outranked(&[1, 1], 0, 4, 1, 1));
        assert!(
            outranked(&[1, 1], 4, 3, 1, 1),
            "the endpoints have 6 free, the pool only 1"
        );
        assert!(
            outranked(&[3, 3], 4, 100, 1, 2),
            "the pool has room, the endpoints only 2"
        );
        assert!(!outranked(&[1, 1], 4, 5, 1, 2));
    }
}
