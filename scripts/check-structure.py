#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The structure rules of docs/ARCHITECTURE.md, checked (run by `make format-check`, so CI):
- no file under lib/ over MAX_FILE lines, no function over MAX_FUNC lines (parsers and tables
  named in ALLOW are the exceptions);
- public headers include each other only in the documented order;
- a module includes only its own private headers and those of util and sys;
- no two library files share a name.
Prints what breaks a rule and exits 1; prints the largest files and functions with -v."""
import os, re, sys

MAX_FILE, MAX_FUNC = 900, 120
ALLOW = set()  # "file:function" kept long on purpose (a parser, a table)
# public headers in dependency order: a header may include only those before it
ORDER = ["common", "image", "store", "pcache", "objcache", "disk", "vmm", "xfer", "vm"]
# library modules in dependency order; util and sys are usable by all
MODULES = ["util", "sys", "image", "store", "pcache", "objcache", "disk", "vmm", "xfer", "vm"]

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
bad = []


def functions(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    start = None
    for i, l in enumerate(lines):
        if l == "{" and i > 0:
            j = i - 1
            while j > 0 and not re.match(r"^[A-Za-z_]", lines[j]):
                j -= 1
            m = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", lines[j])
            start = (m.group(1) if m else "?", i)
        elif l == "}" and start:
            yield start[0], i - start[1] + 1
            start = None


sizes, funcs, names = [], [], {}
for d, _, files in os.walk(os.path.join(root, "lib")):
    for f in files:
        p = os.path.join(d, f)
        rel = os.path.relpath(p, root)
        if f.endswith(".c") or f.endswith(".h"):
            names.setdefault(f, []).append(rel)
        if not f.endswith(".c"):
            continue
        n = open(p, encoding="utf-8").read().count("\n")
        sizes.append((n, rel))
        if n > MAX_FILE:
            bad.append(f"{rel}: {n} lines (at most {MAX_FILE})")
        for fn, ln in functions(p):
            funcs.append((ln, f"{rel}:{fn}"))
            if ln > MAX_FUNC and f"{rel}:{fn}" not in ALLOW:
                bad.append(f"{rel}: {fn}() is {ln} lines (at most {MAX_FUNC})")

for f in sorted(os.listdir(os.path.join(root, "cli"))):
    if f.endswith(".c"):
        rel = f"cli/{f}"
        for fn, ln in functions(os.path.join(root, rel)):
            funcs.append((ln, f"{rel}:{fn}"))
            if ln > MAX_FUNC and f"{rel}:{fn}" not in ALLOW:
                bad.append(f"{rel}: {fn}() is {ln} lines (at most {MAX_FUNC})")

# the daemon, as the CLI: its own header and the public ones only, functions within the limit
for f in sorted(os.listdir(os.path.join(root, "daemon"))):
    if f.endswith(".c") or f.endswith(".h"):
        rel = f"daemon/{f}"
        for dep in re.findall(r'^#include "([^"]+)"', open(os.path.join(root, rel)).read(), re.M):
            if dep != "daemon.h" and not dep.startswith("vmsnap/"):
                bad.append(f"{rel}: includes {dep} (the daemon uses only include/vmsnap/)")
        if f.endswith(".c"):
            for fn, ln in functions(os.path.join(root, rel)):
                funcs.append((ln, f"{rel}:{fn}"))
                if ln > MAX_FUNC and f"{rel}:{fn}" not in ALLOW:
                    bad.append(f"{rel}: {fn}() is {ln} lines (at most {MAX_FUNC})")

for f, where in names.items():
    if len(where) > 1:
        bad.append(f"file name {f} used more than once: {', '.join(where)}")

inc = re.compile(r'^#include "([^"]+)"', re.M)
for h in os.listdir(os.path.join(root, "include/vmsnap")):
    me = h[:-2]
    if me not in ORDER:
        bad.append(f"include/vmsnap/{h}: not in the documented header order")
        continue
    for dep in inc.findall(open(os.path.join(root, "include/vmsnap", h)).read()):
        other = os.path.basename(dep)[:-2]
        if other not in ORDER or ORDER.index(other) >= ORDER.index(me):
            bad.append(f"include/vmsnap/{h} includes {dep}: against the order {' <- '.join(ORDER)}")

for d, _, files in os.walk(os.path.join(root, "lib")):
    rel_dir = os.path.relpath(d, os.path.join(root, "lib"))
    mod = rel_dir.split(os.sep)[0]
    for f in files:
        if not (f.endswith(".c") or f.endswith(".h")):
            continue
        for dep in inc.findall(open(os.path.join(d, f), encoding="utf-8").read()):
            if dep.startswith("vmsnap/"):
                continue
            if "/" not in dep:  # same folder
                continue
            dmod = dep.split("/")[0]
            if dmod != mod and dmod not in ("util", "sys"):
                bad.append(f"lib/{rel_dir}/{f} includes {dep}: another module's private header")

if "-v" in sys.argv:
    for n, rel in sorted(sizes, reverse=True)[:10]:
        print(f"{n:6d} {rel}")
    for n, fn in sorted(funcs, reverse=True)[:15]:
        print(f"{n:6d} {fn}()")
for b in bad:
    print("check-structure:", b)
sys.exit(1 if bad else 0)
