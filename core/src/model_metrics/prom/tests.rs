use super::*;

fn one(line: &str) -> Sample {
    let e = parse(line.as_bytes());
    assert_eq!(e.stats.malformed, 0, "{line}: {:?}", e.stats.first_error);
    assert_eq!(e.samples.len(), 1, "{line}");
    e.samples.into_iter().next().unwrap()
}

fn err(line: &str) -> LineError {
    let e = parse(line.as_bytes());
    assert!(e.samples.is_empty(), "{line}");
    e.stats.first_error.unwrap().1
}

#[test]
fn sample_lines() {
    let s = one("vllm:num_requests_waiting{model_name=\"m\",engine=\"0\"} 3");
    assert_eq!(s.name, "vllm:num_requests_waiting");
    assert_eq!(s.label("engine"), Some("0"));
    assert_eq!(s.value, 3.0);
    assert_eq!(s.timestamp_ms, None);

    let cases: &[(&str, f64)] = &[
        ("a 1.7382173358407154e+09", 1.7382173358407154e9),
        ("a -1.0", -1.0),
        ("a +Inf", f64::INFINITY),
        ("a -Inf", f64::NEG_INFINITY),
        ("a 1E-3", 0.001),
        ("a{} 2", 2.0),
        ("a{b=\"c\",} 4", 4.0),
        ("a { b = \"c\" , } 5", 5.0),
        ("a{b=\"c\"}6", 6.0),
        ("  a\t7  ", 7.0),
        ("_x:y_total 8", 8.0),
    ];
    for (line, want) in cases {
        assert_eq!(one(line).value, *want, "{line}");
    }
    assert!(one("a NaN").value.is_nan());
    assert_eq!(
        one("a 1 1700000000000").timestamp_ms,
        Some(1_700_000_000_000)
    );
    assert_eq!(one("a 1 -5").timestamp_ms, Some(-5));
    assert_eq!(one("a 1 1.7e12").timestamp_ms, Some(1_700_000_000_000));
}

