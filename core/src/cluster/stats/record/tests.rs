use super::layout::at;
use super::*;
use crate::cluster::stats::table::ServiceTable;
use crate::cluster::MetricsParams;
use crate::hash::SplitMix64;

const LIST: [&str; 5] = [
    "outbound|80||a.dns",
    "weird name%\t",
    "ünï",
    "",
    "outbound|80||a.dns",
];

fn busy_table() -> ServiceTable {
    let p = MetricsParams {
        queue_size: 4,
        ..MetricsParams::default()
    };
    let mut t = ServiceTable::new(&LIST, p.ring_capacity());
    for i in 0..6 {
        t.on_request_start(i % 4);
        t.on_first_byte(i % 4, 10 + i as i64 * 7, i % 3 != 0, p.ewma_beta);
        t.on_stream_end(
            i % 4,
            Some(100 + i as i64 * 33),
            i % 3 != 0,
            1_700_000_000_000,
            &p,
        );
    }
    t.on_request_start(1);
    t.get_mut(2).unwrap().ttft.push(0.1 + 0.2, 4);
    t.get_mut(2).unwrap().total.push(1e300, 4);
    t.get_mut(2).unwrap().total.push(-3.5e-9, 4);
    t.get_mut(3).unwrap().ongoing = -7;
    t.get_mut(3).unwrap().cooldown_until_ms = i64::MIN;
    t.get_mut(3).unwrap().errors = u64::MAX;
    t
}

#[test]
fn codec_round_trips_exactly() {
    let t = busy_table();
    let bytes = t.encode();
    let back = t.fresh().read(&bytes).expect("ours");
    assert_eq!(back, t);
    assert_eq!(back.encode(), bytes);
    let samples: usize = t.stats().iter().map(|s| s.ttft.len() + s.total.len()).sum();
    assert_eq!(
        bytes.len(),
        HEADER_LEN + 4 * BLOCK_LEN + samples * SAMPLE_LEN
    );
    // A fresh table encodes and reads back too; `decode` is the same read.
    let fresh = ServiceTable::new(&["x", "y"], 100);
    assert_eq!(fresh.read(&fresh.encode()), Some(fresh.clone()));
    assert_eq!(ServiceTable::decode(&bytes, &LIST, 4), t);
    // An opened record hands back the very bytes.
    assert_eq!(t.open(bytes.clone()).map(Record::into_bytes), Some(bytes));
}

#[test]
fn layout_is_stable() {
    let mut t = ServiceTable::new(&["outbound|80||a.dns"], 100);
    t.on_request_start(0);
    t.on_first_byte(0, 12, true, 0.5);
    t.on_stream_end(0, Some(40), false, 1000, &MetricsParams::default());
    let b = t.encode();
    let le = |v: u64| v.to_le_bytes();
    let mut want = b"acm\x01".to_vec();
    want.extend_from_slice(&1u32.to_le_bytes());
    let name = b"outbound|80||a.dns";
    let fp = crate::hash::fnv1a(crate::hash::FNV_OFFSET, &le(name.len() as u64));
    want.extend_from_slice(&le(crate::hash::fnv1a(fp, name)));
    want.extend_from_slice(&le(100));
    // ongoing 0, count 1, success 0, errors 1, consecutive 1, cooldown 31000.
    for v in [0, 1, 0, 1, 1, 31_000] {
        want.extend_from_slice(&le(v));
    }
    // EWMAs 12 and 80 (a failure of 40 ms counts double), sums 12 and 80.
    for v in [12.0f64, 80.0, 12.0, 80.0] {
        want.extend_from_slice(&v.to_le_bytes());
    }
    for v in [3u32, 1, 1] {
        want.extend_from_slice(&v.to_le_bytes());
    }
    want.extend_from_slice(&12.0f64.to_le_bytes());
    want.extend_from_slice(&80.0f64.to_le_bytes());
    assert_eq!(b, want);
}

/// Every change made through a `Record` leaves exactly the bytes the in-memory table
/// encodes after the same change: the two stores agree bit for bit.
#[test]
fn record_updates_in_place_exactly_as_the_table() {
    for (list, capacity) in [
        (&LIST[..], 4),
        (&["a", "b", "c"][..], 100),
        (&["a"][..], 1),
        (&["a", "b"][..], 0),
        (&[][..], 3),
    ] {
        let p = MetricsParams::default();
        let mut rng = SplitMix64(capacity as u64 + 1);
        let mut table = ServiceTable::new(list, capacity);
        let mut record = table.fresh_record();
        assert_eq!(record.clone().into_bytes(), table.encode());
        for step in 0..600 {
            let r = rng.next_u64();
            // Index 7 is beyond every list: both stores ignore it.
            let i = match list.len() {
                0 => 7,
                n => [(r % n as u64) as usize, 7][usize::from(step % 41 == 0)],
            };
            let ms = (r >> 8) as i64 % 2_000 - 20;
            let ok = !(r >> 40).is_multiple_of(4);
            match (r >> 32) % 4 {
                0 => {
                    table.on_request_start(i);
                    record.on_request_start(i);
                }
                1 => {
                    table.on_first_byte(i, ms, ok, p.ewma_beta);
                    record.on_first_byte(i, ms, ok, p.ewma_beta);
                }
                2 => {
                    table.on_stream_end(i, Some(ms), ok, step, &p);
                    record.on_stream_end(i, Some(ms), ok, step, &p);
                }
                _ => {
                    table.on_stream_end(i, None, ok, step, &p);
                    record.on_stream_end(i, None, ok, step, &p);
                }
            }
            for j in 0..table.names().len() {
                assert_eq!(record.counters(j), table.counters(j));
                for w in [Latency::Ttft, Latency::Total] {
                    assert_eq!(record.mean(j, w).to_bits(), table.mean(j, w).to_bits());
                }
            }
            assert_eq!(record.clone().into_bytes(), table.encode(), "step {step}");
            // And what was written opens again.
            let bytes = record.clone().into_bytes();
            assert_eq!(table.fresh().read(&bytes).as_ref(), Some(&table));
        }
    }
}

