//! The verified-index test on real engines, for both builds (tests/e2e/real_engine/verify.rs,
//! envoy_real_engine.rs): what llama-server reports as `cached_tokens` drives the index.
//! Engines with a slot per conversation keep every conversation's prompt, so no answer comes
//! back short; one engine restarted (killed and started on the same port, its cache empty)
//! answers its conversations' next turns with nothing cached, and at the FLUSH_CONVERSATIONS-th
//! on a worker the plugin bumps its generation: its other conversations are no longer hits on
//! it, and the one that found out keeps it, cached again there.

use crate::llama::{self, Engine, EngineConfig};
use crate::real::{ask, conversation, Answer};
use ailb_core::verify::flush::FLUSH_CONVERSATIONS;
use ailb_testkit::wait_until;
use std::collections::BTreeMap;
use std::time::Duration;

/// Conversations over the tests' two engines: the one restarted must hold more than the
/// short answers it takes to find it out (FLUSH_CONVERSATIONS on each plugin worker, 8), with
/// some left over, and no more than its slots.
pub const CONVERSATIONS: usize = 48;

/// Engines with a slot for every conversation they may hold (a slot keeps its last prompt;
/// `--cache-ram 0` keeps nothing else), 768 tokens each: a conversation's fourth turn is ~320.
/// A slot for each of the [`CONVERSATIONS`]: the first turns split them up to 32 / 16
/// (measured), and an engine given more conversations than slots would answer short with no
/// restart.
pub fn roomy() -> EngineConfig {
    EngineConfig {
        slots: CONVERSATIONS,
        context: CONVERSATIONS * 768,
        threads: 1,
    }
}

/// Runs the conversations through the prefix_cache route at `url` (with the debug header
/// `debug`) over `engines`, restarts the busiest, and checks what the plugin's counters
/// (`stat`) and the engines' usage say; the proxy runs `workers` plugin workers.
pub fn restarted_engine_is_found_out(
    url: &str,
    debug: &str,
    engines: &mut [Engine],
    workers: usize,
    stat: &dyn Fn(&str) -> i64,
) {
    let addrs = llama::addrs(engines);
    let send = |c: usize, turns: usize| -> Answer {
        let a = ask(url, debug, &conversation(c, turns));
        assert_eq!(a.status, 200, "conversation {c} turn {turns}");
        a
    };
    let mut pod_of = BTreeMap::new();
    for c in 0..CONVERSATIONS {
        pod_of.insert(c, send(c, 1).endpoint);
    }
    for c in 0..CONVERSATIONS {
        let a = send(c, 2);
        assert_eq!(
            (&a.endpoint, a.reason.as_str()),
            (&pod_of[&c], "prefix_hit")
        );
        // The whole first turn's prompt but its last tokens (the template's end) came from
        // the engine's cache.
        assert!(a.cached_tokens * 10 >= a.prompt_tokens * 6, "{a:?}");
    }
    // Counted as each answer ends, which may be a moment after its client has it all.
    let want = 2 * CONVERSATIONS as i64;
    wait_until(Duration::from_secs(2), || {
        stat("ai_lb.prefix.verified") == want
    });
    let verified = stat("ai_lb.prefix.verified");
    let cached = stat("ai_lb.prefix.cached_tokens");
    assert_eq!(verified, want);
    assert_eq!(
        (
            stat("ai_lb.prefix.shortfall"),
            stat("ai_lb.prefix.shortfall_mild")
        ),
        (0, 0),
        "every slot kept its prompt, judged in the engine's own tokens"
    );
    let per_engine: i64 = addrs
        .iter()
        .map(|a| stat(&format!("ai_lb.prefix.verified.{a}.cached_tokens")))
        .sum();
    assert_eq!(per_engine, cached);

    let mut count: BTreeMap<&String, usize> = BTreeMap::new();
    for p in pod_of.values() {
        *count.entry(p).or_default() += 1;
    }
    eprintln!("warm: {verified} verified, {cached} cached tokens, conversations {count:?}");
    let (flushed, on_it) = count.into_iter().max_by_key(|(_, n)| *n).unwrap();
    let flushed = flushed.clone();
    assert!(
        on_it > workers * FLUSH_CONVERSATIONS,
        "{on_it} conversations on {flushed}"
    );
    let i = addrs.iter().position(|a| *a == flushed).unwrap();
    engines[i].restart().unwrap();

    // Its conversations' next turns: still predicted there, answered with (next to) nothing
    // cached, until the FLUSH_CONVERSATIONS-th bumps its generation.
    let mut mine = (0..CONVERSATIONS).filter(|c| pod_of[c] == flushed);
    let mut bumper = None;
    for c in mine.by_ref() {
        let a = send(c, 3);
        assert_eq!((&a.endpoint, a.reason.as_str()), (&flushed, "prefix_hit"));
        assert!(a.cached_tokens * 10 < a.prompt_tokens, "{a:?}");
        // Counted at the answer's end: a moment, not more, as the window for the run is
        // FLUSH_WINDOW_MS (10 s).
        if wait_until(Duration::from_millis(150), || {
            stat("ai_lb.prefix.generation_bumps") == 1
        }) {
            bumper = Some(c);
            break;
        }
    }
    let bumper = bumper.expect("no generation bump");
    // Each worker finds the flush out on its own, from its own short answers: with
    // `workers` of them, FLUSH_CONVERSATIONS up to `workers` × FLUSH_CONVERSATIONS.
    let shortfalls = stat("ai_lb.prefix.shortfall") as usize;
    eprintln!("{shortfalls} shortfalls to find engine-{i}'s restart out");
    assert!(
        (FLUSH_CONVERSATIONS..=workers * FLUSH_CONVERSATIONS).contains(&shortfalls),
        "{shortfalls} shortfalls"
    );
    let left: Vec<usize> = mine.collect();
    assert!(!left.is_empty());
    for c in left {
        let a = send(c, 3);
        assert!(
            !(a.endpoint == flushed && a.reason == "prefix_hit"),
            "conversation {c} still a hit on the restarted engine: {a:?}"
        );
    }
    // The one that found out was re-recorded at the new generation, and the engine has its
    // third turn now: a hit there, in the engine's own usage too.
    let a = send(bumper, 4);
    assert_eq!((&a.endpoint, a.reason.as_str()), (&flushed, "prefix_hit"));
    assert!(a.cached_tokens * 10 >= a.prompt_tokens * 6, "{a:?}");
    assert_eq!(stat("ai_lb.prefix.generation_bumps"), 1);
}
