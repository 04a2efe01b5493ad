#!/usr/bin/env python3
"""Reports import loops between the modules of a Rust crate.

Usage: tools/import-loops.py DIR...   (DIR = a crate's src/ directory, or the crate directory)

A loop is module A referring to module B while B (directly or through other modules) refers
back to A, within one crate. A reference is any path into another module of the same crate:
`use crate::…`, `use super::…`, `use self::…`, a `use` of a child module, and the same paths
written inline in code (`crate::a::f()`), since inlining a path does not remove the dependency.
`mod x;` declarations are not references, and neither is code under `#[cfg(test)]`.

Every crate root under DIR is checked: lib.rs, main.rs and bin/*.rs. Exits 1 if any loop is
found (each loop is printed with the references inside it), 2 on a usage error, 0 otherwise.

A crate whose root holds `balancer/policies/` (ailb-core) is also held to the policy-folder
rule of docs/architecture.md: a policy's folder (a directory under it) is referred to only
from inside itself and from `policies/mod.rs` (its registration line), apart from the pairs in
FOLDER_ALLOWED; and the modules in NOT_THE_DISPATCHER never refer to the dispatcher's module.
"""

import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments_and_strings(src):
    """Blanks comments, string and char literals (keeping newlines) so paths inside them and
    braces inside them do not count."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        nxt = src[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = src.find("\n", i)
            i = n if j < 0 else j
            continue
        if c == "/" and nxt == "*":
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if src[i] == "\n":
                        out.append("\n")
                    i += 1
            out.append(" ")
            continue
        raw = re.match(r'(?:b?r)(#*)"', src[i:i + 260]) if c in "br" else None
        if raw and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            end = src.find('"' + raw.group(1), i + raw.end())
            end = n if end < 0 else end + 1 + len(raw.group(1))
            out.append('""' + "\n" * src.count("\n", i, end))
            i = end
            continue
        if c == '"' or (c == "b" and nxt == '"' and (i == 0 or not src[i - 1].isalnum())):
            i += 1 if c == '"' else 2
            while i < n and src[i] != '"':
                if src[i] == "\n":
                    out.append("\n")
                i += 2 if src[i] == "\\" else 1
            out.append('""')
            i += 1
            continue
        if c == "'":
            # A char literal ('x', '\n', '\u{..}') or a lifetime ('a): only literals close.
            if nxt == "\\":
                j = src.find("'", i + 3)
                i = n if j < 0 else j + 1
                out.append("' '")
                continue
            if i + 2 < n and src[i + 2] == "'":
                out.append("' '")
                i += 3
                continue
        out.append(c)
        i += 1
    return "".join(out)


def matching_brace(text, open_at):
    depth = 0
    for k in range(open_at, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return len(text) - 1


def strip_cfg_test(text):
    """Removes items under #[cfg(test)] (a `mod tests { … }` block or a single item)."""
    while True:
        m = re.search(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]", text)
        if not m:
            return text
        k = m.end()
        # The item ends at its first top-level `;` or at the brace closing its first `{`.
        while k < len(text) and text[k] not in "{;":
            k += 1
        end = matching_brace(text, k) if k < len(text) and text[k] == "{" else k
        text = text[: m.start()] + "\n" * text.count("\n", m.start(), end + 1) + text[end + 1:]


def expand_use_tree(tree):
    """`a::{b, c::{d, e}}` -> [[a, b], [a, c, d], [a, c, e]] (globs and renames dropped)."""
    # Renames go first, while `as` is still a separate word (`least_request` contains "as").
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    paths = []

    def walk(prefix, s):
        # Split s at top-level commas.
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            cur += ch
        parts.append(cur)
        for p in parts:
            if not p:
                continue
            brace = p.find("{")
            if brace >= 0:
                head = [x for x in p[:brace].split("::") if x]
                walk(prefix + head, p[brace + 1:p.rfind("}")])
            else:
                segs = [x for x in p.split("::") if x and x != "*"]
                paths.append(prefix + segs)

    walk([], tree)
    return paths


def discover(root_file):
    """Module tree of the crate rooted at root_file: {module path tuple: file}."""
    modules = {(): root_file}
    todo = [((), root_file, True)]
    while todo:
        mpath, f, owns_dir = todo.pop()
        with open(f, encoding="utf-8") as fh:
            text = strip_cfg_test(strip_comments_and_strings(fh.read()))
        base = os.path.dirname(f) if owns_dir else os.path.splitext(f)[0]
        for m in re.finditer(r"(?:^|[;{}\]\s])(?:pub(?:\s*\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", text):
            name = m.group(1)
            for cand, owns in ((os.path.join(base, name + ".rs"), False),
                               (os.path.join(base, name, "mod.rs"), True)):
                if os.path.isfile(cand):
                    modules[mpath + (name,)] = cand
                    todo.append((mpath + (name,), cand, owns))
                    break
    return modules


