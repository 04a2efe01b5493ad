use super::*;
use crate::redis::resp::Value;

#[test]
fn keys_share_one_hash_tag() {
    let k = Keys::new("ailb", "default/chat", "outbound|8000||llm.static");
    assert_eq!(k.load, "ailb:{default/chat|outbound|8000||llm.static}:load");
    for key in [&k.load, &k.leases, &k.members] {
        assert!(key.starts_with("ailb:{default/chat|outbound|8000||llm.static}:"));
    }
    let odd = Keys::new("ailb", "r{1}", "c}");
    assert_eq!(odd.namespace, "ailb:{r_1_|c_}");
}

#[test]
fn sha_matches_redis_script_sha() {
    // SHA-1 of "return 1", as SCRIPT LOAD reports it.
    assert_eq!(
        Script::new(&["return 1"]).sha,
        "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"
    );
}

#[test]
fn acquire_call_layout() {
    let s = Scripts::new();
    let k = Keys::new("p", "r", "c");
    let eps = vec!["a:1".to_string(), "b:2".to_string()];
    let args = AcquireArgs {
        now_ms: 5,
        lease_ttl_ms: 6,
        request_id: "rid",
        cost: 1,
        cap: 0,
        random: 9,
        fingerprint: "fp",
        reclaim: 2,
        endpoints: Some(&eps),
        session: None,
        wait_rank: None,
        pool_cap: 0,
        tenant: None,
        trials: 0,
    };
    let q = acquire_call(&s, true, &k, &args);
    let Value::Array(Some(items)) = resp::decode_exact(&q).unwrap() else {
        panic!()
    };
    let words: Vec<&str> = items.iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(
        words,
        [
            "EVALSHA",
            s.acquire.sha.as_str(),
            "8",
            "p:{r|c}:load",
            "p:{r|c}:leases",
            "p:{r|c}:members",
            "p:{r|c}:health",
            "p:{r|c}:ejected",
            "p:{r|c}:wait",
            "p:{r|c}:tenants",
            "p:{r|c}:tenants_seen",
            "5",
            "6",
            "rid",
            "1",
            "0",
            "9",
            "fp",
            "2",
            "0",
            "0",
            "0",
            "0",
            "",
            "0",
            "1",
            "-1",
            "0",
            "a:1",
            "b:2"
        ]
    );
}