#[test]
fn label_escapes() {
    let s = one(r#"a{p="C:\\dir",q="say \"hi\"",r="l1\nl2",u="ü ✓"} 1"#);
    assert_eq!(s.label("p"), Some(r"C:\dir"));
    assert_eq!(s.label("q"), Some("say \"hi\""));
    assert_eq!(s.label("r"), Some("l1\nl2"));
    assert_eq!(s.label("u"), Some("ü ✓"));
}

#[test]
fn malformed_lines_are_typed() {
    let cases: &[(&str, LineError)] = &[
        ("9abc 1", LineError::BadMetricName),
        ("a{9=\"x\"} 1", LineError::BadLabelName),
        ("a{b\"x\"} 1", LineError::MissingEquals),
        ("a{b=x} 1", LineError::MissingQuote),
        ("a{b=\"x", LineError::UnterminatedLabelValue),
        ("a{b=\"x\\", LineError::UnterminatedLabelValue),
        ("a{b=\"\\t\"} 1", LineError::BadEscape),
        ("a{b=\"x\"", LineError::UnterminatedLabels),
        ("a{b=\"x\" c=\"y\"} 1", LineError::UnterminatedLabels),
        ("a", LineError::MissingValue),
        ("a{b=\"x\"}", LineError::MissingValue),
        ("a.5", LineError::MissingValue),
        ("a one", LineError::BadValue),
        ("a 0x10", LineError::BadValue),
        ("a 1 soon", LineError::BadTimestamp),
        ("a 1 2 3", LineError::TrailingGarbage),
    ];
    for (line, want) in cases {
        assert_eq!(err(line), *want, "{line}");
    }
    let mut bad = b"a{b=\"".to_vec();
    bad.extend_from_slice(&[0xff, 0xfe]);
    bad.extend_from_slice(b"\"} 1");
    assert_eq!(
        parse(&bad).stats.first_error,
        Some((1, LineError::InvalidUtf8))
    );
}

#[test]
fn comments_types_blank_lines_and_crlf() {
    let text = "# HELP a Help with \\ and \"quotes\"\r\n# TYPE a gauge\r\n\r\n# random comment\r\n#\r\n\
                # TYPE h histogram\r\n# TYPE w weird\r\n# TYPE\r\na 1\r\nh_bucket{le=\"+Inf\"} 2\r\n\
                h_sum 3.5\r\nh_count 2\r\nc_total 4\r\nc_created 1.7e9\r\n";
    let e = parse(text.as_bytes());
    assert_eq!(e.stats.malformed, 0, "{:?}", e.stats.first_error);
    assert_eq!(e.samples.len(), 6);
    assert_eq!(e.metric_type("a"), Some(MetricType::Gauge));
    assert_eq!(e.metric_type("h"), Some(MetricType::Histogram));
    assert_eq!(e.metric_type("w"), Some(MetricType::Other));
    assert_eq!(
        e.series("h_bucket").next().unwrap().label("le"),
        Some("+Inf")
    );
    assert_eq!(
        e.series("c_total").count(),
        1,
        "exact names, no prefix match"
    );
    assert_eq!(e.stats.lines, 15);
}

#[test]
fn garbage_is_skipped_and_counted() {
    let e = parse(b"a 1\n}}}{{{\nb 2\n=\n\"x\" 1\nc 3\n");
    assert_eq!(e.samples.len(), 3);
    assert_eq!(e.stats.malformed, 3);
    assert_eq!(e.stats.first_error, Some((2, LineError::BadMetricName)));
}

#[test]
fn filtered_parse_skips_unwanted() {
    let text = "# TYPE a gauge\n# TYPE b gauge\na 1\nb{x=\"y\"} 2\nb{broken 3\n";
    let e = parse_filtered(text.as_bytes(), |n| n == "a");
    assert_eq!(e.samples.len(), 1);
    assert_eq!(e.types, vec![("a".to_owned(), MetricType::Gauge)]);
    assert_eq!(e.stats.filtered_out, 2);
    assert_eq!(e.stats.malformed, 0, "unwanted lines are not validated");
}

#[test]
fn limits_truncate_with_a_flag() {
    let many_labels: String = (0..=MAX_LABELS).map(|i| format!("l{i}=\"v\",")).collect();
    assert_eq!(
        err(&format!("a{{{many_labels}}} 1")),
        LineError::TooManyLabels
    );
    let long = "x".repeat(MAX_LABEL_VALUE_LEN + 1);
    assert_eq!(
        err(&format!("a{{b=\"{long}\"}} 1")),
        LineError::LabelValueTooLong
    );
    let long_esc = "\\n".repeat(MAX_LABEL_VALUE_LEN + 1);
    assert_eq!(
        err(&format!("a{{b=\"{long_esc}\"}} 1")),
        LineError::LabelValueTooLong
    );
    assert_eq!(
        err(&format!("{} 1", "n".repeat(MAX_NAME_LEN + 1))),
        LineError::NameTooLong
    );

    let series = "a 1\n".repeat(MAX_SERIES + 5);
    let e = parse(series.as_bytes());
    assert_eq!(e.samples.len(), MAX_SERIES);
    assert_eq!(e.stats.truncated, Some(Truncation::Series));

    let lines = "\n".repeat(MAX_LINES + 5);
    let e = parse(lines.as_bytes());
    assert_eq!(e.stats.lines, MAX_LINES);
    assert_eq!(e.stats.truncated, Some(Truncation::Lines));

    // The cut lands inside "a 123456…"; the partial line must not be read as a value.
    let mut big = "#".repeat(MAX_INPUT_BYTES - 5).into_bytes();
    big.push(b'\n');
    big.extend_from_slice(b"a 1234567\n");
    let e = parse(&big);
    assert_eq!(e.stats.truncated, Some(Truncation::InputBytes));
    assert!(e.samples.is_empty());
}

/// The scraper reads at most 4 MiB, so a bigger page arrives as exactly 4 MiB: that is a cut
/// page too. Before, only a page over 4 MiB was, and `1234` cut to `12` was read as 12.
#[test]
fn a_page_of_exactly_the_limit_is_cut_and_its_partial_line_dropped() {
    // What arrives of a page whose line `q{engine="1"} 1234` straddles the 4 MiB mark.
    let tail = "a 1\nq{engine=\"0\"} 7\nq{engine=\"1\"} 12";
    let mut cut = "#".repeat(MAX_INPUT_BYTES - tail.len() - 1).into_bytes();
    cut.push(b'\n');
    cut.extend_from_slice(tail.as_bytes());
    assert_eq!(cut.len(), MAX_INPUT_BYTES);
    let e = parse(&cut);
    assert_eq!(e.stats.truncated, Some(Truncation::InputBytes));
    let q: Vec<f64> = e.series("q").map(|s| s.value).collect();
    assert_eq!(q, vec![7.0], "the partial `12` is dropped, not read as 12");
    assert_eq!(e.open_family.as_deref(), Some("q"));
    assert!(!e.is_complete("q"), "engine 1 may lie past the cut");
    assert!(e.is_complete("a"), "a whole family before the cut");
    assert!(
        !e.is_complete("absent"),
        "absent from a cut page proves nothing"
    );

    // One byte shorter than the limit: a whole page, read as is.
    let mut whole = cut.clone();
    whole.truncate(MAX_INPUT_BYTES - 1);
    let e = parse(&whole);
    assert_eq!(e.stats.truncated, None);
    assert_eq!(e.open_family, None);
    assert!(e.is_complete("absent"));
}

#[test]
fn a_producer_limit_cuts_a_smaller_page() {
    let text = "# TYPE w_total counter\nw_total{e=\"0\"} 5\nw_created{e=\"0\"} 1.7e9\nx 1\ny 22";
    // Higress-style: the body was cut at 64 KiB; here at the page's own length.
    let e = parse_page(text.as_bytes(), text.len(), |_| true);
    assert_eq!(e.stats.truncated, Some(Truncation::InputBytes));
    assert!(e.series("y").next().is_none(), "`y 22` may be `y 2234`");
    // The partial line names `y` whole: `x` ended before the cut, `y` is the open family.
    assert_eq!(e.open_family.as_deref(), Some("y"));
    assert!(e.is_complete("x") && !e.is_complete("y"));
    assert!(e.is_complete("w_total"), "its family closed before the cut");
    // Cut inside the name: `y` could still be `x_…`? No `x` name starts with `y`, so `x` is
    // whole; a partial `x_to` may be `x_total`, so `x` stays open.
    for (tail, x_whole) in [("y", true), ("x_to", false), ("x", false), ("   ", false)] {
        let t = format!("w_total 5\nx 1\n{tail}");
        let e = parse_page(t.as_bytes(), t.len(), |_| true);
        assert_eq!(e.is_complete("x"), x_whole, "{tail:?}");
        assert!(e.is_complete("w_total"));
    }
    // A `# HELP` / `# TYPE` line of the next family closes the one before it.
    let t = "x 1\n# HELP y the next\n# TYPE y gauge\n";
    let e = parse_page(t.as_bytes(), t.len(), |_| true);
    assert_eq!(e.open_family.as_deref(), Some("y"));
    assert!(e.is_complete("x") && !e.is_complete("y"));
    let e = parse_page(text.as_bytes(), text.len() + 1, |_| true);
    assert_eq!(
        (e.stats.truncated, e.series("y").next().map(|s| s.value)),
        (None, Some(22.0))
    );
    // The family of a filtered line counts as open too: `w_created` is `w`'s.
    let t2 = "w_total 5\nw_created 1.7e9\n";
    let e = parse_page(t2.as_bytes(), t2.len(), |n| n == "w_total");
    assert_eq!(e.open_family.as_deref(), Some("w"));
    assert!(!e.is_complete("w_total"));
}

#[test]
fn families_strip_counter_and_histogram_suffixes() {
    for (name, fam) in [
        ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"),
        ("vllm:prefix_cache_hits_created", "vllm:prefix_cache_hits"),
        ("h_bucket", "h"),
        ("h_sum", "h"),
        ("h_count", "h"),
        ("vllm:num_requests_waiting", "vllm:num_requests_waiting"),
    ] {
        assert_eq!(family(name), fam);
    }
}

/// Prometheus 3 writes a name that is not a legacy name (and may write any name) quoted
/// inside the braces, label names too (text format 1.0 with UTF-8 names).
#[test]
fn quoted_names_are_read() {
    let s = one(r#"{"vllm:num_requests_waiting",model_name="x"} 3"#);
    assert_eq!(
        (s.name.as_str(), s.label("model_name"), s.value),
        ("vllm:num_requests_waiting", Some("x"), 3.0)
    );
    let s = one(r#"{ "my.metric" , "label.with.dots"="v", engine="0" } 4 1700000000000"#);
    assert_eq!(s.name, "my.metric");
    assert_eq!(s.label("label.with.dots"), Some("v"));
    assert_eq!(s.timestamp_ms, Some(1_700_000_000_000));
    assert_eq!(one(r#"{"a\"b"} 5"#).name, "a\"b");
    assert_eq!(one(r#"{"a"}6"#).value, 6.0);
    let text = "# HELP \"vllm:num_requests_waiting\" Waiting.\n# TYPE \"vllm:num_requests_waiting\" gauge\n{\"vllm:num_requests_waiting\"} 1\n";
    let e = parse(text.as_bytes());
    assert_eq!(
        e.metric_type("vllm:num_requests_waiting"),
        Some(MetricType::Gauge)
    );
    assert_eq!(e.samples.len(), 1);
    // As Prometheus's own parser (prometheus/common expfmt): the name may stand anywhere in
    // the set, once; label names may be quoted after a plain name too.
    let s = one(r#"{labelname="value", "my.noncompliant.metric"} 1"#);
    assert_eq!(
        (s.name.as_str(), s.label("labelname")),
        ("my.noncompliant.metric", Some("value"))
    );
    assert_eq!(
        one(r#"metric_name{"foo"="bar", "dotted.label"="bla"} 3.14"#).label("dotted.label"),
        Some("bla")
    );
    for bad in [
        r#"{"a"="b"} 1"#,
        r#"{""} 1"#,
        r#"{a="b"} 1"#,
        r#"{"one.name","another.name"} 3.14"#,
    ] {
        assert_eq!(err(bad), LineError::BadMetricName, "{bad}");
    }
    assert_eq!(err(r#"{"a" 1"#), LineError::UnterminatedLabels);
    assert_eq!(err(r#"a{"b"} 1"#), LineError::BadMetricName);
    // The filter sees the unquoted name.
    let e = parse_filtered(
        br#"{"a"} 1
{"b"} 2
"#,
        |n| n == "b",
    );
    assert_eq!((e.samples.len(), e.stats.filtered_out), (1, 1));
}

/// A malformed line marks its family (issue 39 item 1), and a line whose name is damaged the
/// families around it, and makes absence prove nothing.
#[test]
fn malformed_lines_mark_their_family() {
    let e = parse(b"a{x=\"1\"} 1\na{x=\"2} 2\nb_total 3\nc 4\n");
    assert_eq!(e.malformed_families, vec!["a"]);
    assert_eq!(e.gap("a"), Some(Gap::Malformed));
    assert_eq!(
        (e.gap("b_total"), e.gap("c"), e.gap("absent")),
        (None, None, None)
    );
    let e = parse(b"a 1\n\x01b 2\nc_bucket 3\nd 4\n");
    assert!(e.malformed_unnamed);
    assert_eq!(e.malformed_families, vec!["a", "c"]);
    assert_eq!(e.gap("d"), None);
    assert_eq!(e.gap("absent"), Some(Gap::Malformed));
    // A name damaged in its middle is not taken for the name before the damage.
    let e = parse_filtered(b"a 1\nwai?ting 2\nb 3\n", |n| n != "wai");
    assert_eq!((e.stats.malformed, e.stats.filtered_out), (1, 0));
    assert_eq!(e.malformed_families, vec!["a", "b"]);
    // A wanted name's line with a label over the limit: that family, named.
    let long = format!("lora{{v=\"{}\"}} 1\n", "x".repeat(MAX_LABEL_VALUE_LEN + 1));
    let e = parse(long.as_bytes());
    assert_eq!(e.malformed_families, vec!["lora"]);
    assert_eq!(e.stats.first_error, Some((1, LineError::LabelValueTooLong)));
    // vLLM's LoRA family takes long lists.
    let lora = format!(
        "vllm:lora_requests_info{{running_lora_adapters=\"{}\"}} 1\n",
        "x".repeat(MAX_LABEL_VALUE_LEN + 1)
    );
    assert_eq!(parse(lora.as_bytes()).samples.len(), 1);
}
