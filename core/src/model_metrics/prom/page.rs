//! Reading a page line by line, and telling which families the page may not hold whole: the
//! one a cut went through, and those a malformed line belongs to. The text format keeps a
//! family's lines together (its `# HELP` / `# TYPE`, then its samples), so the family of the
//! last line naming one is the only one a cut can go through, and a line whose name is
//! damaged belongs to the family before or after it.

use super::exposition::{
    family, Exposition, Truncation, MAX_INPUT_BYTES, MAX_LINES, MAX_MALFORMED_FAMILIES, MAX_SERIES,
    MAX_TYPES, SUFFIXES,
};
use super::line::{parse_line, Line};
use crate::model_metrics::scan::{Cursor, Lines};
use std::borrow::Cow;

pub(super) fn parse_page<F: FnMut(&str) -> bool>(
    input: &[u8],
    cut_at: usize,
    mut wanted: F,
) -> Exposition {
    let mut out = Exposition::default();
    let head = input.get(..MAX_INPUT_BYTES).unwrap_or(input);
    let (body, partial): (&[u8], &[u8]) = if input.len() >= cut_at.clamp(1, MAX_INPUT_BYTES) {
        out.stats.truncated = Some(Truncation::InputBytes);
        // Drop the partial last line so a cut value ("0.12" of "0.125") is never read.
        match head.iter().rposition(|&b| b == b'\n') {
            Some(nl) => (
                head.get(..nl).unwrap_or_default(),
                head.get(nl + 1..).unwrap_or_default(),
            ),
            None => (&[], head),
        }
    } else {
        (input, &[])
    };
    // The last line naming a family (its name as given), and whether a line with a damaged
    // name waits for the next sample line's family to be marked.
    let mut last: Option<Cow<'_, str>> = None;
    let mut unnamed_pending = false;
    for raw in Lines::new(body) {
        if out.stats.lines >= MAX_LINES {
            out.stats.truncated = Some(Truncation::Lines);
            break;
        }
        out.stats.lines += 1;
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        match parse_line(line, &mut wanted) {
            Ok(Line::Skip) => {}
            Ok(Line::Comment(name)) => last = Some(name),
            Ok(Line::Type(name, ty)) => {
                if out.types.len() < MAX_TYPES {
                    out.types.push((name.clone().into_owned(), ty));
                }
                last = Some(name);
            }
            Ok(Line::Filtered(name)) => {
                out.stats.filtered_out += 1;
                if std::mem::take(&mut unnamed_pending) {
                    mark(&mut out, &name);
                }
                last = Some(name);
            }
            Ok(Line::Sample(s, name)) => {
                if std::mem::take(&mut unnamed_pending) {
                    mark(&mut out, &name);
                }
                last = Some(name);
                if out.samples.len() >= MAX_SERIES {
                    out.stats.truncated = Some(Truncation::Series);
                    break;
                }
                out.samples.push(s);
            }
            Err(bad) => {
                out.stats.malformed += 1;
                if out.stats.first_error.is_none() {
                    out.stats.first_error = Some((out.stats.lines, bad.error));
                }
                match bad.name {
                    Some(name) => {
                        mark(&mut out, &name);
                        last = Some(name);
                    }
                    None => {
                        out.malformed_unnamed = true;
                        if let Some(l) = &last {
                            mark(&mut out, l);
                        }
                        unnamed_pending = true;
                    }
                }
            }
        }
    }
    out.stats.samples = out.samples.len();
    if out.stats.truncated.is_some() {
        if out.stats.truncated == Some(Truncation::InputBytes) {
            last = after_partial(partial, last);
        }
        out.open_family = last.map(|n| family(&n).to_owned());
    }
    out
}

/// Marks `name`'s family as holding a malformed line; past [`MAX_MALFORMED_FAMILIES`] the list
/// stops growing and every family reads as damaged.
fn mark(out: &mut Exposition, name: &str) {
    let fam = family(name);
    if out.malformed_families.len() > MAX_MALFORMED_FAMILIES
        || out.malformed_families.iter().any(|f| f == fam)
    {
        return;
    }
    out.malformed_families.push(fam.to_owned());
}

/// The family the cut went through, given the partial line it left: a partial line that
/// begins another family (its name read whole, or cut to a beginning no name of `last`'s family
/// has) proves `last`'s family ended before the cut; its own family is then the open one.
fn after_partial<'a>(partial: &'a [u8], last: Option<Cow<'a, str>>) -> Option<Cow<'a, str>> {
    let Some((name, whole)) = partial_name(partial) else {
        return last;
    };
    let other = match &last {
        None => true,
        Some(l) if whole => family(name) != family(l),
        Some(l) => !could_be_of(name, family(l)),
    };
    if other {
        Some(Cow::Borrowed(name))
    } else {
        last
    }
}

/// The metric name a partial line starts with (a sample line, or a `# HELP` / `# TYPE` line),
/// and whether it is whole (something follows it). `None` when the line names nothing yet.
fn partial_name(partial: &[u8]) -> Option<(&str, bool)> {
    let mut c = Cursor { s: partial, i: 0 };
    c.skip_ws();
    if c.eat(b'#') {
        c.skip_ws();
        if !(c.eat_word(b"HELP") || c.eat_word(b"TYPE")) {
            return None;
        }
        c.skip_ws();
    }
    let name = c.metric_name().ok()?;
    Some((name, c.peek().is_some()))
}

/// Whether a name cut to `prefix` could still be a series of family `fam` (`fam`, or `fam`
/// with a counter, histogram or summary suffix).
fn could_be_of(prefix: &str, fam: &str) -> bool {
    fam.starts_with(prefix)
        || prefix
            .strip_prefix(fam)
            .is_some_and(|rest| SUFFIXES.iter().any(|s| s.starts_with(rest)))
}
