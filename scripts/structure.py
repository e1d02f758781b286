#!/usr/bin/env python3
"""Counts of the store's structure, to compare before and after a change of it:
`python3 scripts/structure.py [ROOT]` (ROOT: a checkout, default this one).

- impl blocks: `impl Store` / `impl KVStore` blocks (`impl super::Store` too) in
  kvstore-core/src/kvstore, and the files they are in.
- kind branches: lines that branch on the store's kind or its transport
  (`Kind::...`, `is_async()`, `self.collective` / `self.remote` and the same through
  `self.store.`), and their files.
- imports inside kvstore-core/src/kvstore: edges between its modules (a file is a
  module; `mod.rs` is its folder's), from `use` and paths (`super::x`,
  `crate::kvstore::x`); circles: the strongly connected groups of more than one module;
  up-arrows: imports of a module's ancestors (its folder's `mod.rs`, or one above it:
  its parent's siblings' parents), which hold the API built on the module: an import of
  a sibling, or of a sibling of an enclosing folder, points down or across, not up.
- core I/O: kvstore-core files that touch the file system (`std::fs`, `File::`,
  `OpenOptions`, `crate::files`).
- env reads: files of each crate that read the environment (`env::var`).
- biggest files: the five longest .rs files of kvstore-core and kvstore-mpi.
"""

import re
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
core = root / "kvstore-core" / "src"
kv = core / "kvstore"


def files(d: Path):
    return sorted(p for p in d.rglob("*.rs"))


def rel(p: Path) -> str:
    return str(p.relative_to(root))


def module(p: Path) -> tuple:
    """A file's module path under kvstore/: ('run', 'fused'); mod.rs is its folder's."""
    parts = list(p.relative_to(kv).with_suffix("").parts)
    if parts[-1] == "mod":
        parts.pop()
    return tuple(parts)


impls = {}
for f in files(kv):
    n = len(re.findall(r"^impl (?:super::|crate::kvstore::|data::)*(?:Store|KVStore) \{", f.read_text(), re.M))
    if n:
        impls[rel(f)] = n
print(f"impl Store/KVStore blocks: {sum(impls.values())} in {len(impls)} files")

branch = re.compile(r"Kind::(?:Local|Device|DistSync|DistAsync)|is_async\(\)|self\.(?:store\.)?(?:collective|remote)\b")
branches = {}
for f in files(kv):
    n = sum(1 for line in f.read_text().splitlines() if branch.search(line) and not line.strip().startswith("//"))
    if n:
        branches[rel(f)] = n
print(f"kind branches: {sum(branches.values())} lines in {len(branches)} files")

mods = {module(f): f for f in files(kv)}


def resolve(src: tuple, path: list):
    """The module a path (`super::a::b`, `crate::kvstore::a::b`, `self::a`, or `a::b`
    naming a child of `src`) names from module `src`, or None outside kvstore/. A
    module's `super` is its parent whether it is a file or a `mod.rs`."""
    base = list(src)
    if path[:2] == ["crate", "kvstore"]:
        base, rest = [], path[2:]
    elif path[0] == "super":
        rest = list(path)
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
    elif path[0] == "self":
        rest = path[1:]
    elif tuple(base + path[:1]) in mods:
        rest = path
    else:
        return None
    best = tuple(base)
    for i in range(len(rest)):
        cand = tuple(base + rest[: i + 1])
        if cand in mods:
            best = cand
        else:
            break
    return best if best in mods else None


edges = set()
path_re = re.compile(r"(?<![:\w])((?:crate::kvstore|super(?:::super)*|self|[a-z_][a-z0-9_]*)(?:::[a-z_][a-z0-9_]*)+)")
use_re = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.M)
for m, f in mods.items():
    text = f.read_text()
    text = re.sub(r"#\[cfg\(test\)\]\s*mod tests \{.*", "", text, flags=re.S)
    # (A visibility, `pub(in crate::kvstore)`, names no module the file uses.)
    text = re.sub(r"pub\(in [^)]*\)", "pub", text)
    found = set()
    for u in use_re.findall(text):
        u = re.sub(r"\s+", "", u)
        # Expand `a::{b, c::d}` one level (enough for this code).
        head, _, tail = u.partition("::{")
        items = [head + "::" + t for t in tail.rstrip("}").split(",")] if tail else [u]
        for it in items:
            it = it.split("::{")[0]
            found.add(it)
    for p in path_re.findall(text):
        found.add(p)
    for p in found:
        parts = [x for x in p.split("::") if x]
        if parts:
            t = resolve(m, parts)
            if t is not None and t != m and t in mods:
                edges.add((m, t))

# Circles: Tarjan's strongly connected components.
index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
graph = {m: sorted(t for (s, t) in edges if s == m) for m in mods}


def strong(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in graph[v]:
        if w not in index:
            strong(w)
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
        if len(comp) > 1:
            sccs.append(comp)


sys.setrecursionlimit(10000)
for v in graph:
    if v not in index:
        strong(v)


def name(m):
    return "/".join(m) or "mod"


def up(src, dst):
    """Whether `dst` is an ancestor of `src`: a `mod.rs` of a folder that holds it."""
    return mods[dst].name == "mod.rs" and len(dst) < len(src) and src[: len(dst)] == dst


ups = sorted((name(s), name(t)) for (s, t) in edges if up(s, t))
print(f"imports inside kvstore/: {len(edges)} between {len(mods)} modules")
print(f"circles: {len(sccs)}" + "".join(f"\n  {len(c)} modules: {', '.join(sorted(name(x) for x in c))}" for c in sccs))
print(f"up-arrows: {len(ups)}" + "".join(f"\n  {s} -> {t}" for s, t in ups))

io = re.compile(r"std::fs\b|\bFile::|OpenOptions|crate::files|\bfs::")
def code(f: Path) -> str:
    """A file's lines that are not comments (doc examples write files of their own)."""
    return "\n".join(line for line in f.read_text().splitlines() if not line.lstrip().startswith("//"))


io_files = [rel(f) for f in files(core) if io.search(code(f))]
print(f"core files doing I/O: {len(io_files)}: {', '.join(io_files)}")

for crate in ["kvstore-core", "kvstore-commit", "kvstore", "kvstore-mpi", "kvstore-cuda", "kvstore-jni", "kvstore-py"]:
    readers = [rel(f) for f in files(root / crate / "src") if re.search(r"env::var(?:_os)?\(", f.read_text())]
    print(f"env reads in {crate}: {len(readers)} files" + (f": {', '.join(readers)}" if readers else ""))

sizes = sorted(((len(f.read_text().splitlines()), rel(f)) for c in ["kvstore-core", "kvstore-mpi"] for f in files(root / c / "src")), reverse=True)
print("biggest files: " + ", ".join(f"{p} {n}" for n, p in sizes[:5]))