def references(mpath, f, modules):
    """Modules (other than mpath itself) that the file of module mpath refers to."""
    with open(f, encoding="utf-8") as fh:
        text = strip_cfg_test(strip_comments_and_strings(fh.read()))
    children = {m[-1] for m in modules if len(m) == len(mpath) + 1 and m[:-1] == mpath}
    paths = []
    for m in re.finditer(r"(?<![\w:$])use\s+([^;]+);", text):
        paths.extend(expand_use_tree(m.group(1)))
    for m in re.finditer(r"(?<![\w:$])(" + IDENT + r")((?:\s*::\s*" + IDENT + r")+)", text):
        segs = [m.group(1)] + re.findall(IDENT, m.group(2))
        paths.append(segs)
    found = set()
    for segs in paths:
        if segs[:1] == ["crate"]:
            base, rest = (), segs[1:]
        elif segs[:1] in (["self"], ["super"]):
            base, rest = mpath, segs
            while rest[:1] in (["self"], ["super"]):
                base = base[:-1] if rest[0] == "super" else base
                rest = rest[1:]
        elif segs[:1] and segs[0] in children:
            base, rest = mpath, segs
        else:
            continue
        target = base
        for s in rest:
            if target + (s,) not in modules:
                break
            target = target + (s,)
        if target != mpath:
            found.add(target)
    return found


def sccs(graph):
    """Tarjan: strongly connected components of {node: set(node)}."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def name(mpath):
    return "::".join(mpath) if mpath else "crate"


POLICIES = ("balancer", "policies")
# prefix_cache is least request with a prefix: it builds on least_request's pick and counts.
FOLDER_ALLOWED = {(("balancer", "policies", "prefix_cache"), ("balancer", "policies", "least_request"))}
# The state the dispatcher holds (docs/architecture.md "Rules").
NOT_THE_DISPATCHER = [("balancer", m) for m in ("queue", "body_flow", "routes", "perform", "metrics")]


def folder_rules(root_file, modules, graph):
    """Breaches of the policy-folder and dispatcher rules (see the module doc), printed."""
    base = os.path.dirname(root_file)
    folders = {m for m in modules if len(m) == 3 and m[:2] == POLICIES
               and os.path.isdir(os.path.join(base, *m))}
    bad = 0
    for m, targets in sorted(graph.items()):
        for t in sorted(targets):
            folder = t[:3]
            if folder in folders and m[:3] != folder and m != POLICIES \
                    and (m[:3], folder) not in FOLDER_ALLOWED:
                print(f"{modules[m]} ({name(m)}) refers to {name(t)}, inside the policy folder "
                      f"{name(folder)}: only that folder and policies/mod.rs may")
                bad += 1
            if t == ("balancer",) and any(m[:len(d)] == d for d in NOT_THE_DISPATCHER):
                print(f"{modules[m]} ({name(m)}) refers to the dispatcher (balancer): it must not")
                bad += 1
    return bad


def check_crate(root_file):
    modules = discover(root_file)
    graph = {m: set(references(m, f, modules)) for m, f in modules.items()}
    loops = [sorted(c) for c in sccs(graph) if len(c) > 1]
    if POLICIES in modules:
        loops += [["rule"]] * folder_rules(root_file, modules, graph)
    for comp in sorted(c for c in loops if c != ["rule"]):
        inside = set(comp)
        print(f"{root_file}: import loop between {len(comp)} modules: "
              + ", ".join(name(m) for m in comp))
        for m in comp:
            uses = sorted(t for t in graph[m] if t in inside)
            print(f"    {modules[m]} ({name(m)}) uses {', '.join(name(t) for t in uses)}")
    return len(loops)


def crate_roots(d):
    src = os.path.join(d, "src") if os.path.isdir(os.path.join(d, "src")) else d
    roots = [os.path.join(src, f) for f in ("lib.rs", "main.rs") if os.path.isfile(os.path.join(src, f))]
    bins = os.path.join(src, "bin")
    if os.path.isdir(bins):
        for f in sorted(os.listdir(bins)):
            p = os.path.join(bins, f)
            if f.endswith(".rs"):
                roots.append(p)
            elif os.path.isfile(os.path.join(p, "main.rs")):
                roots.append(os.path.join(p, "main.rs"))
    return roots


def main(argv):
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    loops = 0
    for d in argv:
        roots = crate_roots(d)
        if not roots:
            print(f"{d}: no lib.rs, main.rs or bin/*.rs", file=sys.stderr)
            return 2
        for r in roots:
            loops += check_crate(r)
    if loops:
        print(f"{loops} import loop(s) or folder-rule breach(es)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