#[test]
fn session_calls_carry_the_key_last_and_the_ttl_before_the_list() {
    let s = Scripts::new();
    let k = Keys::new("p", "r", "c");
    let key = session_key(&k.namespace, "\u{4f1a}\u{8bdd}".as_bytes());
    assert!(key.starts_with("p:{r|c}:session:") && key.len() == "p:{r|c}:session:".len() + 40);
    assert_ne!(key, session_key(&k.namespace, b""));
    let eps = vec!["a:1".to_string()];
    let session = SessionArgs {
        key: &key,
        ttl_s: 60,
        max_imbalance: 8,
        max_imbalance_ratio: 1.5,
    };
    let args = AcquireArgs {
        now_ms: 5,
        lease_ttl_ms: 6,
        request_id: "rid",
        cost: 1,
        cap: 0,
        random: 9,
        fingerprint: "fp",
        reclaim: 2,
        endpoints: Some(&eps),
        session: Some(session),
        wait_rank: None,
        pool_cap: 0,
        tenant: None,
        trials: 0,
    };
    let words = |q: Vec<u8>| -> Vec<String> {
        let Value::Array(Some(items)) = resp::decode_exact(&q).unwrap() else {
            panic!()
        };
        items
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    let glr = words(acquire_call(&s, true, &k, &args));
    assert_eq!(glr[2], "9");
    assert_eq!(glr[6], key);
    assert_eq!(
        &glr[20..],
        ["60", "8", "1.5", "0", "", "0", "1", "-1", "0", "a:1"]
    );
    let chain = PrefixChain {
        keys: vec!["p:{r|c}:px:1".to_string()],
        cached_tokens: vec![120],
        prompt_tokens: 150,
        stream: true,
    };
    let prefix = PrefixArgs {
        chain: &chain,
        ttl_s: 30,
        max_imbalance: 4,
        max_imbalance_ratio: 2.0,
        gate: crate::config::TokenGate::default(),
        latency: None,
    };
    let px = words(pick_call(&s, true, &k, &args, Some(&prefix)));
    assert_eq!(px[2], "15");
    assert_eq!(
        &px[6..11],
        [
            k.prefill.as_str(),
            &k.booked,
            &k.rates,
            &k.gen,
            &k.latency_coef
        ]
    );
    assert_eq!(&px[11..13], [chain.keys[0].as_str(), key.as_str()]);
    assert_eq!(
        &px[26..],
        [
            "30", "4", "2", "60", "0", "", "0", "1", "-1", // as glr, then the gate:
            "150", "0", "5000", "16000", "1", "0", // trials, then latency placement (off):
            "0", "0", "0", "0", "120", "a:1"
        ]
    );
    let latency = Some(LatencyArgs {
        slo_ttft_ms: 2_000,
        slo_tpot_ms: 50,
        sheddable: true,
    });
    let px = words(pick_call(
        &s,
        true,
        &k,
        &args,
        Some(&PrefixArgs { latency, ..prefix }),
    ));
    assert_eq!(&px[41..45], ["1", "2000", "50", "1"]);
}

#[test]
fn parses_session_states() {
    for (state, want) in [
        ("1", SessionState::Kept),
        ("2", SessionState::New),
        ("3", SessionState::Rebound),
    ] {
        let reply = resp::encode_command(&[b"OK".as_slice(), b"h:1", b"2", b"0", state.as_bytes()]);
        assert_eq!(
            parse_acquire(&reply),
            Ok(AcquireReply::Picked {
                endpoint: "h:1".into(),
                depth: 2,
                spilled: false,
                session: want,
                load_before: None,
                booked: None,
                all_ejected: false,
            })
        );
    }
    let bad = resp::encode_command(&[b"OK".as_slice(), b"h:1", b"0", b"0", b"x"]);
    assert!(matches!(parse_acquire(&bad), Err(ReplyError::Malformed(_))));
}

#[test]
fn parses_replies() {
    assert_eq!(
        parse_acquire(b"*6\r\n$2\r\nOK\r\n$6\r\nh:8000\r\n:0\r\n:0\r\n:0\r\n:7\r\n"),
        Ok(AcquireReply::Picked {
            endpoint: "h:8000".into(),
            depth: 0,
            spilled: false,
            session: SessionState::None,
            load_before: Some(7),
            booked: None,
            all_ejected: false,
        })
    );
    assert_eq!(
        parse_acquire(b"*6\r\n$2\r\nOK\r\n$6\r\nh:8000\r\n:3\r\n:1\r\n:1\r\n:0\r\n"),
        Ok(AcquireReply::Picked {
            endpoint: "h:8000".into(),
            depth: 3,
            spilled: true,
            session: SessionState::Kept,
            load_before: Some(0),
            booked: None,
            all_ejected: false,
        })
    );
    assert_eq!(
        parse_acquire(b"*2\r\n$4\r\nFULL\r\n$1\r\n3\r\n"),
        Ok(AcquireReply::Full)
    );
    assert_eq!(
        parse_acquire(b"*1\r\n$4\r\nSYNC\r\n"),
        Ok(AcquireReply::Sync)
    );
    assert_eq!(
        parse_acquire(b"-NOSCRIPT No matching script\r\n"),
        Err(ReplyError::NoScript)
    );
    assert!(matches!(
        parse_acquire(b"-ERR x\r\n"),
        Err(ReplyError::Redis(_))
    ));
    assert!(matches!(
        parse_acquire(b":1\r\n"),
        Err(ReplyError::Malformed(_))
    ));
    assert!(matches!(
        parse_acquire(b"*1\r\n$2\r\nOK\r\n"),
        Err(ReplyError::Malformed(_))
    ));
    assert!(matches!(
        parse_acquire(b"garbage"),
        Err(ReplyError::Malformed(_))
    ));
    assert_eq!(parse_release(b":1\r\n"), Ok(Released::Released));
    assert_eq!(parse_release(b":0\r\n"), Ok(Released::Nothing));
    assert_eq!(parse_release(b":2\r\n"), Ok(Released::Ejected));
    assert_eq!(parse_release(b":3\r\n"), Ok(Released::EjectionRefused));
    assert!(parse_release(b":4\r\n").is_err());
}

#[test]
fn the_ejection_mark_is_the_scripts_own() {
    let lua = include_str!("health.lua");
    let mark: f64 = lua
        .lines()
        .find_map(|l| l.strip_prefix("local EJECTED = "))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("health.lua defines EJECTED");
    assert_eq!(EJECTED_MARK, mark, "health.lua's EJECTED");
}