fn refused(t: &ServiceTable, bytes: &[u8]) -> bool {
    t.read(bytes).is_none() && t.open(bytes.to_vec()).is_none()
}

#[test]
fn anything_but_our_own_record_is_refused() {
    let t = busy_table();
    let good = t.encode();
    let block = |i: usize| HEADER_LEN + i * BLOCK_LEN;
    let with = |at: usize, v: &[u8]| {
        let mut b = good.clone();
        b[at..at + v.len()].copy_from_slice(v);
        b
    };
    let mut bad: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("short header", good[..HEADER_LEN - 1].to_vec()),
        ("header only", good[..HEADER_LEN].to_vec()),
        ("one byte short", good[..good.len() - 1].to_vec()),
        ("one sample short", good[..good.len() - SAMPLE_LEN].to_vec()),
        ("one byte long", [&good[..], &[0]].concat()),
        ("magic", with(0, b"ACM")),
        ("version", with(3, &[2])),
        ("service count", with(4, &5u32.to_le_bytes())),
        ("fingerprint", with(8, &0u64.to_le_bytes())),
        ("capacity", with(16, &5u64.to_le_bytes())),
        (
            "unknown flag",
            with(block(0) + at::FLAGS, &4u32.to_le_bytes()),
        ),
        (
            "NaN EWMA",
            with(block(0) + at::EWMA_TOTAL, &f64::NAN.to_le_bytes()),
        ),
        (
            "infinite sum",
            with(block(1) + at::SUMS[1], &f64::INFINITY.to_le_bytes()),
        ),
        (
            "ring over capacity",
            with(block(0) + at::LENS[0], &5u32.to_le_bytes()),
        ),
        (
            "ring length off",
            with(block(0) + at::LENS[1], &1u32.to_le_bytes()),
        ),
        (
            "the former text record",
            b"outbound|80||a.dns 0 0 0 0 0 0 - - - -\n".to_vec(),
        ),
    ];
    // The same services in another order, and another capacity, are other records.
    let mut other = ServiceTable::new(&["ünï", "outbound|80||a.dns", "weird name%\t", ""], 4);
    other.on_request_start(0);
    bad.push(("other order", other.encode()));
    bad.push(("other capacity", ServiceTable::new(&LIST, 5).encode()));
    bad.push((
        "other names",
        ServiceTable::new(&["a", "b", "c", "d"], 4).encode(),
    ));
    for (what, bytes) in &bad {
        assert!(refused(&t, bytes), "{what}");
    }
    assert!(!refused(&t, &good));
    // Absent EWMAs and empty rings are written as +0.
    let fresh = t.fresh().encode();
    for at in [at::EWMA_TTFT, at::SUMS[1]] {
        let mut b = fresh.clone();
        b[block(2) + at..block(2) + at + 8].copy_from_slice(&(-0.0f64).to_le_bytes());
        assert!(refused(&t, &b), "at {at}");
    }
    assert!(!refused(&t, &fresh));
}

/// Random damage never panics a read or an open, and whatever is accepted stays ours
/// through updates.
#[test]
fn damaged_records_never_panic() {
    let p = MetricsParams::default();
    let t = busy_table();
    let good = t.encode();
    let mut rng = SplitMix64(7);
    let mut accepted = 0;
    for round in 0..3000 {
        let mut bytes = good.clone();
        match round % 3 {
            0 => {
                for _ in 0..1 + rng.next_u64() % 8 {
                    let i = (rng.next_u64() % bytes.len() as u64) as usize;
                    bytes[i] = rng.next_u64() as u8;
                }
            }
            1 => bytes.truncate((rng.next_u64() % bytes.len() as u64) as usize),
            _ => {
                bytes = (0..rng.next_u64() % 600)
                    .map(|_| rng.next_u64() as u8)
                    .collect();
            }
        }
        let read = t.read(&bytes);
        let Some(mut record) = t.open(bytes) else {
            assert!(read.is_none());
            continue;
        };
        accepted += 1;
        let read = read.expect("open and read agree");
        for i in 0..5 {
            record.on_request_start(i);
            record.on_first_byte(i, 30, i % 2 == 0, p.ewma_beta);
            record.on_stream_end(i, Some(90), i % 2 == 1, 5, &p);
        }
        let after = record.into_bytes();
        assert!(read.read(&after).is_some(), "round {round}");
    }
    // Damage to samples (not to the header or blocks) is not detectable, and accepted.
    assert!(accepted > 0);
}
