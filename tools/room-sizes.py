#!/usr/bin/env python3
"""Reports non-test Rust source files over 400 lines that do not say why (the house rule:
small files named for what they hold; a file over 400 lines says why in its header with a
`//! Over 400 lines: <why>` line; docs/architecture.md).

Usage: tools/room-sizes.py DIR...

A test file is one named tests.rs or *_tests.rs, or under a tests/ directory; target/ is
skipped. Exits 1 if any other .rs file under DIR is over the limit without that line, 0
otherwise.
"""

import os
import sys

LIMIT = 400


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


def main(dirs):
    over = []
    for top in dirs:
        for root, subdirs, files in os.walk(top):
            subdirs[:] = [d for d in subdirs if d != "target"]
            for f in files:
                path = os.path.join(root, f)
                if not f.endswith(".rs") or is_test(path):
                    continue
                with open(path, encoding="utf-8") as fh:
                    lines = fh.readlines()
                n = len(lines)
                if n > LIMIT and not says_why(lines):
                    over.append((n, path))
    for n, path in sorted(over, reverse=True):
        print(
            f"{path}: {n} lines (over {LIMIT}; split it by what its parts hold, or say why "
            "in a `//! Over 400 lines: ...` header line)"
        )
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["."]))
