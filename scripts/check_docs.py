#!/usr/bin/env python3
"""Checks that README.md and the guides under docs/ cannot drift from what runs.

- Every code block in Rust, Python, Java or Clojure (and every project file: toml,
  xml) is run by `make test`: it is marked as a file of a project or as a program for
  scripts/readme_projects.py (which scripts/test-user-projects.sh builds and runs,
  comparing what it prints with the document's `prints` block; a folder marked
  `mpi-run` is run by scripts/test-doc-mpi.sh instead), or it is listed in
  NOT_RUN below with the reason it cannot run there. Every program has a `prints`
  block, and so has every project folder that runs, unless NO_PRINTS names it.
- scripts/test-user-projects.sh hands every document to readme_projects.py, and
  tests/src/lib.rs doc-tests every document with Rust blocks (rustdoc compiles them
  all, and runs those not marked `ignore`).
- Every shell block with an `mpirun` or `kvstore-run` line (kvstore-run passes mpirun's
  options on and adds neither) says, in it or in the lines just before it, what to add
  as root (`--allow-run-as-root`) and with more ranks than cores (`--oversubscribe`):
  the two ways a pasted line fails first.
- The README's count of deliberate differences from MXNet is the number of items
  docs/mxnet-differences.md lists.
- docs/python.md shows how to install the wheel with its extra `mpi` and how to choose
  the system's Open MPI instead, where the error of a `dist_*` kind without MPI sends
  Python users.
- Claims that were once true and are not: `dist_async` unsupported, the JVM finalising
  MPI at exit.

Prints each problem; exits 1 if any.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(\S*)")
MARK = re.compile(r"^<!-- (file|run|mpi-run|prints|program): (\S+) -->$")
# The languages whose blocks are programs or project files a user pastes.
CODE = {"rust", "python", "java", "clojure", "toml", "xml"}

# Blocks that `make test` cannot run as a user's program, each with its reason, by
# document and the block's first line. Keep this list short: a block that can run,
# runs.
NOT_RUN = {}

# Project folders that run but print what depends on the machine.
NO_PRINTS = {
    "gpu": "prints where the key lives on a GPU machine, and why there is no GPU elsewhere",
}

NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
           "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
           "eighteen", "nineteen", "twenty"]

# (document, text, why) for what a document must say: where an error sends its reader.
REQUIRED = [
    ("docs/python.md", 'manylinux_2_17_x86_64.whl[mpi]"',
     "the error of a dist kind without MPI sends Python users here for the extra `mpi`"),
    ("docs/python.md", "KVSTORE_MPI=system", "the same error's other route: the system's Open MPI"),
]

# (document, pattern, why it is wrong) for claims that must not come back.
STALE = [
    ("docs/dist-sync.md", r"`dist_async` is not supported", "dist_async is supported (docs/dist-async.md)"),
    ("docs/dist-async.md", r"the JVM call it at exit",
     "a JVM rank that exits without finalize-mpi aborts the job (docs/dist-sync.md#from-the-jvm)"),
]


def documents():
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path):
    """(line number, language, mark kind, mark name, body lines, lines before) of every
    fenced block of `path`."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1).split(",")[0]
        mark = MARK.match(lines[i - 1].strip()) if i > 0 else None
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        yield (start + 1, lang, mark.group(1) if mark else None, mark.group(2) if mark else None, body,
               lines[max(0, start - 8):start])


def check_blocks(problems):
    for doc in documents():
        name = doc.relative_to(ROOT).as_posix()
        runs, prints, programs = set(), set(), []
        for line, lang, kind, mark, body, before in blocks(doc):
            where = f"{name}:{line}"
            first = next((b.strip() for b in body if b.strip()), "")
            if kind in ("run", "mpi-run", "prints"):
                (prints if kind == "prints" else runs).add(mark)
            if kind == "program":
                programs.append((where, mark))
            if lang in CODE and kind not in ("file", "program"):
                if (name, first) not in NOT_RUN:
                    problems.append(f"{where}: a {lang} block that make test does not run: mark it "
                                    f"<!-- file: ... --> or <!-- program: ... --> (scripts/readme_projects.py), "
                                    f"or list it in NOT_RUN in scripts/check_docs.py with the reason")
            if lang in ("sh", "bash", "") and any(re.search(r"(^|\s|/)(mpirun|kvstore-run)\s", b) for b in body):
                near = "\n".join(before + body)
                for flag in ("--allow-run-as-root", "--oversubscribe"):
                    if flag not in near:
                        problems.append(f"{where}: an mpirun or kvstore-run line with no word of {flag} in it "
                                        f"or just before it")
        for where, mark in programs:
            if mark not in prints:
                problems.append(f"{where}: the program {mark} has no <!-- prints: {mark} --> block")
        for folder in sorted(runs - prints - set(NO_PRINTS)):
            problems.append(f"{name}: the folder {folder} runs but no prints block checks what it prints")


def check_user_projects_reads_every_document(problems):
    script = (ROOT / "scripts/test-user-projects.sh").read_text(encoding="utf-8")
    if "README.md docs/*.md" not in script:
        problems.append("scripts/test-user-projects.sh: readme_projects.py must be given README.md docs/*.md")


def check_rust_doc_tests_include_every_guide(problems):
    lib = (ROOT / "tests/src/lib.rs").read_text(encoding="utf-8")
    for doc in documents():
        name = doc.relative_to(ROOT).as_posix()
        if any(lang == "rust" for _, lang, *_ in blocks(doc)) and f'include_str!("../../{name}")' not in lib:
            problems.append(f"{name}: has Rust blocks, but tests/src/lib.rs does not doc-test it")


def check_differences_count(problems):
    items = re.findall(r"^\d+\. \*\*", (ROOT / "docs/mxnet-differences.md").read_text(encoding="utf-8"), re.M)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    said = re.findall(r"(\w+)\s+deliberate\s+fixes", readme)
    if not said:
        problems.append("README.md: no count of the deliberate fixes")
    for word in said:
        if word.lower() not in NUMBERS or NUMBERS.index(word.lower()) != len(items):
            problems.append(f"README.md: \"{word} deliberate fixes\", but docs/mxnet-differences.md lists {len(items)}")


def check_required(problems):
    for doc, text, why in REQUIRED:
        if text not in (ROOT / doc).read_text(encoding="utf-8"):
            problems.append(f"{doc}: does not say {text!r}: {why}")


def check_stale(problems):
    for doc, pattern, why in STALE:
        text = re.sub(r"\s+", " ", (ROOT / doc).read_text(encoding="utf-8"))
        if re.search(pattern, text):
            problems.append(f"{doc}: says /{pattern}/, which is not so: {why}")


def main():
    problems = []
    check_blocks(problems)
    check_user_projects_reads_every_document(problems)
    check_rust_doc_tests_include_every_guide(problems)
    check_differences_count(problems)
    check_required(problems)
    check_stale(problems)
    for p in problems:
        print(p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
