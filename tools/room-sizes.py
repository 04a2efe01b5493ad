#!/usr/bin/env python3
"""Reports rooms that break the house rules of docs/architecture.md: a non-test Rust source file
over 400 lines that does not say why (a `//! Over 400 lines: <why>` header line), and a type
whose inherent impl (`impl Type {`, not `impl Trait for Type`) is over 400 lines or spread over
several files.

Usage: tools/room-sizes.py DIR...

A test file is one named tests.rs or *_tests.rs, or under a tests/ directory; target/ and
items under `#[cfg(test)]` are skipped. Types are told apart by name within one DIR; two
impls of one name count as one type's when one file's module holds the other's or both sit in
one folder (types of one name in unrelated modules are different types). Exits 1 if any rule
is broken, 0 otherwise.
"""

import os
import re
import sys
from collections import defaultdict

LIMIT = 400
IMPL = re.compile(r"^impl(?:<[^>]*>)?\s+([A-Za-z_][A-Za-z0-9_]*)(?:<[^{]*>)?\s*(?:where\b[^{]*)?\{\s*$")


def is_test(path):
    parts = path.split(os.sep)
    name = parts[-1]
    return name == "tests.rs" or name.endswith("_tests.rs") or "tests" in parts[:-1]


def says_why(lines):
    """Whether the file's header (its leading `//!` lines) says why it is over the limit."""
    for line in lines:
        if not line.startswith("//!"):
            return False
        if line.startswith("//! Over 400 lines:") and len(line.strip()) > len("//! Over 400 lines:") + 3:
            return True
    return False


def inherent_impls(lines):
    """(type, lines) of each top-level inherent impl outside `#[cfg(test)]` items."""
    out, test_item = [], False
    for i, line in enumerate(lines):
        if line.startswith("#[cfg(test)]"):
            test_item = True
            continue
        m = IMPL.match(line)
        if m and " for " not in line and not test_item:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "}"), i)
            out.append((m.group(1), end - i + 1))
        if line.strip() and not line.startswith("#"):
            test_item = False
    return out


def module_dir(path):
    """The folder a file's own child modules live in: `a/b.rs` and `a/b/mod.rs` -> `a/b`."""
    base, name = os.path.split(path)
    return base if name in ("mod.rs", "lib.rs", "main.rs") else os.path.join(base, name[:-3])


def related(a, b):
    da, db = module_dir(a), module_dir(b)
    return (os.path.dirname(a) == os.path.dirname(b) or da.startswith(db + os.sep)
            or db.startswith(da + os.sep))


def impl_breaches(files):
    """Types whose inherent impl is over LIMIT lines, or spread over related files."""
    by_type = defaultdict(list)
    for path, lines in files:
        for ty, n in inherent_impls(lines):
            by_type[ty].append((path, n))
    out = []
    for ty, places in sorted(by_type.items()):
        for path, n in places:
            if n > LIMIT:
                out.append(f"{path}: impl {ty} is {n} lines (over {LIMIT}: split the type)")
        paths = sorted({p for p, _ in places})
        spread = [(a, b) for i, a in enumerate(paths) for b in paths[i + 1:] if related(a, b)]
        if spread:
            a, b = spread[0]
            out.append(f"{a}, {b}: impl {ty} in several files (one type's impl is in one file)")
    return out


def main(dirs):
    over, breaches = [], []
    for top in dirs:
        sources = []
        for root, subdirs, files in os.walk(top):
            subdirs[:] = [d for d in subdirs if d != "target"]
            for f in files:
                path = os.path.join(root, f)
                if not f.endswith(".rs") or is_test(path):
                    continue
                with open(path, encoding="utf-8") as fh:
                    lines = fh.readlines()
                sources.append((path, lines))
                n = len(lines)
                if n > LIMIT and not says_why(lines):
                    over.append((n, path))
        breaches += impl_breaches(sources)
    for n, path in sorted(over, reverse=True):
        print(
            f"{path}: {n} lines (over {LIMIT}; split it by what its parts hold, or say why "
            "in a `//! Over 400 lines: ...` header line)"
        )
    for b in breaches:
        print(b)
    return 1 if over or breaches else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["."]))
