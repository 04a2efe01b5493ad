use super::*;

#[test]
fn decision_counters_are_indexed_by_their_discriminants() {
    for (i, p) in Policy::ALL.iter().enumerate() {
        assert_eq!(*p as usize, i, "{p:?}");
    }
    for (i, o) in Outcome::ALL.iter().enumerate() {
        assert_eq!(*o as usize, i, "{o:?}");
    }
    let names = Stats::names();
    for p in Policy::ALL {
        for o in Outcome::ALL {
            let at = Stats::index(Counter::Decision(p, o));
            assert_eq!(
                names.get(at).map(String::as_str),
                Some(format!("ai_lb.{}.{}", p.metric_label(), o.name()).as_str())
            );
        }
    }
}

#[test]
fn every_counter_has_its_own_name() {
    let names = Stats::names();
    let mut counters: Vec<Counter> = Vec::new();
    for p in Policy::ALL {
        for o in Outcome::ALL {
            counters.push(Counter::Decision(p, o));
        }
    }
    counters.extend(FIXED.iter().map(|(c, _)| *c));
    counters.extend(Cause::ALL.iter().map(|&c| Counter::Fallback(c)));
    let mut seen = std::collections::HashSet::new();
    for c in counters {
        let i = Stats::index(c);
        assert!(seen.insert(i), "{c:?} shares index {i}");
        assert!(i < names.len());
    }
    assert_eq!(seen.len(), names.len());
    assert_eq!(
        names[Stats::index(Counter::Decision(Policy::PrefixCache, Outcome::Routed))],
        "ai_lb.prefix.routed"
    );
    assert_eq!(
        names[Stats::index(Counter::Fallback(Cause::NoMetrics))],
        "ai_lb.fallback.no_metrics"
    );
}
