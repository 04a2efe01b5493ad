#!/usr/bin/env python3
"""Reports non-test Rust source files over 400 lines (the house rule: small files named for
what they hold; docs/architecture.md).

Usage: tools/room-sizes.py DIR...

A test file is one named tests.rs or *_tests.rs, or under a tests/ directory; target/ is
skipped. Exits 1 if any other .rs file under DIR is over the limit, 0 otherwise.
"""

import os
import sys

LIMIT = 400


def is_test(path):
    parts = path.split(os.sep)
    name = parts[-1]
    return name == "tests.rs" or name.endswith("_tests.rs") or "tests" in parts[:-1]


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
                    n = sum(1 for _ in fh)
                if n > LIMIT:
                    over.append((n, path))
    for n, path in sorted(over, reverse=True):
        print(f"{path}: {n} lines (over {LIMIT}; split it by what its parts hold)")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["."]))
